"""Target identity (SPEC §3.1): what can change the answer, and the weights guard.

A change that cannot change the answer must not reset the gates; one that can, must. So the
fingerprint covers the **host** of base_url (not its port, scheme or path: a server moved to
another port is the same server; this machine by any name — localhost, 127.0.0.1, ::1 — is one
host), the model name, the prompt text and the sampling params — and not ``[server]`` at all,
which a user may fill in after the ladder. The weights are guarded by
comparison instead: every ledger line records ``model_path`` and what ``/v1/models`` reported
(vLLM's ``root``), and a gate closes when a recorded non-empty value differs from the current one.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from calibrate.config import Config


@dataclass(frozen=True)
class TargetIdentity:
    host: str
    model: str
    prompt: str
    params: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, cfg: Config) -> TargetIdentity:
        p = cfg.prompt
        params = (
            ("max_tokens", p.max_tokens),
            ("seed", p.seed),
            ("temperature", p.temperature),
            ("top_p", p.top_p),
        )
        return cls(url_host(cfg.target.base_url), cfg.target.model, p.text, params)

    @property
    def fingerprint(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:6]

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "model": self.model,
            "prompt": self.prompt,
            "params": dict(self.params),
        }

    @classmethod
    def from_json(cls, data: Any) -> TargetIdentity | None:
        if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
            return None
        fields = (data.get("host"), data.get("model"), data.get("prompt"))
        if not all(isinstance(v, str) for v in fields):
            return None
        return cls(
            str(fields[0]), str(fields[1]), str(fields[2]), tuple(sorted(data["params"].items()))
        )

    def changes_since(self, before: TargetIdentity) -> list[str]:
        """What changed from ``before`` to this identity, in words."""
        out: list[str] = []
        if before.host != self.host:
            out.append(f"the server host ({before.host} → {self.host})")
        if before.model != self.model:
            out.append(f"the model name ({before.model} → {self.model})")
        if before.prompt != self.prompt:
            out.append("the fixed prompt text ([prompt].text)")
        changed = [k for k, v in self.params if dict(before.params).get(k) != v]
        if changed:
            out.append(f"the sampling params ({', '.join(changed)})")
        return out


LOOPBACK = "127.0.0.1"  # the one name of this machine in a target's identity
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def url_host(base_url: str) -> str:
    """The host name of a URL, lower-cased, without userinfo or port; this machine by any name
    (``localhost``, ``127.0.0.1``, ``[::1]``, any 127.x.y.z) is one host, ``127.0.0.1``."""
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return LOOPBACK
    try:
        return LOOPBACK if ipaddress.ip_address(host).is_loopback else host
    except ValueError:  # a name, not an address
        return host


@dataclass(frozen=True)
class Weights:
    """Which weights a run measured: the configured path and what the server said it serves."""

    model_path: str = ""
    served_root: str = ""

    def to_json(self) -> dict[str, str]:
        return {"model_path": self.model_path, "served_root": self.served_root}

    @classmethod
    def from_json(cls, data: Any) -> Weights:
        if not isinstance(data, dict):
            return cls()
        path, root = data.get("model_path"), data.get("served_root")
        return cls(path if isinstance(path, str) else "", root if isinstance(root, str) else "")

    def mismatch(self, now: Weights) -> str | None:
        """Why ``now`` is not the weights this record measured (None when they may be the same)."""
        if self.model_path and now.model_path and self.model_path != now.model_path:
            return f"the model path changed: {self.model_path} → {now.model_path}"
        if self.served_root and now.served_root and self.served_root != now.served_root:
            return f"the server now serves other weights: {self.served_root} → {now.served_root}"
        return None
