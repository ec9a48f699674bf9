"""What may be stored or printed: URLs without their userinfo, text without our secrets.

One helper per leak (SPEC §11): ``redact_url`` for every URL shown or written (manifests,
``status --show-config``, error texts), ``Scrubber`` for every text a server sent back (error
messages and bodies, stream error chunks) before it reaches a record, summary or terminal.

``remember`` / ``scrub`` close the rest at the writers: the secrets of the command that runs
(its API key, metrics key, base-URL passwords and their Basic values) are remembered once the
config is read, and every file calibrate writes (``store.utf8``) and every line it prints (the
CLI's streams) goes through ``scrub``: a key a server echoed inside a *successful* answer (its
``model``, its text, ``system_fingerprint``) is stored as ``[REDACTED]``, in any letter case,
split by blanks or escaped line breaks, base64-encoded (at any alignment) or percent-encoded.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

REDACTED = "[REDACTED]"
# Everything up to the last "@" before the path is userinfo: a raw "@" in a password
# (http://u:p@ss@host) hides it whole, not up to its first "@".
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=-]+")
MIN_REMEMBERED_CHARS = 6  # a shorter "secret" would blank out ordinary words everywhere
_SPLIT = r"(?:\s|\\[nrt])*"  # blanks, or a line break as JSON escapes it, inside a split key


# What a terminal acts on instead of showing: C0 controls but newline and tab (ESC starts the
# sequences that clear the screen, move the cursor, set the title), DEL, C1 controls, and the
# bidi overrides that reorder what is shown; and what no UTF-8 stream or XML 1.0 file can
# hold: lone surrogates, U+FFFE and U+FFFF.
_UNSHOWN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)


def printable(text: str) -> str:
    """``text`` as a terminal shows it without acting on it: each control character and bidi
    override as a visible escape (``\\x1b``, ``\\r``, ``\\u202e``); newlines and tabs kept.
    Every human line calibrate prints goes through it, since servers, files and flags write
    into them (a server's ``\\x1b[1A\\x1b[2K`` would otherwise erase the line above), and so
    does every text of a --junit file (XML 1.0 cannot hold a control character)."""
    return _UNSHOWN.sub(lambda found: repr(found.group())[1:-1], text)


def one_line(text: str) -> str:
    """A server's message as one line: every run of blanks and line breaks one space (a
    message ``"boom\\nsingle passed"`` would otherwise print a line calibrate never wrote)."""
    return " ".join(text.split())


def redact_url(url: str) -> str:
    """``http://user:pass@host/v1`` → ``http://***@host/v1``; other URLs unchanged."""
    return _URL_USERINFO.sub(r"\1***@", url)


def origin(url: str) -> tuple[str, str, int | None]:
    """scheme, host, port: where a key may be sent."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # "[::1" or not a number: config reports it; here it must not match
        return "", "", -1
    port = port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


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
        return redact_url(_BEARER.sub(rf"\1\2{REDACTED}", text))


def _base64_cores(data: bytes) -> set[str]:
    """What base64 of any text containing ``data`` shows of it, at each of the 3 alignments."""
    cores: set[str] = set()
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + data).decode("ascii")
        core = encoded[-(-8 * pad // 6) : (8 * (pad + len(data))) // 6]
        if len(core) >= 6:
            cores.update({core, core.replace("+", "-").replace("/", "_")})
    return cores


def _forms(secret: str) -> list[str]:
    """Regex alternatives for one secret: split/any case, base64, percent-encoded."""
    split = _SPLIT.join(re.escape(char) for char in secret)
    forms = [f"(?i:{split})"]
    forms += [f"(?-i:{re.escape(core)})" for core in _base64_cores(secret.encode("utf-8"))]
    encoded = quote(secret, safe="")
    if encoded != secret:
        forms.append(f"(?i:{re.escape(encoded)})")
    return forms


@dataclass(frozen=True)
class _Remembered:
    secrets: frozenset[str] = frozenset()
    pattern: re.Pattern[str] | None = None
    literal: tuple[str, ...] = ()  # base64 cores: found as they are
    folded: tuple[str, ...] = ()  # the secrets (and percent forms) lower-cased, blanks removed

    def may_hold(self, text: str) -> bool:
        """A quick look (substring searches) before the full pattern runs."""
        if any(core in text for core in self.literal):
            return True
        lower = text.lower()
        if any(form in lower for form in self.folded):
            return True
        compact = _compact(lower)
        return any(form in compact for form in self.folded)


# What the pattern's \s matches (every Unicode blank lies below U+3001).
_BLANKS = dict.fromkeys(c for c in range(0x3001) if chr(c).isspace())


def _compact(text: str) -> str:
    """``text`` without blanks and JSON-escaped line breaks (plain ``str`` methods: fast)."""
    for escape in ("\\n", "\\r", "\\t"):
        if escape in text:
            text = text.replace(escape, "")
    return text.translate(_BLANKS)


_REMEMBERED = _Remembered()


def remember(*secrets: str | None) -> None:
    """Add the secrets of the command now running (key, password…) to what ``scrub`` hides."""
    global _REMEMBERED
    found = _REMEMBERED.secrets | {
        s for s in secrets if s and len(s.strip()) >= MIN_REMEMBERED_CHARS
    }
    if found == _REMEMBERED.secrets:
        return
    ordered = sorted(found, key=len, reverse=True)
    forms = [form for s in ordered for form in _forms(s)]
    literal = tuple(core for s in ordered for core in _base64_cores(s.encode("utf-8")))
    folded = {_compact(s.lower()) for s in ordered}
    folded |= {quote(s, safe="").lower() for s in ordered}
    _REMEMBERED = _Remembered(frozenset(found), re.compile("|".join(forms)), literal, tuple(folded))


def remember_url(url: str | None) -> None:
    """A URL's password (and its Basic value) are secrets; the URL itself is shown redacted."""
    if not url:
        return
    try:
        found = split_userinfo(url)
    except ValueError:  # "http://[::1/v1": the config check says so; nothing to remember here
        return
    basic = found.basic_auth
    remember(found.password, basic.removeprefix("Basic ") if basic else None)


def remembered() -> tuple[str, ...]:
    """The secrets remembered so far (for a process that must hide them itself)."""
    return tuple(sorted(_REMEMBERED.secrets, key=len, reverse=True))


def forget_all() -> None:
    """A new command starts (main() may run many in one process): nothing remembered."""
    global _REMEMBERED
    _REMEMBERED = _Remembered()


def scrub(text: str) -> str:
    """``text`` without any remembered secret or URL userinfo.

    (No general ``Bearer …`` rule here: this runs over model answers too, and "bearer of"
    is text; the client's ``Scrubber`` applies it to error messages.)
    """
    pattern = _REMEMBERED.pattern
    if pattern is not None and _REMEMBERED.may_hold(text):
        text = pattern.sub(REDACTED, text)
    return redact_url(text) if "://" in text else text
