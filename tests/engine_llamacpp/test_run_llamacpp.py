"""`calibrate run` against a real llama.cpp that calibrate manages: single → repro → ladder
(restarting llama-server at --parallel B per tier) → sweep → pin, ending with the summary and a
launch script; a rerun says every stage passed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_llamacpp.helpers import write_llamacpp_config

pytestmark = pytest.mark.engine


def test_calibrate_run_ends_with_the_summary_and_a_launch_script(
    cli, llama: str, isolated: Path
) -> None:
    port = int(llama.rsplit(":", 1)[1])
    write_llamacpp_config(isolated, port, batch_sizes="[1, 2, 4]", min_round_s=1, level_s=2)
    assert cli("server", "start", "--batch-size", "4").code == 0
    result = cli("run")
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    end = lines[lines.index("calibrate run passed: single, repro, ladder, sweep, pin") :]
    assert end[1].startswith("setting: batch ") and end[2].startswith("  ladder: "), result.err
    assert (
        end[3].startswith("  sweep: ") and end[4] == "launch script: scripts/launch.sh (llamacpp)"
    )
    assert end[5].startswith("next: calibrate server start --script scripts/launch.sh")
    script = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "llama-server" in script and "--parallel" in script and "# context: -c " in script
    again = cli("run")
    assert again.code == 0 and "every stage has passed" in again.err.splitlines()[0], again.err
