"""``python -m calibrate``. A Ctrl-C while Python loads calibrate ends the run (exit 130).

It is noted, not raised, until the first modules are loaded: raised inside an import, a C
extension that imports a module of its own can clear it (CPython's ``_elementtree`` does, loading
``pyexpat``), and calibrate then went on as if no Ctrl-C had come — a server start that waited
for its engine instead of stopping.
"""

import signal
import sys

_arrived: list[int] = []
_before = signal.getsignal(signal.SIGINT)
if _before is signal.default_int_handler:  # left alone where Ctrl-C is ignored (SIG_IGN)
    signal.signal(signal.SIGINT, lambda signum, frame: _arrived.append(signum))
try:
    from calibrate.cli import main
finally:
    if _before is signal.default_int_handler:
        signal.signal(signal.SIGINT, _before)
if _arrived:
    print("interrupted", file=sys.stderr)
    raise SystemExit(130)

raise SystemExit(main())
