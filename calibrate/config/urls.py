"""The server's URL as configured: normalised to its ``/v1`` root, or refused (exit 2).

``split_endpoint`` reads one entry of ``[target] base_urls`` (``URL#c=N``); a URL shown in a
message never shows credentials before its host.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from calibrate.errors import ConfigError

MAX_ENDPOINT_CONCURRENCY = 4096


def normalise_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both become ``…/v1``.

    Whatever it came from (file, environment, ``--base-url``), a URL without a host, with a
    port outside 1–65535, or with a query string or fragment is a config error (exit 2).
    """
    url = url.strip().rstrip("/")
    where = "(--base-url, CALIBRATE_BASE_URL or [target].base_url)"
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"base_url {_shown_url(url)!r} is not an http(s) URL",
            "Give one like http://127.0.0.1:8000/v1 (--base-url or [target].base_url).",
        )
    bad_host = ConfigError(
        f"base_url {_shown_url(url)!r} has no valid host (an IPv6 address goes in brackets, "
        f"as in http://[::1]:8000/v1) {where}"
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
        raise ConfigError(f"base_url {_shown_url(url)!r}: the port must be in 1–65535 {where}")
    if not hostname:
        raise ConfigError(f"base_url {_shown_url(url)!r} has no host {where}")
    try:
        parse_url(url)  # what the client will send to: "[::1]x:80" passes urlsplit, not this
    except LocationParseError:
        raise bad_host from None
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ConfigError(
            f"base_url {_shown_url(url)!r} has a query string or fragment {where}",
            "Give the server's root or its /v1, e.g. http://127.0.0.1:8000/v1.",
        )
    if not url.endswith("/v1"):
        url += "/v1"
    return url


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
