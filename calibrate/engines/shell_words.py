"""Placeholders in a custom server command, substituted so no value can run anything.

The template is split into arguments first, then each placeholder is replaced inside its
argument. A plain argument is handed to the engine as it is (no shell sees it). An argument
that *is* a shell program — the one after ``-c`` of sh/bash/zsh/dash/…, or ``su``/``script``
``-c``, or everything after ``ssh HOST`` / ``watch`` — is parsed by a shell later, so each
value put into it is quoted for the spot it lands in: bare, inside "…", or inside '…'.
A shell program that parses its text again — it starts yet another shell (``eval``, ``sh -c``
inside ``bash -c``), or holds a command substitution (``$(…)``, backticks), ANSI-C quoting
(``$'…'``) or a here-document (``<<``), where the quoting context of a spot is not the one
around it — gets only plain values (letters, digits, ``/._-:@%+=,``): those mean nothing to a
shell in any context, so nothing can run; any other value is a config error (exit 2).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

from calibrate.errors import ConfigError

# {model_path} {port} {batch_size} {concurrency}, and any other lower-case name tune gives a value
# to ({slots}, {kv_tokens}, {memory_fraction}); a shell's own ${var} is left alone.
PLACEHOLDER = re.compile(r"(?<!\$)\{([a-z][a-z0-9_]*)\}")
SHELLS = frozenset(
    {"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "su", "runuser", "script"}
)  # fmt: skip
JOIN_TO_SHELL = frozenset({"ssh", "watch"})  # their remaining arguments become one shell program
_REPARSES = re.compile(r"\beval\b|\b(?:sh|bash|zsh|dash|ksh|ash|fish|su|ssh)\b[^|;&]*\s-\w*c\b")
# Spots whose quoting context is not the one around them (see the module docstring).
_NESTED = re.compile(r"\$\(|`|\$'|<<")
_PLAIN = re.compile(r"[A-Za-z0-9_./:@%+=,-]*")

Lookup = Callable[[str], str]


def placeholders(words: Sequence[str]) -> tuple[str, ...]:
    """The placeholder names of a split template, in order of first use."""
    found: dict[str, None] = {}
    for word in words:
        found.update(dict.fromkeys(PLACEHOLDER.findall(word)))
    return tuple(found)


def shell_program_indexes(words: Sequence[str]) -> set[int]:
    """Indexes of the arguments a shell will parse as program text."""
    found: set[int] = set()
    for i, word in enumerate(words):
        name = PurePosixPath(word).name
        if name in JOIN_TO_SHELL:
            found.update(range(i + 1, len(words)))
        elif name in SHELLS:
            program = _after_c_option(words, i + 1)
            if program is not None:
                found.add(program)
    return found


def _after_c_option(words: Sequence[str], start: int) -> int | None:
    """The index of the program of ``SHELL [options] -c PROGRAM`` (None without -c)."""
    has_c = False
    i = start
    while i < len(words):
        word = words[i]
        if word == "--":
            return i + 1 if has_c and i + 1 < len(words) else None
        if word.startswith(("-", "+")) and not word.startswith("--") and len(word) > 1:
            has_c = has_c or "c" in word[1:]
            if word[1:] in ("o", "O"):  # -o OPTION takes the next word
                i += 1
        elif word.startswith("--"):
            pass
        else:
            return i if has_c else None
        i += 1
    return None


def substitute(words: Sequence[str], value: Lookup) -> tuple[str, ...]:
    """Each word with its placeholders filled: literally, or quoted where a shell parses it."""
    programs = shell_program_indexes(words)
    # ``bash -c 'eval "$1"' _ {model_path}``: a value handed to a program that parses text
    # again as its argument would run there too — only plain values after such a program.
    reparsing = [i for i in programs if _REPARSES.search(words[i])]
    out: list[str] = []
    for i, word in enumerate(words):
        if i in programs:
            out.append(_fill_program(word, value))
        elif reparsing and i > reparsing[0]:
            out.append(PLACEHOLDER.sub(lambda m: _plain_only(m.group(1), value), word))
        else:
            out.append(PLACEHOLDER.sub(lambda m: value(m.group(1)), word))
    return tuple(out)


def _plain_only(name: str, value: Lookup) -> str:
    text = value(name)
    if not _PLAIN.fullmatch(text):
        raise ConfigError(
            f"[server] command passes {{{name}}} to a shell program that parses text again "
            f"(eval, sh -c): its value {text!r} could run there",
            "Use a plain value (letters, digits, / . _ - : @ % + = ,), or call the engine "
            "without eval or the inner shell.",
        )
    return text


def _fill_program(program: str, value: Lookup) -> str:
    """Fill placeholders in shell program text, quoting each value for its quoting context."""
    reparsed = bool(_REPARSES.search(program))
    nested = bool(_NESTED.search(program))
    out: list[str] = []
    state = ""  # "" bare, "'" in single quotes, '"' in double quotes
    i = 0
    while i < len(program):
        match = PLACEHOLDER.match(program, i)
        if match:
            name = match.group(1)
            text = value(name)
            if reparsed and not _PLAIN.fullmatch(text):
                raise ConfigError(
                    f"[server] command runs a shell program that starts another shell (eval, "
                    f"sh -c, ssh): the value of {{{name}}} {text!r} would be parsed twice",
                    "Use a plain value (letters, digits, / . _ - : @ % + = ,), or call the "
                    "engine without the inner shell.",
                )
            if nested and not _PLAIN.fullmatch(text):
                raise ConfigError(
                    f"[server] command's shell program holds a command substitution ($(…) or "
                    f"`…`), $'…' or <<: the value of {{{name}}} {text!r} could run there",
                    "Use a plain value (letters, digits, / . _ - : @ % + = ,), or take the "
                    "$(…) / backticks out of the command (pass the value as an argument).",
                )
            out.append(_quoted(text, state))
            i = match.end()
            continue
        char = program[i]
        out.append(char)
        if char == "\\" and state != "'" and i + 1 < len(program):
            out.append(program[i + 1])
            i += 2
            continue
        if char in "'\"" and state in ("", char):
            state = "" if state == char else char
        i += 1
    return "".join(out)


def _quoted(text: str, state: str) -> str:
    if state == "'":  # close the quote, an escaped quote, reopen
        return text.replace("'", "'\\''")
    if state == '"':
        return re.sub(r'([\\"$`])', r"\\\1", text)
    return shlex.quote(text)
