"""The load engine (SPEC §12): one loop (``engine.drive``) under pacing policies (``pacing``)
over a transport on a clock (``transport``; ``sim``: a simulated server on a virtual clock),
what stages call (``sender``), the pure rules it reads back (windows, arrivals, answers,
retries, keep-alive stalls) and ``--workers`` (``procs``)."""
