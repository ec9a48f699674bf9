"""What calibrate remembers between commands: the ledger, summaries, the setting, identity, the pipeline and its gates, a batch's drift."""
