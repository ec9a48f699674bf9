"""The load engine (SPEC §12): waves, the open loop and its arrivals, windows, stall detection, retries."""
