"""Stage C, the ladder: batch sizes (or input lengths) one tier at a time."""
