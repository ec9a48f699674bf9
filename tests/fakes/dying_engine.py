"""A managed engine killed by a signal mid-run: the mock, which sends itself SIGKILL when its
``--die-at``-th completion request arrives (readiness sends the first).

    python -m tests.fakes.dying_engine --die-at N [calibrate mock flags…]
"""

from __future__ import annotations

import itertools
import os
import signal
import sys

from calibrate.cli import main
from calibrate.mock import http


def _dying(die_at: int) -> None:
    post = http.MockHandler.do_POST
    arrived = itertools.count(1)

    def do_post(self: http.MockHandler) -> None:
        if next(arrived) >= die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        post(self)

    http.MockHandler.do_POST = do_post  # type: ignore[method-assign]


if __name__ == "__main__":
    args = sys.argv[1:]
    at = args.index("--die-at")
    _dying(int(args[at + 1]))
    sys.exit(main(["mock", *args[:at], *args[at + 2 :]]))
