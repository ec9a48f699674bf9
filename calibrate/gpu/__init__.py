"""The GPU side: NVML, VRAM sampling, engine /metrics, Prometheus text, the self-load check, energy."""
