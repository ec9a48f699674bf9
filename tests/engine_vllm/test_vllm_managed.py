"""calibrate managing a real `vllm serve` ([server] kind = "vllm"), the whole day of a user in one
session: server start → single → repro → ladder → sweep → pin → restart from the pinned script →
verify → rollback → server stop. One test, since every start costs a minute.

The start carries no cap, so the pin changes it: vLLM's ``system_fingerprint`` is
``vllm-<version>-<hash of the engine config>`` and changes with ``--max-num-seqs``; SPEC §6.1 says
that is a changed config under the same build, not "the server's build changed", and must not fail
verify or rollback. ``[server] env`` gives the engine its environment (vLLM's CPU build sizes its
KV cache from VLLM_CPU_KVCACHE_SPACE) for every start and in the pinned script. Run with
``make test-engine ENGINE=vllm``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests

from calibrate.server import pids
from tests.engine_vllm.helpers import (
    KV_SPACE_GIB,
    MAX_MODEL_LEN,
    MODEL_DIR,
    MODEL_NAME,
    READY_S,
    free_port,
    show,
    sweep_done,
    write_config,
)

pytestmark = pytest.mark.engine


def _record(root: Path) -> dict:
    return json.loads((root / "runs/server.json").read_text("utf-8"))


def _fingerprint(root: Path, run_id: str) -> str:
    lines = (root / "runs" / run_id / "records.jsonl").read_text("utf-8").splitlines()
    return str(json.loads(lines[-1])["system_fingerprint"])


def _timed(cli, *args: str):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    result = cli(*args)
    show(
        f"\n$ calibrate {' '.join(args)}  → exit {result.code} in {time.monotonic() - started:.0f} s"
    )
    show(result.err)
    return result


def test_managed_vllm_start_to_rollback_after_a_pin_that_changed_the_cap(
    cli, isolated: Path
) -> None:
    port = free_port()
    write_config(
        isolated,
        port,
        server=(
            f'kind = "vllm"\nmodel_path = "{MODEL_DIR}"\nport = {port}\n'
            f'args = ["--max-model-len", "{MAX_MODEL_LEN}"]\n'
            f'env = {{ VLLM_CPU_KVCACHE_SPACE = "{KV_SPACE_GIB}" }}\n'
            f"ready_timeout_s = {READY_S:g}\nstop_timeout_s = 30\n"
        ),
    )
    root = f"http://127.0.0.1:{port}"
    start = _timed(cli, "server", "start", "--json")
    assert start.code == 0, start.err
    argv = start.json["argv"]
    assert argv[:3] == ["vllm", "serve", str(MODEL_DIR)] and "--max-num-seqs" not in argv, argv
    assert argv[argv.index("--served-model-name") + 1] == MODEL_NAME

    single = _timed(cli, "single", "--json")
    assert single.code == 0, single.err
    baseline_fingerprint = _fingerprint(isolated, single.json["run_id"])
    assert re.fullmatch(r"vllm-0\.\d+\.\d+-[0-9a-f]{8}", baseline_fingerprint)
    assert _timed(cli, "repro").code == 0

    ladder = _timed(cli, "ladder", "--json")
    assert ladder.code == 0, ladder.err
    batch = ladder.json["last_passing"]["batch_size"]

    sweep = _timed(cli, "sweep", "--json")
    assert sweep_done(sweep), sweep.err
    assert _record(isolated)["batch_size"] == batch, "the sweep runs the server at cap B"

    pin = _timed(cli, "pin", "--json")
    assert pin.code == 0, pin.err
    script = isolated / "scripts/launch.sh"
    text = script.read_text("utf-8")
    show("\n" + text)
    assert re.search(rf"--max-num-seqs[ =]\"?(\$\{{?BATCH_SIZE\}}?|{batch})\b", text), text
    assert re.search(rf"^export BATCH_SIZE={batch}$", text, re.MULTILINE), text
    assert f"VLLM_CPU_KVCACHE_SPACE={KV_SPACE_GIB}" in text, "[server] env is in the script"

    assert _timed(cli, "server", "stop").code == 0
    from_script = _timed(cli, "server", "start", "--script", str(script), "--json")
    assert from_script.code == 0, from_script.err
    verify = _timed(cli, "verify", "--json")
    assert verify.code == 0, verify.err
    assert "config consistent" in verify.err
    pinned_fingerprint = _fingerprint(isolated, verify.json["run_id"])
    show(f"fingerprint: {baseline_fingerprint} (no cap) → {pinned_fingerprint} (cap {batch})")
    assert pinned_fingerprint != baseline_fingerprint, "the pin changed vLLM's engine config"
    assert "build changed" not in verify.err

    old_pid = _record(isolated)["pid"]
    rollback = _timed(cli, "rollback", "--json")
    assert rollback.code == 0, rollback.err
    assert f"restored: batch {batch}" in rollback.err
    assert "build changed" not in rollback.err
    assert pids.start_id(old_pid) is None, "the old vLLM is gone"
    assert requests.get(f"{root}/health", timeout=10).status_code == 200

    last_pid = _record(isolated)["pid"]
    assert _timed(cli, "server", "stop").code == 0
    assert pids.start_id(last_pid) is None
