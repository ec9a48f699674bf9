"""Stage D, the sweep: concurrency levels, rates, --auto and --find-max over the ladder's batch size."""
