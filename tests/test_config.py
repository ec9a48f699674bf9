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
        # TOML integers have any size: an int field, a float field, a list of ints
        ("[ladder]\nrounds = 1" + "0" * 300 + "\n", "ladder.rounds"),
        ("[sweep]\nlevel_s = 1" + "0" * 400 + "\n", "sweep.level_s"),
        ("[ladder]\nbatch_sizes = [1, 1" + "0" * 30 + "]\n", "ladder.batch_sizes"),
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


@pytest.mark.parametrize("key", ["api_key", "openai_api_key"])
def test_a_key_written_into_the_file_says_where_it_goes(cli, isolated: Path, key: str) -> None:
    """The list of known keys does not tell a new user where the key goes: the hint does, and
    the value itself is never shown."""
    (isolated / "calibrate.toml").write_text(f'[target]\n{key} = "sk-in-file-123"\n', "utf-8")
    result = cli("single")
    assert result.code == 2 and f"target.{key}" in result.err
    assert "export CALIBRATE_API_KEY" in result.err and "api_key_env" in result.err
    assert "sk-in-file-123" not in result.err + result.out
    assert not (isolated / "runs").exists()


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


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[target]\ntimeout_s = nan\n", "target.timeout_s"),
        ("[target]\ntimeout_s = inf\n", "target.timeout_s"),
        ("[target]\ntimeout_s = 1e300\n", "timeout_s"),
        ('[target]\nmodel = ""\n', "model"),
        ('[target]\nmodel = "   "\n', "model"),
        ('[target]\nbase_url = "http://127.0.0.1:70000/v1"\n', "port"),
        ('[target]\nbase_url = "http://127.0.0.1:0/v1"\n', "port"),
        ('[target]\nbase_url = "http://127.0.0.1:8000/v1?x=1"\n', "query string"),
        ('[target]\nbase_url = "http://127.0.0.1:8000/v1#frag"\n', "fragment"),
        ('[target]\nbase_url = "http://:8000/v1"\n', "no host"),
        ("[prompt]\ntemperature = nan\n", "temperature"),
        ("[prompt]\ntemperature = 1e9\n", "temperature"),
        ("[prompt]\ntop_p = 0\n", "top_p"),
        ("[prompt]\nmax_tokens = 1000000000\n", "max_tokens"),
        ("[ladder]\nbatch_sizes = [1, 1000000000]\n", "batch_sizes"),
        ("[ladder]\nbatch_sizes = [" + ", ".join(["1"] * 65) + "]\n", "at most 64"),
        ("[ladder]\nrounds = 1000\n", "rounds"),
        ("[ladder]\nconcurrency = 100000\n", "concurrency"),
        ("[ladder]\nconcurrency = 64\nbatch_sizes = [128]\n", "in flight"),
        ("[ladder]\nlatency_rise = inf\n", "latency_rise"),
        ("[ladder]\nlatency_rise = 0.5\n", "latency_rise"),
        ("[ladder]\nvram_limit = nan\n", "vram_limit"),
        ("[ladder]\nsample_interval_s = 1e-9\n", "sample_interval_s"),
        ("[sweep]\nconcurrency = [1, 5000]\n", "concurrency"),
        ("[sweep]\nitems = 24\n", "level_s"),  # removed: says what replaced it
        ("[sweep]\nlevel_s = -1\n", "level_s"),
        ("[sweep]\nrepeats = 0\n", "repeats"),
        ("[ladder]\nmin_round_s = inf\n", "min_round_s"),
        ("[ladder]\nwarmup_waves = -1\n", "warmup_waves"),
        ("[slo]\nttft_p99_s = 0\n", "ttft_p99_s"),
        ("[slo]\ne2e_p99_s = inf\n", "e2e_p99_s"),
        ("[slo]\ntpot_p99_s = 1e9\n", "tpot_p99_s"),
        ("[slo]\nitl_p99_s = 1\n", "itl_p99_s"),
        ("[sweep]\ngain_min = nan\n", "gain_min"),
        ("[server]\nport = 70000\n", "port"),
        ("[server]\nport = 0\n", "port"),
        ("[server]\nready_timeout_s = inf\n", "ready_timeout_s"),
        ("[server]\nstop_timeout_s = -1\n", "stop_timeout_s"),
    ],
)
def test_out_of_range_values_exit_2_naming_key_and_file(
    cli, isolated: Path, text: str, needle: str
) -> None:
    (isolated / "calibrate.toml").write_text(text, encoding="utf-8")
    for command in (("status",), ("single",)):
        result = cli(*command)
        assert result.code == 2, result.err
        assert needle in result.err and "calibrate.toml" in result.err
        assert "Traceback" not in result.err
    assert not (isolated / "runs").exists()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://127.0.0.1:99999/v1", "port"),
        ("http://user:hunter2@127.0.0.1:0/v1", "port"),
        ("http://127.0.0.1:8000/v1?key=1", "query string"),
    ],
)
def test_bad_base_url_from_flag_or_environment_exits_2(
    cli, monkeypatch: pytest.MonkeyPatch, url: str, needle: str
) -> None:
    flag = cli("single", "--base-url", url)
    assert flag.code == 2 and needle in flag.err and "hunter2" not in flag.err
    monkeypatch.setenv("CALIBRATE_BASE_URL", url)
    env = cli("status")
    assert env.code == 2 and needle in env.err and "hunter2" not in env.err


