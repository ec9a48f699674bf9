"""The one parse of JSON text that came from outside: a server's answer, a file on disk, a
user's tasks. ``json.loads`` recurses once per nesting level, so ``[[[[…`` 100,000 deep raises
RecursionError, which no ``except ValueError`` catches: here it is ``NestedTooDeeply``, a
``JSONDecodeError`` like any other text that is not JSON, so every caller's "not JSON" branch
handles it.
"""

from __future__ import annotations

import json
from typing import Any


class NestedTooDeeply(json.JSONDecodeError):
    """JSON whose nesting is deeper than the parser can recurse."""

    def __init__(self) -> None:
        super().__init__("JSON nested too deeply to parse", "", 0)

    def __str__(self) -> str:
        return self.msg


def loads(text: str | bytes | bytearray, **options: Any) -> Any:
    """``json.loads(text, **options)``; nesting too deep to parse is ``NestedTooDeeply``."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise NestedTooDeeply from None
