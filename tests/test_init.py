"""`calibrate init` writes every section of calibrate.toml, each key with its default (commented
where the default is "not set"), so a user sees everything there is to set."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from calibrate.config import Config, Overrides, load
from calibrate.config.sections import SECTIONS

# "# key = value" and "# [section]" lines: a setting shown commented out
_COMMENTED = re.compile(r"^# (\[[a-z_]+\](?=\s*(#.*)?$)|[a-z_0-9]+ = .*)")


def _uncommented(text: str) -> str:
    lines = []
    for line in text.splitlines():
        match = _COMMENTED.match(line)
        lines.append(match.group(1) if match else line)
    return "\n".join(lines)


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def test_init_writes_every_section_and_key_with_its_default(cli, isolated: Path) -> None:
    assert cli("init").code == 0
    text = (isolated / "calibrate.toml").read_text(encoding="utf-8")
    assert load(Overrides(), {}) == Config(source="calibrate.toml")  # as written: the defaults
    shown = tomllib.loads(_uncommented(text))  # every setting, the commented ones too
    assert set(shown) == set(SECTIONS), f"sections missing: {set(SECTIONS) - set(shown)}"
    defaults = Config()
    for name, section in SECTIONS.items():
        for field in dataclasses.fields(section):
            assert field.name in shown[name], f"[{name}] {field.name} is not in the starter"
            default = getattr(getattr(defaults, name), field.name)
            if default not in (None, (), ""):  # a key off by default is shown with an example
                assert shown[name][field.name] == _plain(default), f"[{name}] {field.name}"
