"""`calibrate init` writes every section of calibrate.toml, each key with its default (commented
where the default is "not set"), so a user sees everything there is to set."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

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


def test_init_writes_the_file_the_other_commands_read(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--config and $CALIBRATE_CONFIG say where init writes, as they say where single reads;
    a file a plain command would not read is named in the command init says to run next."""
    named = cli("init", "--config", "gpu1.toml")
    assert named.code == 0, named.err
    assert (isolated / "gpu1.toml").exists() and not (isolated / "calibrate.toml").exists()
    assert "then run: calibrate single --config gpu1.toml" in named.err
    elsewhere = cli("init", "other.toml")
    assert elsewhere.code == 0 and "calibrate single --config other.toml" in elsewhere.err
    monkeypatch.setenv("CALIBRATE_CONFIG", "env.toml")
    from_env = cli("init")
    assert from_env.code == 0 and (isolated / "env.toml").exists()
    assert from_env.err.rstrip().endswith("then run: calibrate single")  # it reads env.toml
    assert not (isolated / "calibrate.toml").exists()
    both = cli("init", "a.toml", "--config", "b.toml")
    assert both.code == 2 and "two files" in both.err
    assert not (isolated / "a.toml").exists() and not (isolated / "b.toml").exists()


def test_a_missing_config_says_the_init_that_writes_it(cli, isolated: Path) -> None:
    missing = cli("single", "--config", "my cfg.toml")
    assert missing.code == 2
    assert "calibrate init 'my cfg.toml'" in missing.err
    assert cli("init", "my cfg.toml").code == 0
    (isolated / "folder").mkdir()
    folder = cli("init", "folder")
    assert folder.code == 2 and "is a directory" in folder.err and "Traceback" not in folder.err
