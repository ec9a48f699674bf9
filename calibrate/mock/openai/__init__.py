"""The OpenAI API's JSON as the mock speaks it, apart from HTTP: what a request must be
(``request``), the bodies of an answer (``bodies``) and the chunks of a streamed one (``stream``) —
shared by the mock's HTTP server and the simulated server of ``calibrate.load.sim``."""
