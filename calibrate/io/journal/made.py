"""What produced a journal's results: the run's settings, and each item's text.

Every line stays one result. Each carries ``"input_fp"`` right after ``"ok"`` — the item's text
and own prompt in 64 bits (``io.tasks.item_digest``, 16 hex digits) — and ``"made"`` right
before ``"attempts"``: the fingerprint of the run's settings (the model, ``--prompt``, the
sampling parameters as sent, the endpoints' hosts). The first line each run writes also holds
those settings in full (``"settings": {…}``, before ``"made"``), so a fingerprint can be told
in words.

So a resume knows what produced every result it would keep: results made with other settings
refuse the resume (exit 2, saying what changed) unless the mix is accepted (``--allow-mixed``),
and a result whose item was edited since is no result of that item (it runs again). Journals
written before this record neither: their results are kept as they are, with a note.

The hosts are the endpoints' host names (no port, scheme or path, as for the target's identity:
a server moved to another port is the same server). Several endpoints are one deployment when
they share a host: a resume on more or fewer of its replicas is no change; on other hosts only, it is.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SETTINGS_KEY = "settings"
SETTINGS_MARK = b',"settings":{'  # only a real key has these quotes unescaped
FP_FIELD = "input_fp"
MADE_FIELD = "made"
MIXED_FLAG = "--allow-mixed"


def fp_text(digest: int) -> str:
    """An item digest as a journal writes it: 16 hex digits."""
    return f"{digest:016x}"


@dataclass(frozen=True)
class Settings:
    """What a batch sends besides each item: the model, ``--prompt``, the sampling parameters
    (as sent) and the endpoints' hosts."""

    model: str
    prompt: str
    params: tuple[tuple[str, Any], ...]
    hosts: tuple[str, ...]
    expect: str = "text"  # --expect: an ok line of "json" parsed; one of "text" was never checked

    @classmethod
    def of(
        cls,
        model: str,
        prompt: str,
        params: Mapping[str, Any],
        hosts: tuple[str, ...],
        expect: str = "text",
    ) -> Settings:
        params_ = tuple(sorted(params.items()))
        return cls(model, prompt, params_, tuple(sorted(set(hosts))), expect)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": self.prompt,
            "params": dict(self.params),
            "hosts": list(self.hosts),
            # only when not text: the settings of a text run keep the key (and fp) they had
            **({"expect": self.expect} if self.expect != "text" else {}),
        }

    @property
    def key(self) -> str:
        """One text per settings: equal settings, equal keys."""
        return json.dumps(self.to_json(), sort_keys=True, ensure_ascii=False)

    @functools.cached_property  # stamped on every line a run writes: worked out once
    def fp(self) -> str:
        """The settings in 64 bits (16 hex digits), as each result line records them."""
        return hashlib.blake2b(self.key.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()

    def stamp(self, line: dict[str, Any], *, whole: bool = False) -> None:
        """Mark a result line as made with these settings (``whole``: with them in full, as
        a run's first line); ``attempts`` stays last."""
        attempts = line.pop("attempts")
        if whole:
            line[SETTINGS_KEY] = self.to_json()
        line[MADE_FIELD] = self.fp
        line["attempts"] = attempts

    @classmethod
    def from_line(cls, obj: Any) -> Settings | None:
        """The settings a result line holds in full (a run's first), or None."""
        data = obj.get(SETTINGS_KEY) if isinstance(obj, dict) else None
        if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
            return None
        model, prompt, hosts = data.get("model"), data.get("prompt"), data.get("hosts")
        if not isinstance(model, str) or not isinstance(prompt, str):
            return None
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            return None
        expect = data.get("expect", "text")
        if not isinstance(expect, str):
            return None
        return cls.of(model, prompt, data["params"], tuple(hosts), expect)

    def changes_from(self, old: Settings, now: str = "now") -> list[str]:
        """What differs from ``old`` in words ("--prompt 'A:' (now 'B:')"); [] when the results
        of ``old`` may stand beside this run's."""
        out = []
        if old.model != self.model:
            out.append(f"--model {_short(old.model)} ({now} {_short(self.model)})")
        if old.prompt != self.prompt:
            out.append(f"--prompt {_short(old.prompt)} ({now} {_short(self.prompt)})")
        before, after = dict(old.params), dict(self.params)
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                flag = f"--{name.replace('_', '-')}" if name in FLAGS else name
                out.append(f"{flag} {before.get(name)!r} ({now} {after.get(name)!r})")
        if old.expect != self.expect:  # results checked otherwise, or not at all
            out.append(f"--expect {old.expect} ({now} {self.expect})")
        if old.hosts and self.hosts and not set(old.hosts) & set(self.hosts):
            out.append(f"the server {', '.join(old.hosts)} ({now} {', '.join(self.hosts)})")
        return out


FLAGS = frozenset({"max_tokens", "temperature"})  # params a batch flag sets; others: [prompt]


def _short(text: str, width: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 1] + "…'"
