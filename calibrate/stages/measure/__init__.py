"""What ladder, sweep and tune share: tiers, latency, SLOs, stop rules, incidents, determinism, confidence."""
