"""calibrate tune: engine-flag candidates, each started, calibrated and ranked."""
