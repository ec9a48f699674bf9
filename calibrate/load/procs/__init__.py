"""The load engine in N processes (``--workers N``, SPEC §12): a sender whose loops run in
worker processes that split the concurrency or the rate (``sender.py``; which sender a stage gets,
``stage_sender.py``; how many processes, ``worker_count.py``), the workers (``child.py``,
``pool.py``), the split and the merge (``shares.py``), and the pipe between them
(``channel.py``), which ``batch --workers`` speaks too."""
