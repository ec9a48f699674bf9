"""Stage F: the production run (SPEC §5.9). The stage is ``stage.run``; this package stays empty
so that a worker process of ``batch --workers N`` imports only what it sends
(``sending.worker``)."""
