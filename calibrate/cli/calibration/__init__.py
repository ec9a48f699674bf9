"""The staged calibration's commands: single, repro, ladder, sweep, tune, pin, verify, rollback, status."""
