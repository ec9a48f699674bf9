"""The staged calibration's commands: run (single → … → pin in one), single, repro, ladder, sweep,
tune, pin, verify, rollback, status."""
