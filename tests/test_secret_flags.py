"""Key-like flags are a class (issue 23, items 6 and 7), and every command line shown is redacted.

The rule, table-driven: a flag or variable whose name holds key/token/secret/password/passwd/
cookie/signature/sas/auth/credential (plural or not, ``--x=v`` and ``--x v``, ``X_API_KEY=v``)
has its value masked in argv, in free text and in pin's script; counts (``--max-tokens``) and
``--tokenizer`` are kept. Then through the CLI: launch.sh, ``server status``, ``runs/`` and
``status --show-config`` with LMDeploy's flags; the resume hint of ``batch`` (stderr and
``--json``'s ``resume_command``) without the base-URL password, a raw ``@`` in it included.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from calibrate.engines.redaction import (
    MASK,
    redact_argv,
    redact_text,
    script_command,
    secret_name,
    shown_command,
)
from calibrate.redact import redact_url
from tests.fakes import free_port, managed_config, passing_ladder, pythonpath_env
from tests.helpers import write_config
from tests.mockserver import start_mock

SECRET_FLAGS = [
    "--api-key",
    "--api-keys",
    "--api_key",
    "-k",
    "--cookie",
    "--cookies",
    "--sas",
    "--sas-token",
    "--signature",
    "--key-file",
    "--ssl-keyfile",
    "--hf-token",
    "--auth",
    "--authorization",
    "--oauth-token",
    "--password",
    "--passwd",
    "--client-secret",
    "--secrets",
    "--credential",
    "--credentials",
    "--access-token",
    "--apikey",
]
SECRET_VARIABLES = ["HF_TOKEN", "X_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWD"]
PLAIN_FLAGS = [
    "--max-tokens",
    "--per-token",
    "--tokenizer",
    "--tokenizer-mode",
    "--max-num-batched-tokens",
    "--port",
    "--model",
    "--keep",
    "--kv-cache-dtype",
    "-m",
    "-c",
    "--num-tokens",
    "--token-budget",
    "--kv-capacity-tokens",
    "--max-prefill-tokens",
    "--num-speculative-tokens",
    "--long-prefill-token-threshold",
    "--max-batch-total-tokens",
    "--prompt-tokens",
    "--special-tokens",
    "--eos-token-id",
]


@pytest.mark.parametrize("value", ["v4lue-0001", "-v4lue-0001"])  # a key may start with "-"
@pytest.mark.parametrize("flag", SECRET_FLAGS)
def test_every_key_like_flag_is_masked_in_both_forms(flag: str, value: str) -> None:
    assert secret_name(flag)
    assert value not in " ".join(redact_argv(["srv", flag, value, "--port", "1"]))
    assert redact_argv(["srv", f"{flag}={value}"]) == ("srv", f"{flag}={MASK}")
    assert value not in redact_text(f"bash -c 'exec srv {flag} {value} --port 1'")
    assert value not in redact_text(f"srv {flag}={value};")
    script = script_command(["srv", flag, value, f"{flag}={value}"], [], "SERVER")
    assert value not in script.line and "$SERVER_" in script.line


@pytest.mark.parametrize("name", SECRET_VARIABLES)
def test_env_style_secrets_are_masked(name: str) -> None:
    assert secret_name(name)
    assert redact_argv(["env", f"{name}=v4lue-0001", "srv"]) == ("env", f"{name}={MASK}", "srv")
    assert "v4lue-0001" not in redact_text(f"env {name}=v4lue-0001 srv")


@pytest.mark.parametrize("flag", PLAIN_FLAGS)
def test_counts_and_ordinary_flags_are_kept(flag: str) -> None:
    assert not secret_name(flag)
    assert redact_argv(["srv", flag, "8192"]) == ("srv", flag, "8192")


def test_a_plural_flag_hides_every_value_up_to_the_next_flag() -> None:
    argv = ["lmdeploy", "serve", "--api-keys", "k-one-1", "k-two-2", "--server-port", "8000"]
    assert redact_argv(argv) == (*argv[:3], MASK, MASK, "--server-port", "8000")
    assert "k-two-2" not in redact_text(shlex.join(argv))
    script = script_command(argv, [], "LMDEPLOY")
    assert '"$LMDEPLOY_API_KEYS" "$LMDEPLOY_API_KEYS_2"' in script.line


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:pa55-w0rd@host:8000/v1",
        "http://alice:pa55@w0rd@host:8000/v1",  # a raw "@" in the password
        "https://alice:pa55%40w0rd@host/v1",
        "http://:pa55-w0rd@host/v1",
    ],
)
def test_userinfo_is_hidden_whole(url: str) -> None:
    shown = redact_url(url)
    assert "pa55" not in shown and "w0rd" not in shown and "@host" in shown
    assert "pa55" not in shown_command(["calibrate", "batch", "--base-url", url])
    assert "pa55" not in shown_command(["calibrate", "batch", f"--base-url={url}"])


LMDEPLOY_SECRETS = ("keys-one-0001", "keys-two-0002", "k-short-0003", "cookie-0004", "sas-0005")


def test_lmdeploy_style_flags_stay_out_of_launch_sh_status_and_runs(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    port = free_port()
    mock = shlex.join([sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002"])
    command = (
        f"bash -c ': --api-keys {LMDEPLOY_SECRETS[0]} {LMDEPLOY_SECRETS[1]} -k "
        f"{LMDEPLOY_SECRETS[2]}; exec {mock} --port {{port}} --slots {{concurrency}}' calib "
        f"--cookie {LMDEPLOY_SECRETS[3]} --sas={LMDEPLOY_SECRETS[4]} --signature sig-0006 "
        "--key-file /keys/k-0007"
    )
    managed_config(isolated, port, command)
    started = cli("server", "start", "--concurrency", "1", "--json")
    try:
        assert started.code == 0, started.err
        results = [started, cli("server", "status", "--json"), cli("status", "--show-config")]
        results.append(cli("single", "--json"))
        passing_ladder(isolated, cli("status", "--json").json["target"])
        results.append(cli("pin", "--json"))
        assert results[-1].code == 0, results[-1].err
    finally:
        assert cli("server", "stop").code == 0
    files = "\n".join(
        p.read_text("utf-8", errors="replace")
        for p in isolated.rglob("*")
        if p.is_file() and p.name != "calibrate.toml"
    )
    shown = files + "".join(r.out + r.err for r in results)
    for secret in (*LMDEPLOY_SECRETS, "sig-0006", "k-0007"):
        assert secret not in shown, secret
    assert "--api-keys *** ***" in shown and "--cookie ***" in shown


@pytest.mark.parametrize("password", ["pa55-w0rd-9", "pa55@w0rd-9", "pa55%40w0rd-9"])
@pytest.mark.parametrize("where", ["flag", "flag=", "config"])
def test_the_batch_resume_hint_never_shows_the_password(
    cli: Any, isolated: Path, password: str, where: str
) -> None:
    (isolated / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(2)), encoding="utf-8"
    )
    with start_mock(ttft_s=0.001, per_token_s=0.0001, malformed_rate=1.0) as mock:
        url = mock.base_url.replace("http://", f"http://bob:{password}@")
        write_config(isolated / "calibrate.toml", url if where == "config" else mock.base_url)
        flags = {"flag": ["--base-url", url], "flag=": [f"--base-url={url}"], "config": []}
        result = cli(
            "batch", "--json", "--input", "in.jsonl", "--out", "o.jsonl", "--retries", "0",
            *flags[where],
        )  # fmt: skip
    assert result.code == 1, result.err
    assert "rerun to retry only those: calibrate batch" in result.err
    resume = result.json["resume_command"]
    assert resume.startswith("calibrate batch") and "pa55" not in resume
    if where != "config":
        assert "http://***@127.0.0.1" in resume
    manifest = next((isolated / "runs").glob("*-batch-*/manifest.json")).read_text()
    for text in (result.err, result.out, manifest, json.dumps(resume)):
        assert "pa55" not in text and "w0rd" not in text


def test_the_tune_resume_hint_never_shows_the_password() -> None:
    import argparse

    from calibrate.cli.calibration.tune import resume_command

    url = "http://bob:pa55@w0rd-9@127.0.0.1:8000/v1"
    for argv in (["tune", "--base-url", url, "--new"], ["tune", f"--base-url={url}"]):
        hint = resume_command(argparse.Namespace(argv=argv))
        assert hint.startswith("calibrate tune") and "--new" not in hint
        assert "pa55" not in hint and "w0rd" not in hint and "***@127.0.0.1" in hint
