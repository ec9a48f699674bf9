"""The one parse of JSON text that came from outside: a server's answer, a file on disk, a
user's tasks. ``json.loads`` recurses once per nesting level, so ``[[[[…`` 100,000 deep raises
RecursionError, which no ``except ValueError`` catches: here it is ``NestedTooDeeply``, a
``JSONDecodeError`` like any other text that is not JSON, so every caller's "not JSON" branch
handles it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
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


def encoder(separators: tuple[str, str] = (", ", ": ")) -> Callable[[Any], str]:
    """``json.JSONEncoder(ensure_ascii=False, separators=separators).encode``, its C encoder
    made once: ``JSONEncoder.encode`` makes one per call (~1.5 µs of a small request body's
    3.5). The same text; a structure that holds itself is a RecursionError, not a ValueError
    (nothing calibrate writes is one: its values come from JSON or are built of fields)."""
    item, key = separators
    if c_make_encoder is None:  # a Python without the json module's C part
        return json.JSONEncoder(ensure_ascii=False, separators=separators).encode
    default = json.JSONEncoder().default  # TypeError: not JSON serializable
    made = c_make_encoder(None, default, encode_basestring, None, key, item, False, False, True)

    def encode(obj: Any) -> str:
        return "".join(made(obj, 0))

    return encode
