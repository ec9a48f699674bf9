"""What a measuring stage prepares before it sends: the workload plan, synthetic prompts, probes, the server's cap."""
