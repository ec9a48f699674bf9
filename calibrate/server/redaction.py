"""Secrets in server command lines and environments: hidden wherever they are stored or shown.

A flag or variable is secret when a word of its name (split at ``-`` and ``_``) is a key,
token, secret, password or credential: ``--api-key X``, ``--api-key=X``, ``--hf-token``,
``HF_TOKEN=…``, ``OPENAI_API_KEY``. ``--per-token``, ``--max-tokens`` and ``--tokenizer``
are not.
One helper serves ``server.log``, ``server.json``, manifests, messages and ``pin``'s script
(which takes each secret from an environment variable instead of holding it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MASK = "***"
_STRONG = frozenset(
    {
        "secret",
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "apikey",
        "credential",
        "credentials",
        "authtoken",
        "accesstoken",
    }
)
_WEAK_LAST = frozenset({"key", "token", "auth", "bearer"})  # secret as the name's last word
_QUANTITY = frozenset({"per", "max", "min", "num", "count", "limit", "budget", "size"})
# A name (flag or variable) followed by "=" or blanks, then its value (quoted or bare).
_NAMED_VALUE = re.compile(
    r"(?<![\w./-])(?P<name>-{0,2}[A-Za-z_][\w-]*)(?P<sep>=|\s+)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s'\"]+)"
)


def secret_name(name: str) -> bool:
    """Whether a flag or variable name looks like it holds a key, token, secret or password.

    ``--api-key``, ``HF_TOKEN``, ``--password`` are; ``--per-token``, ``--max-tokens`` and
    ``--tokenizer`` are not.
    """
    words = [w for w in re.split(r"[-_]+", name.strip("-").lower()) if w]
    if not words:
        return False
    if any(word in _STRONG for word in words):
        return True
    return words[-1] in _WEAK_LAST and not any(word in _QUANTITY for word in words)


def redact_text(text: str) -> str:
    """``--api-key X`` / ``--api-key=X`` / ``HF_TOKEN=X`` inside free text → value masked."""
    out: list[str] = []
    pos = 0
    while (match := _NAMED_VALUE.search(text, pos)) is not None:
        if secret_name(match.group("name")) and (
            match.group("sep") == "=" or match.group("name").startswith("-")
        ):
            out.append(text[pos : match.start("value")] + MASK)
            pos = match.end("value")
        else:  # step past the name only: the value may itself be the next secret flag
            out.append(text[pos : match.end("name")])
            pos = match.end("name")
    out.append(text[pos:])
    return "".join(out)


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """The argument list with every secret value masked (``--api-key X`` spans two items)."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        hide_next = _takes_secret_value(word)
        out.append(redact_text(word))
    return tuple(out)


def redact_env(env: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((k, MASK if secret_name(k) else v) for k, v in env)


def _takes_secret_value(word: str) -> bool:
    return word.startswith("-") and "=" not in word and secret_name(word)


@dataclass(frozen=True)
class ScriptCommand:
    """A command line for a shell script with every secret read from an environment variable."""

    line: str  # the argv as shell words, secrets as "$NAME"
    env_lines: tuple[str, ...]  # export lines for the extra environment
    needs: tuple[tuple[str, str], ...]  # (variable, what it carries) the caller must set


def script_command(
    argv: Sequence[str], env: Sequence[tuple[str, str]], prefix: str
) -> ScriptCommand:
    """``--api-key X`` becomes ``--api-key "$PREFIX_API_KEY"``; ``HF_TOKEN=x`` is taken as is."""
    needs: dict[str, str] = {}

    def variable(flag: str) -> str:
        name = re.sub(r"\W+", "_", flag.strip("-")).upper()
        var = f"{prefix}_{name}" if prefix else name
        needs.setdefault(var, flag)
        return var

    words: list[str] = []
    hide_next: str | None = None
    for word in argv:
        if hide_next is not None:
            words.append(f'"${variable(hide_next)}"')
            hide_next = None
            continue
        if _takes_secret_value(word):
            hide_next = word
            words.append(shlex.quote(word))
            continue
        flag, eq, value = word.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_]\w*", flag) and secret_name(flag):  # env NAME=value
            needs.setdefault(flag, f"the server variable {flag}")
            words.append(f'{flag}="${flag}"')
        elif eq and flag.startswith("-") and secret_name(flag) and value:
            words.append(f'{shlex.quote(flag)}="${variable(flag)}"')
        elif redact_text(word) != word:
            words.append(_program_with_variables(word, variable))
        else:
            words.append(shlex.quote(word))
    env_lines: list[str] = []
    for name, value in env:
        if secret_name(name):
            needs.setdefault(name, f"the server variable {name}")
            env_lines.append(f"export {name}")
        else:
            env_lines.append(f"export {name}={shlex.quote(value)}")
    return ScriptCommand(" ".join(words), tuple(env_lines), tuple(needs.items()))


def _program_with_variables(word: str, variable: Callable[[str], str]) -> str:
    """A shell program holding ``--api-key X``: X becomes ``"$VAR"``, expanded by that shell."""
    out: list[str] = []
    pos = 0
    while (match := _NAMED_VALUE.search(word, pos)) is not None:
        name = match.group("name")
        if secret_name(name) and (match.group("sep") == "=" or name.startswith("-")):
            out.append(word[pos : match.start("value")] + f'"${variable(name)}"')
            pos = match.end("value")
        else:
            out.append(word[pos : match.end("name")])
            pos = match.end("name")
    out.append(word[pos:])
    return shlex.quote("".join(out))


def redact_config(public: dict[str, Any]) -> dict[str, Any]:
    """A resolved config's public JSON with secrets in ``[server] command`` masked."""
    server = public.get("server")
    if isinstance(server, dict) and isinstance(server.get("command"), str):
        return {**public, "server": {**server, "command": redact_text(server["command"])}}
    return public