def test_sizes_from_flags_are_bounded(cli, isolated: Path) -> None:
    assert cli("server", "start", "--kind", "vllm", "--concurrency", "1000000000").code == 2
    assert cli("sweep", "--force", "--batch-size", "1000000000").code == 2
    assert cli("repro", "--runs", "1000000").code == 2
    assert cli("rollback", "--wait", "nan").code == 2
    assert cli("ladder", "--force", "--tolerance", "inf").code == 2
    assert not (isolated / "runs").exists()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[ladder]\nbatch_sizes = [8, 4, 2, 2]\n", "write [2, 4, 8]"),
        ("[ladder]\nbatch_sizes = [1, 2, 2, 4]\n", "write [1, 2, 4]"),
        ("[ladder]\nbatch_sizes = [4, 1]\n", "write [1, 4]"),
        ("[sweep]\nconcurrency = [1, 8, 4]\n", "write [1, 4, 8]"),
        ("[sweep]\nconcurrency = [2, 2]\n", "write [2]"),
    ],
)
def test_steps_out_of_order_or_twice_exit_2_saying_what_to_write(
    cli, isolated: Path, text: str, needle: str
) -> None:
    (isolated / "calibrate.toml").write_text(text, encoding="utf-8")
    result = cli("status")
    assert result.code == 2, result.err
    assert "must rise, each value once" in result.err and needle in result.err
    assert "Traceback" not in result.err


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/v1",
        "http://[/v1",
        "http://]/v1",
        "http://[zz]:8000/v1",
        "http://[::1]x:80/v1",
        "http://[::1]]/v1",
    ],
)
def test_a_malformed_host_is_a_config_error(cli, isolated: Path, url: str) -> None:
    for source in ("file", "flag"):
        if source == "file":
            (isolated / "calibrate.toml").write_text(
                f'[target]\nbase_url = "{url}"\n', encoding="utf-8"
            )
            result = cli("single")
        else:
            (isolated / "calibrate.toml").unlink(missing_ok=True)
            result = cli("single", "--base-url", url)
        assert result.code == 2, result.err
        assert "no valid host" in result.err and "[::1]:8000" in result.err
        assert "Traceback" not in result.err


def test_an_ipv6_host_in_brackets_is_fine() -> None:
    from calibrate.config import normalise_base_url

    assert normalise_base_url("http://[::1]:8000") == "http://[::1]:8000/v1"
    assert normalise_base_url("http://[fe80::1%25eth0]:80/v1") == "http://[fe80::1%25eth0]:80/v1"


@pytest.mark.parametrize(
    "text",
    [
        "[ladder]\nbatch_sizes = " + "[" * 100_000 + "]" * 100_000 + "\n",
        "a = " + "{ b = " * 20_000 + "1" + " }" * 20_000 + "\n",
        "[target]\nbase_url = " + "[" * 5000 + "\n",
    ],
    ids=["array", "inline-table", "unclosed"],
)
def test_deeply_nested_toml_is_a_config_error(cli, isolated: Path, text: str) -> None:
    (isolated / "calibrate.toml").write_text(text, encoding="utf-8")
    result = cli("status")
    assert result.code == 2, result.err
    assert "not valid TOML" in result.err and "Traceback" not in result.err


@pytest.mark.parametrize(
    "content",
    [
        b"x" * (3 << 20),  # a 3 MiB file with no newline: read no further than the cap
        b'[target]\nmodel = "m"\n' + b"#" * (2 << 20) + b"\n",  # a real table, then a huge comment
        b'{"id": 1, "text": "a task file given as --config"}\n' * 40_000,
    ],
)
def test_a_huge_config_is_exit_2_without_reading_it_whole(
    cli, isolated: Path, content: bytes
) -> None:
    path = isolated / "big.toml"
    path.write_bytes(content)
    result = cli("status", "--config", str(path))
    assert result.code == 2
    assert f"{path} is over 1 MiB: not a calibrate config" in result.err
    assert "Traceback" not in result.err
