"""How batch sends its items: the work queue (``queue``), the engine's work-queue policy over it
(``pacing``), the line each item leaves (``output_line``), one lane a server with its outage
breaker (``lanes``, ``outage``), the run's stop (``control``), the run itself (``items``), what
sends for it (``senders``: in one process) and ``procs`` (``--workers N``). A worker process
imports this folder, not the stage."""
