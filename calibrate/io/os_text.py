"""Text from the command line and the environment read as UTF-8, whatever the locale.

Python decodes argv and the environment with the locale's encoding and keeps each byte it
cannot decode as a lone surrogate (``\\udcXX``): under ``LC_ALL=C`` a UTF-8 ``--prompt 中文``
arrives as six of them, and a GBK shell script's ``--prompt`` on a UTF-8 system as a mix. Such a
string cannot be encoded, sent or recorded. ``as_utf8`` gives back the bytes as UTF-8 where they
are UTF-8, and refuses them (exit 2, naming where they came from) where they are not.
"""

from __future__ import annotations

import os
import re

from calibrate.errors import ConfigError

_UNDECODED = re.compile("[\udc80-\udcff]")


def undecoded(text: str) -> bool:
    """``text`` holds bytes the locale could not decode (lone surrogates)."""
    return _UNDECODED.search(text) is not None


def as_utf8(text: str, what: str) -> str:
    """``text`` re-read as UTF-8 where the locale could not decode it; exit 2 naming ``what``
    (``--prompt``, ``$CALIBRATE_MODEL``) when its bytes are not UTF-8 either."""
    if not undecoded(text):
        return text
    raw = os.fsencode(text)  # the bytes as they came (surrogateescape)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start]
        hint = (
            "calibrate reads arguments and its environment as UTF-8: save the script that "
            "passes it as UTF-8 (e.g. iconv -f GBK -t UTF-8 run.sh > run-utf8.sh)"
        )
        try:
            hint += f"; read as GBK these bytes say {raw.decode('gb18030')!r}."
        except UnicodeDecodeError:
            hint += "."
        raise ConfigError(
            f"{what} is not UTF-8 text: byte {exc.start + 1} of it (0x{bad:02x}) cannot be "
            "read; nothing was done",
            hint,
        ) from None
