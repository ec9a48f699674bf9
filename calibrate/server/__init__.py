"""The managed inference engine (SPEC §6): its lifecycle (``lifecycle``: start, wait until ready,
stop), its supervisor, its record, its launch script.

Empty on purpose: the supervisor (``supervise``) runs in a process of its own beside every
managed engine and needs only ``exit_status`` and ``log_filter``; a package that loaded the
lifecycle here would load the config, the engines and urllib3 into it (130 ms of imports, once
per server start).
"""
