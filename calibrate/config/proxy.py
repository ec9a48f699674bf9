"""Proxy variables: calibrate never sends through a proxy, and says so once when one is set.

``HTTP_PROXY``, ``HTTPS_PROXY`` and ``ALL_PROXY`` (any case) are not used: calibrate measures
the server it talks to, so a proxy in between would be measured with it, and the key would
reach the proxy. Where such a variable would have applied to the target — its scheme's
variable (else ``ALL_PROXY``) is set, the host is not a loopback address and ``NO_PROXY`` does
not exempt it — ``proxy_note`` is the one line that says the target is reached directly.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from calibrate.redact import redact_url


def _variable(environ: Mapping[str, str], name: str) -> str | None:
    """The variable set for ``name`` (``https_proxy`` before ``HTTPS_PROXY``, as curl reads)."""
    return next((v for v in (name.lower(), name.upper()) if environ.get(v, "").strip()), None)


def _loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def exempted(host: str, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` exempts ``host``, as curl reads it: ``*``; a name, which covers its
    subdomains (``example.com``, ``.example.com``); an address or a network (``10.0.0.0/8``)."""
    host = host.lower().strip("[]")
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        address = None
    for entry in (e.strip().lower() for e in no_proxy.replace(" ", ",").split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = entry.lstrip(".").rsplit(":", 1)[0] if entry.count(":") == 1 else entry.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


def proxy_note(base_url: str, environ: Mapping[str, str]) -> str:
    """The line that says a set proxy variable is not used for ``base_url``; "" when none
    would have applied."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    variable = _variable(environ, f"{parts.scheme}_proxy") or _variable(environ, "all_proxy")
    if variable is None or _loopback(host):
        return ""
    exempt = _variable(environ, "no_proxy")
    if exempt and exempted(host, environ[exempt]):
        return ""
    return (
        f"{variable} is set, but calibrate connects to {redact_url(base_url)} directly: it "
        "never sends through a proxy (the proxy would be measured too, and would see the key). "
        "If the server is reachable only through it, open a tunnel (ssh -L 8000:SERVER:8000 "
        "GATEWAY) and point --base-url at http://127.0.0.1:8000/v1."
    )
