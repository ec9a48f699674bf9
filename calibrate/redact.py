"""What may be stored or printed: URLs without their userinfo, server text without our secrets.

One helper per leak (SPEC §11): ``redact_url`` for every URL shown or written (manifests,
``status --show-config``, error texts), ``Scrubber`` for every text a server sent back (error
messages and bodies, stream error chunks) before it reaches a record, summary or terminal.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "[REDACTED]"
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s@]*@")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=-]+")


def redact_url(url: str) -> str:
    """``http://user:pass@host/v1`` → ``http://***@host/v1``; other URLs unchanged."""
    return _URL_USERINFO.sub(r"\1***@", url)


@dataclass(frozen=True)
class Credentials:
    """The userinfo of a URL, split off: the URL to send to and the Basic auth it carried."""

    url: str
    username: str | None = None
    password: str | None = None

    @property
    def basic_auth(self) -> str | None:
        """The ``Authorization`` value for the userinfo, or None without one."""
        if self.username is None:
            return None
        pair = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def split_userinfo(url: str) -> Credentials:
    """Take ``user:pass@`` out of a URL (percent-decoded): urllib3 would not send it."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return Credentials(url)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return Credentials(bare, unquote(user), unquote(password) if colon else None)


@dataclass(frozen=True)
class Scrubber:
    """Removes our secrets (and any ``Bearer`` token or URL userinfo) from a server's text."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, *secrets: str | None) -> Scrubber:
        found = {s for s in secrets if s}
        return cls(tuple(sorted(found, key=len, reverse=True)))  # longest first: no partial hits

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        text = _BEARER.sub(rf"\1\2{REDACTED}", text)
        return _URL_USERINFO.sub(r"\1***@", text)
