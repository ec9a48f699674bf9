"""The server's URL as configured: normalised to its ``/v1`` root, or refused (exit 2).

``split_endpoint`` reads one entry of ``[target] base_urls`` (``URL#c=N``); a URL shown in a
message never shows credentials before its host.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import urlsplit

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from calibrate.errors import ConfigError

MAX_ENDPOINT_CONCURRENCY = 4096


def normalise_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both become ``…/v1``.

    Whatever it came from (file, environment, ``--base-url``), a URL without a host, with a
    port outside 1–65535, or with a query string or fragment is a config error (exit 2); so is
    one holding a space, a line break or another control character. Otherwise it is written
    in the one form every transport sends (``normal_url``).
    """
    where = "(--base-url, CALIBRATE_BASE_URL or [target].base_url)"
    url = normal_url(url, "base_url", where)
    if "?" in url or "#" in url:
        raise ConfigError(
            f"base_url {_shown_url(url)!r} has a query string or fragment {where}",
            "Give the server's root or its /v1, e.g. http://127.0.0.1:8000/v1.",
        )
    url = url.rstrip("/")
    _check_not_an_endpoint(url, where)
    if not url.endswith("/v1"):
        url += "/v1"
    return url


#: the API's own paths under /v1: a base URL ending in one was copied from a request
_ENDPOINT_PATHS = ("/chat/completions", "/completions", "/models", "/embeddings", "/responses")


def _check_not_an_endpoint(url: str, where: str) -> None:
    """``…/v1/chat/completions`` is a request's URL, not the server's root: calibrate would
    send to ``…/chat/completions/v1/chat/completions`` and read a 404 as a failed stage."""
    path = urlsplit(url).path.lower()
    tail = next((t for t in _ENDPOINT_PATHS if path.endswith(t)), None)
    if tail is None:
        return
    root = url[: len(url) - len(tail)]
    root = root if root.lower().endswith("/v1") else f"{root}/v1"
    raise ConfigError(
        f"base_url {_shown_url(url)!r} ends with {tail}, a request's path: give the server's "
        f"root, {_shown_url(root)} {where}",
        f"calibrate adds {tail} and the other paths itself; nothing was sent.",
    )


def normal_url(url: str, what: str, where: str = "") -> str:
    """``url`` (surrounding blanks stripped) as every transport sends it: the scheme in lower
    case (``HTTP://`` is ``http://``), a non-ASCII host in IDNA form, the path percent-encoded
    as UTF-8 (``/中文/v1`` → ``/%E4%B8%AD%E6%96%87/v1``) with its ``.`` and ``..`` segments
    resolved. Anything that cannot be a URL is a ConfigError (exit 2) naming ``what``."""
    url = url.strip()
    _check_characters(url, what, where)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ConfigError(
            f"{what} {_shown_url(url)!r} is not an http(s) URL {where}".rstrip(),
            "Give one like http://127.0.0.1:8000/v1.",
        )
    url = f"{scheme.lower()}://{rest}"
    bad_host = ConfigError(
        f"{what} {_shown_url(url)!r} has no valid host (an IPv6 address goes in brackets, "
        f"as in http://[::1]:8000/v1) {where}".rstrip()
    )
    try:
        parts = urlsplit(url)  # "http://[::1/v1": ValueError (Invalid IPv6 URL)
        hostname = parts.hostname  # "[zz]": ValueError (not an IP address)
    except ValueError:
        raise bad_host from None
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"{what} {_shown_url(url)!r}: the port must be in 1–65535 {where}")
    if not hostname:
        raise ConfigError(f"{what} {_shown_url(url)!r} has no host {where}".rstrip())
    try:
        parsed = parse_url(url)  # what urllib3 sends to: "[::1]x:80" passes urlsplit, not this
        path = parse_url(f"http://h{parts.path}").path or ""
    except (LocationParseError, UnicodeError, ValueError):
        raise bad_host from None
    netloc = parts.netloc
    if not netloc.isascii():  # a host in IDNA form, userinfo percent-encoded
        auth = f"{parsed.auth}@" if parsed.auth else ""
        netloc = f"{auth}{parsed.host}" + (f":{parsed.port}" if parsed.port else "")
    tail = url[len(f"{parts.scheme}://{parts.netloc}{parts.path}") :]  # "?…" or "#…", if any
    return f"{parts.scheme}://{netloc}{path}{tail}"


_NAMED = {
    " ": "a space",
    "\t": "a tab",
    "\r": "a carriage return",
    "\n": "a line break",
    "\u3000": "a full-width space",
    "\u00a0": "a no-break space",
}


def _check_characters(url: str, what: str, where: str) -> None:
    """A URL holds no blank, control or invisible character (a stray line break from a
    copied ``.env`` would be sent as a different path by each transport): exit 2."""
    for position, char in enumerate(url, 1):
        category = unicodedata.category(char)
        if category[0] in "CZ":  # Cc Cf Cs Co Cn, Zs Zl Zp
            named = _NAMED.get(char) or (
                f"a byte that is not UTF-8 (0x{ord(char) - 0xDC00:02x})"
                if 0xDC80 <= ord(char) <= 0xDCFF
                else f"the invisible character U+{ord(char):04X}"
            )
            raise ConfigError(
                f"{what} {_shown_url(url)!r} has {named} at character {position} {where}".rstrip(),
                "A URL holds no blanks or control characters: give it without them "
                "(a space in a path is written %20).",
            )


def split_endpoint(text: str) -> tuple[str, int | None]:
    """``"http://h:8000/v1#c=8"`` → (normalised URL, 8); without ``#c=N`` the concurrency is None."""
    url, sep, suffix = text.strip().partition("#")
    concurrency: int | None = None
    if sep:
        value = suffix.removeprefix("c=")
        if not suffix.startswith("c=") or not value.isdigit():
            raise ConfigError(
                f"endpoint {_shown_url(text)!r}: after '#' only c=N (its concurrency) is allowed",
                "Write it like http://10.0.0.2:8000/v1#c=8.",
            )
        concurrency = int(value)
        if not 1 <= concurrency <= MAX_ENDPOINT_CONCURRENCY:
            raise ConfigError(
                f"endpoint {_shown_url(text)!r}: c must be in "
                f"[1, {MAX_ENDPOINT_CONCURRENCY}], got {concurrency}"
            )
    return normalise_base_url(url), concurrency


def _shown_url(url: str) -> str:
    """The URL for a message: credentials before the host never printed."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}{sep}{netloc}{slash}{tail}"
