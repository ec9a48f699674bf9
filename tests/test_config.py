"""Configuration: precedence, validation errors (exit 2, nothing written), init, masking."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.config import Overrides, load
from calibrate.errors import ConfigError


def test_precedence_defaults_file_env_flags(isolated: Path) -> None:
    (isolated / "calibrate.toml").write_text(
        '[target]\nbase_url = "http://file:1/v1"\nmodel = "from-file"\n[ladder]\nbatch_sizes = [1, 3]\n',
        encoding="utf-8",
    )
    cfg = load(Overrides(), {})
    assert (cfg.target.base_url, cfg.target.model) == ("http://file:1/v1", "from-file")
    assert cfg.ladder.batch_sizes == (1, 3)
    assert cfg.ladder.rounds == 2  # default kept
    cfg = load(Overrides(), {"CALIBRATE_MODEL": "from-env", "CALIBRATE_BASE_URL": "http://env:2"})
    assert (cfg.target.base_url, cfg.target.model) == ("http://env:2/v1", "from-env")
    cfg = load(Overrides(model="from-flag"), {"CALIBRATE_MODEL": "from-env"})
    assert cfg.target.model == "from-flag"


def test_api_key_from_environment_only_and_masked() -> None:
    cfg = load(Overrides(), {"OPENAI_API_KEY": "sk-openai-aaaaaaaaaaaa"})
    assert cfg.api_key == "sk-openai-aaaaaaaaaaaa"
    cfg = load(Overrides(), {"OPENAI_API_KEY": "sk-x", "CALIBRATE_API_KEY": "sk-calib-bbbbbbbbbb"})
    assert cfg.api_key == "sk-calib-bbbbbbbbbb"
    assert "bbbbbbbbbb" not in str(cfg.to_public_json())
    assert "bbbbbbbbbb" not in repr(cfg)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[target]\nmodle = 'x'\n", "target.modle"),
        ("[ladder]\nbatch_sizes = 4\n", "ladder.batch_sizes"),
        ("[ladder]\nmode = 'burst'\n", "ladder.mode"),
        ("[targets]\nmodel = 'x'\n", "[targets]"),
        ("[prompt]\nmax_tokens = 'many'\n", "prompt.max_tokens"),
        ("[target\n", "not valid TOML"),
    ],
)
def test_bad_config_exits_2_naming_file_and_key(
    cli, isolated: Path, text: str, needle: str
) -> None:
    (isolated / "calibrate.toml").write_text(text, encoding="utf-8")
    result = cli("single")
    assert result.code == 2
    assert needle in result.err and "calibrate.toml" in result.err
    assert "Traceback" not in result.err
    assert not (isolated / "runs").exists(), "nothing may be written for a rejected config"


def test_missing_explicit_config_is_exit_2(cli) -> None:
    result = cli("status", "--config", "nope.toml")
    assert result.code == 2 and "nope.toml" in result.err


def test_config_error_type() -> None:
    with pytest.raises(ConfigError):
        load(Overrides(base_url="ftp://x"), {})


def test_init_writes_starter_and_refuses_to_overwrite(cli, isolated: Path) -> None:
    assert cli("init").code == 0
    text = (isolated / "calibrate.toml").read_text(encoding="utf-8")
    assert "[target]" in text and "api_key_env" in text
    load(Overrides(), {})  # the starter file itself is valid
    again = cli("init")
    assert again.code == 2 and "already exists" in again.err
    assert (isolated / "calibrate.toml").read_text(encoding="utf-8") == text


def test_show_config_masks_key(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", "sk-secret-value-123456789")
    result = cli("status", "--show-config", "--json")
    assert result.code == 0
    assert "secret-value" not in result.out + result.err
    assert result.json["config"]["api_key"].startswith("sk-")
