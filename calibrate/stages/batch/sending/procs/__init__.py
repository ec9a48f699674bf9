"""``batch --workers N``: the items sent by N worker processes, journaled by this one (SPEC §12).

One Python process gets about one core of Python work; against a fast server that core, not
the server, sets the pace. With ``--workers N`` the parent stays the only reader of --input
(the feeder), the only writer of --out (the journal) and the only one that counts items; each
worker process (calibrate's one kind, ``load.procs.proc``, running ``child.py``'s job) runs
the same request code at its share of the concurrency and sends each finished line back over
a pipe (``child.py``). An item counts as done only once the parent has written its line, so a
kill -9 of anything loses at most what was in flight: a dead worker's unanswered items go back
to the queue and a replacement starts (``parent.py``); a dead parent closes the pipes, and the
workers end at once on the end of their input. The API key goes over the pipe, never in argv,
the environment or a file.
"""
