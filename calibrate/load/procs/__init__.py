"""The load engine in N processes (``--workers N``, SPEC §12), for every stage: one pool of
calibrate's worker processes (``pool.py``) over one pipe (``channel.py``), each running the job
its parent sends first (``child.py``), with one self-check rule (``selfcheck.py``), one client
recipe (``recipe.py``) and one count (``worker_count.py``). The ladder's and sweep's job: a
sender whose loops run in the workers, split and merged (``sender.py``, ``shares.py``; which
sender a stage gets, ``stage_sender.py``); batch's: ``stages.batch.sending.workers``."""
