"""Secrets in server command lines and environments: hidden wherever they are stored or shown.

A flag or variable is secret when a word of its name (split at ``-`` and ``_``) says key,
token, secret, password/passwd, cookie, signature, sas, auth or credential — plural or not, or
inside a compound (``apikey``, ``keyfile``, ``authtoken``): ``--api-key X``, ``--api-keys X Y``
(every value of a plural flag), ``--api-key=X``, ``-k X``, ``--key-file X``, ``--cookie X``,
``--sas X``, ``HF_TOKEN=…``, ``X_API_KEY=…``. A key or token word next to a quantity
(``--per-token``, ``--max-tokens``) is a count, not a secret; ``--tokenizer`` is neither.
One helper serves ``server.log``, ``server.json``, manifests, messages and ``pin``'s script
(which takes each secret from an environment variable instead of holding it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

MASK = "***"
# A word of a name that marks it secret wherever it stands (singular or plural).
_STRONG = re.compile(
    r"(?:secret|password|passwd|passphrase|pwd|credential|cookie|signature|sas\w*|o?auth\w*"
    r"|\w+(?:key|token)|(?:key|token)(?:file|path|store|ring)|apikey|accesskey)s?"
)
_WEAK = frozenset({"key", "keys", "token", "tokens"})  # secret unless a quantity word is there
# Words that make a key/token word a size or a setting of the model, not a secret:
# --max-tokens, --kv-capacity-tokens, --max-prefill-tokens, --num-speculative-tokens.
_QUANTITY = frozenset(
    {
        "per", "max", "min", "num", "n", "count", "limit", "budget", "size", "threshold",
        "total", "capacity", "cache", "kv", "prefill", "batched", "batch", "draft",
        "speculative", "lookahead", "reserved", "input", "output", "prompt", "context", "ctx",
        "seq", "len", "length", "new", "chunk", "chunked", "block", "window", "special",
        "healing", "ids", "id", "bos", "eos", "pad", "vocab", "rate",
    }
)  # fmt: skip
_SHORT = frozenset({"-k"})  # single-letter flags that carry a key
# A name (flag or variable) followed by "=" or blanks, then its value (quoted or bare).
_NAMED_VALUE = re.compile(
    r"(?<![\w./-])(?P<name>-{0,2}[A-Za-z_][\w-]*)(?P<sep>=|\s+)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s'\";&|)<>`]+)"
)
_NEXT_VALUE = re.compile(r"(?P<sep>\s+)(?P<value>\"[^\"]*\"|'[^']*'|(?!-)[^\s'\";&|)]+)")
_VARIABLE = re.compile(r"[A-Za-z_]\w*")  # an environment variable's name: NAME=value


def secret_name(name: str) -> bool:
    """Whether a flag or variable name looks like it holds a key, token, secret or password.

    ``--api-key``, ``--api-keys``, ``-k``, ``--key-file``, ``HF_TOKEN``, ``--cookie`` are;
    ``--per-token``, ``--max-tokens`` and ``--tokenizer`` are not.
    """
    if name in _SHORT:
        return True
    words = [w for w in re.split(r"[-_]+", name.strip("-").lower()) if w]
    if not words:
        return False
    if any(_STRONG.fullmatch(word) for word in words):
        return True
    return any(w in _WEAK for w in words) and not any(w in _QUANTITY for w in words)


def plural(name: str) -> bool:
    """``--api-keys k1 k2``: a plural secret flag takes every value up to the next flag."""
    last = name.strip("-").lower().replace("_", "-").rsplit("-", 1)[-1]
    return last.endswith("s") and secret_name(name) and not last.endswith(("ss", "sas"))


def redact_text(text: str) -> str:
    """``--api-key X`` / ``--api-key=X`` / ``HF_TOKEN=X`` inside free text → value masked."""
    return _replace_values(text, lambda name, value: MASK)


def _replace_values(text: str, replace: Callable[[str, str], str]) -> str:
    out: list[str] = []
    pos = 0
    while (match := _NAMED_VALUE.search(text, pos)) is not None:
        name = match.group("name")
        if secret_name(name) and (match.group("sep") == "=" or name.startswith("-")):
            out.append(text[pos : match.start("value")] + replace(name, match.group("value")))
            pos = match.end("value")
            while plural(name) and (more := _NEXT_VALUE.match(text, pos)) is not None:
                out.append(more.group("sep") + replace(name, more.group("value")))
                pos = more.end()
        else:  # step past the name only: the value may itself be the next secret flag
            out.append(text[pos : match.end("name")])
            pos = match.end("name")
    out.append(text[pos:])
    return "".join(out)


def _argv_values(argv: Sequence[str]) -> Iterator[tuple[str | None, str]]:
    """Each word with the secret flag whose value it is (None for any other word).

    The word after a secret flag is its value whatever it starts with (a key may begin with
    "-": ``secrets.token_urlsafe`` gives one in 64); a plural flag's further values end at
    the next word that starts with "-"."""
    flag: str | None = None
    first = False
    for word in argv:
        if flag is not None and (first or not word.startswith("-") or word == "-"):
            yield flag, word
            first = False
            flag = flag if plural(flag) else None
            continue
        flag = word if word.startswith("-") and "=" not in word and secret_name(word) else None
        first = flag is not None
        yield None, word


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """The argument list with every secret value masked (``--api-key X`` spans two items)."""
    return tuple(MASK if flag else _redact_word(word) for flag, word in _argv_values(argv))


def _redact_word(word: str) -> str:
    """One argument: ``--api-key=X`` hides all of X (it is one value, whatever it holds)."""
    name, eq, _ = word.partition("=")
    if eq and secret_name(name) and (name.startswith("-") or _VARIABLE.fullmatch(name)):
        return f"{name}={MASK}"
    return redact_text(word)


def redact_env(env: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((k, MASK if secret_name(k) else v) for k, v in env)


def secret_values(command: str) -> tuple[str, ...]:
    """The secret values in a server command (flags, ``VAR=v``, inside ``sh -c`` programs)."""
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = command.split()
    return argv_secret_values(argv)


def argv_secret_values(argv: Sequence[str]) -> tuple[str, ...]:
    """The secret values in an argument list (what ``redact_argv`` would mask)."""
    found: list[str] = []

    def keep(name: str, value: str) -> str:
        found.append(value.strip("'\""))
        return value

    for flag, word in _argv_values(argv):
        if flag is not None:
            found.append(word)
        else:
            _replace_values(word, keep)
    return tuple(v for v in found if v)


def shown_command(words: Sequence[str]) -> str:
    """A command line to print or store (a resume hint, a manifest): shell-quoted, with every
    secret flag's value masked and every URL's userinfo hidden."""
    from calibrate.redact import redact_url

    return " ".join(shell_word(redact_url(word)) for word in redact_argv(words))


def shell_word(word: str) -> str:
    """``shlex.quote(word)``, except for a word holding bytes that are not UTF-8 (a file name
    in GBK, decoded with surrogate escapes): bash's ``$'…'`` with each such byte as ``\\xNN``,
    so the command pasted back into a shell names the same file."""
    if not any(0xDC80 <= ord(c) <= 0xDCFF for c in word):
        return shlex.quote(word)
    out = []
    for c in word:
        code = ord(c)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif c in "\\'":
            out.append("\\" + c)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


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
        if plural(flag):  # --api-keys k1 k2: SERVER_API_KEYS, SERVER_API_KEYS_2
            taken = sum(1 for v in needs if v == var or v.startswith(f"{var}_"))
            var = f"{var}_{taken + 1}" if taken else var
        needs.setdefault(var, flag)
        return var

    words: list[str] = []
    for flag, word in _argv_values(argv):
        if flag is not None:
            words.append(f'"${variable(flag)}"')
            continue
        name, eq, value = word.partition("=")
        if eq and _VARIABLE.fullmatch(name) and secret_name(name):  # env NAME=value
            needs.setdefault(name, f"the server variable {name}")
            words.append(f'{name}="${name}"')
        elif eq and name.startswith("-") and secret_name(name) and value:
            words.append(f'{shlex.quote(name)}="${variable(name)}"')
        elif redact_text(word) != word:  # a shell program holding --api-key X: X is "$VAR"
            words.append(shlex.quote(_replace_values(word, lambda n, v: f'"${variable(n)}"')))
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


def redact_config(public: dict[str, Any]) -> dict[str, Any]:
    """A resolved config's public JSON with secrets in ``[server] command``, ``args`` and
    ``env`` masked (``env`` shown as the table it was written as)."""
    server = public.get("server")
    if not isinstance(server, dict):
        return public
    shown = dict(server)
    if isinstance(server.get("command"), str):
        shown["command"] = redact_text(server["command"])
    if isinstance(server.get("args"), list | tuple):
        shown["args"] = list(redact_argv([str(word) for word in server["args"]]))
    if isinstance(server.get("env"), list | tuple):  # (name, value) pairs
        pairs = [(str(p[0]), str(p[1])) for p in server["env"] if isinstance(p, list | tuple)]
        shown["env"] = dict(redact_env(pairs))
    return {**public, "server": shown}
