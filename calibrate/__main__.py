"""``python -m calibrate`` and the ``calibrate`` command. A Ctrl-C while Python loads calibrate
ends the run (exit 130).

It is noted, not raised, until the first modules are loaded: raised inside an import, a C
extension that imports a module of its own can clear it (CPython's ``_elementtree`` does, loading
``pyexpat``), and calibrate then went on as if no Ctrl-C had come — a server start that waited
for its engine instead of stopping.
"""

import _signal  # type: ignore[import-not-found]  # built in, at once (``signal`` loads enum)
import sys


def run() -> int:
    """Load the command line with Ctrl-C held, then run it (``cli.main``)."""
    arrived: list[int] = []
    before = _signal.getsignal(_signal.SIGINT)
    held = before is _signal.default_int_handler  # left alone where Ctrl-C is ignored (SIG_IGN)
    if held:
        _signal.signal(_signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        from calibrate.cli import main
        from calibrate.errors import ExitCode
    finally:
        if held:
            _signal.signal(_signal.SIGINT, before)
    if arrived:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
