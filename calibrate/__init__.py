"""calibrate: staged calibration of a local LLM behind an OpenAI-compatible server."""

__version__ = "0.1.0"
