"""Files: the run store, records, tiers.csv, JUnit, output-path checks, task files, baselines, resume."""
