"""What calibrate knows per engine kind: its launch arguments and the refusal table for [server] args."""
