"""A simulated server on a virtual clock (``SimServer``, ``VirtualClock``): the engine's
transport for tests that check ratios and timings in milliseconds, never on a busy clock."""
