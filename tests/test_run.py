"""`calibrate run`: single → repro → ladder → sweep → pin in one command, each stage its own gate,
verdict and files; the first stage that does not pass stops it with that stage's exit code; a
rerun resumes at the first stage not passed for the target."""

from __future__ import annotations

import re
from pathlib import Path

from calibrate.state.ledger import Ledger
from tests.helpers import NO_PLOT
from tests.mockserver import start_mock
from tests.tier_helpers import FAST

# short windows: a ladder of batches 1, 2, 4 and a sweep of one short run per level; no
# plot.png (write_config's rule: these configs are written whole, and drew ten nobody read)
TIMING = f"{FAST}batch_sizes = [1, 2, 4]\n[sweep]\nlevel_s = 0.3\nrepeats = 1\n{NO_PLOT}"
MOCK = {"ttft_s": 0.002, "per_token_s": 0.0005, "slots": 4}


def _stages(root: Path) -> list[tuple[str, bool]]:
    return [(e.stage, e.passed) for e in Ledger(root / "runs").view().entries]


def test_run_from_the_command_line_ends_with_the_summary_and_a_launch_script(
    cli, isolated: Path
) -> None:
    (isolated / "calibrate.toml").write_text(TIMING, "utf-8")  # timing only: no [target]
    with start_mock(**MOCK) as mock:
        target = ("--base-url", mock.base_url, "--model", "internlm-s2")
        result = cli("run", *target, "--kind", "vllm", "--json")
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    assert [ln for ln in lines if ln.startswith("== run ")] == [
        f"== run {n}/5: calibrate {stage}"
        for n, stage in enumerate(("single", "repro", "ladder", "sweep", "pin"), 1)
    ]
    end = lines[lines.index("calibrate run passed: single, repro, ladder, sweep, pin") :]
    assert end[1].startswith("setting: batch ") and ", concurrency " in end[1], result.err
    assert end[2].startswith("  ladder: batch ") and end[3].startswith("  sweep: "), result.err
    assert end[4] == "launch script: scripts/launch.sh (vllm)", result.err
    assert end[5].startswith("next: calibrate server start --script scripts/launch.sh"), result.err
    assert len(end) == 6, result.err  # one short summary, nothing after it
    script = (isolated / "scripts" / "launch.sh").read_text("utf-8")
    assert "vllm serve /models/internlm-s2" in script  # the model path the server reported
    assert f" --port {mock.port} " in script  # no [server]: where the calibrated server was
    # each stage its own verdict and files
    assert _stages(isolated) == [(s, True) for s in ("single", "repro", "ladder", "sweep", "pin")]
    for stage in ("single", "repro", "ladder", "sweep", "pin"):
        assert list((isolated / "runs").glob(f"*-{stage}-*/summary.json")), stage
    payload = result.json
    assert payload["passed"] is True and payload["launch_script"] == "scripts/launch.sh"
    assert [s["stage"] for s in payload["stages"]] == ["single", "repro", "ladder", "sweep", "pin"]
    assert len(payload["why"]) == 2 and payload["next"] == end[5].removeprefix("next: ")


def test_a_failing_stage_stops_the_run_with_its_exit_code_and_a_rerun_resumes_there(
    cli, isolated: Path
) -> None:
    strict = "[slo]\ne2e_p99_s = 0.000001\n"  # no tier can meet it: the ladder fails
    config = isolated / "calibrate.toml"
    with start_mock(**MOCK) as mock:
        target = ("--base-url", mock.base_url, "--model", "internlm-s2", "--kind", "vllm")
        config.write_text(TIMING + strict, "utf-8")
        failed = cli("run", *target)
        assert failed.code == 1, failed.err
        lines = failed.err.splitlines()
        assert "calibrate run stopped at ladder: it did not pass, exit 1" in lines, failed.err
        assert lines[-1] == "next: once that is fixed, calibrate run again: it resumes at ladder"
        assert _stages(isolated) == [("single", True), ("repro", True), ("ladder", False)]
        assert not (isolated / "scripts").exists()

        config.write_text(TIMING, "utf-8")
        again = cli("run", *target)
        assert again.code == 0, again.err
        assert "single, repro passed: resuming at ladder" in again.err.splitlines()[0]
        assert "== run 1/5" not in again.err and "== run 3/5: calibrate ladder" in again.err
        ran = _stages(isolated)[3:]
        assert ran == [(s, True) for s in ("ladder", "sweep", "pin")]

        done = cli("run", *target)  # everything passed: the summary again, nothing sent
        assert done.code == 0, done.err
        assert done.err.splitlines()[0].endswith(": every stage has passed"), done.err
        assert "launch script: scripts/launch.sh (vllm)" in done.err
        assert len(_stages(isolated)) == 6

        pinned = cli("run", *target, "--from", "pin")  # one stage again, on request
        assert pinned.code == 0, pinned.err
        assert [s for s, _ in _stages(isolated)[6:]] == ["pin"]


def test_an_unreachable_server_stops_the_run_at_single_with_exit_4_and_its_message(
    cli, isolated: Path
) -> None:
    result = cli("run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--kind", "vllm")
    assert result.code == 4, result.err
    lines = result.err.splitlines()
    error = next(n for n, ln in enumerate(lines) if ln.startswith("error: "))
    stopped = lines.index("calibrate run stopped at single: it could not reach the server, exit 4")
    assert error < stopped, result.err  # the stage's own message first
    assert lines[-1].endswith("it resumes at single")


def test_a_stage_whose_gate_is_closed_stops_the_run_with_exit_3(cli, isolated: Path) -> None:
    argv = ("--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--kind", "vllm")
    result = cli("run", *argv, "--from", "ladder")
    assert result.code == 3, result.err
    assert "error: ladder is gated: no repro has run for this target" in result.err
    assert "calibrate run stopped at ladder: it found its gate closed, exit 3" in result.err


def test_without_an_engine_kind_run_is_exit_2_before_anything_is_sent(cli, isolated: Path) -> None:
    result = cli("run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m")
    assert result.code == 2, result.err
    assert "no engine kind is known; nothing was sent" in result.err
    assert "--kind (vllm | llamacpp" in result.err
    assert not (isolated / "runs").exists()


def test_run_hands_its_tasks_to_the_ladder_the_sweep_and_pin_and_its_kind_to_pin() -> None:
    """Each stage's namespace is its own parser's defaults plus the run's shared flags."""
    from calibrate.cli import build_parser
    from calibrate.cli.calibration.run import stage_namespace
    from calibrate.cli.flags import CommandLine

    words = ("run", "--base-url", "http://h:1/v1", "--tasks", "job.jsonl", "--kind", "llamacpp")
    args = build_parser("run").parse_args(list(words), namespace=CommandLine(words))
    ladder, single, pin = (stage_namespace(s, args) for s in ("ladder", "single", "pin"))
    assert ladder.tasks == "job.jsonl" and ladder.base_url == "http://h:1/v1"
    assert not hasattr(single, "tasks") and single.stream is False  # single's own default
    assert pin.tasks == "job.jsonl" and pin.kind == "llamacpp" and pin.prompt == ""
    assert ladder.json is False and ladder.run.__module__.endswith(".ladder")


def test_a_llamacpp_says_its_weights_in_props_where_v1_models_has_no_root() -> None:
    """llama.cpp's /v1/models has no root; its /props names the model_path — the served
    weights single records, so pin can write the launch script with no [server] model_path."""
    from calibrate.errors import ErrorInfo, RequestError
    from calibrate.http.server_context import props_model_path

    class Client:
        def __init__(self, text: str | None) -> None:
            self.text = text

        def get_text(self, path: str) -> str:
            if self.text is None:
                raise RequestError(ErrorInfo("http_4xx", "404 Not Found", status=404))
            return self.text

    said = Client('{"model_path": "/m/tiny.gguf", "total_slots": 2}')
    assert props_model_path(said) == "/m/tiny.gguf"  # type: ignore[arg-type]
    assert props_model_path(Client(None)) == ""  # type: ignore[arg-type]
    assert props_model_path(Client("<html>")) == ""  # type: ignore[arg-type]


def test_a_server_restarted_with_fewer_slots_sends_run_and_status_back_to_the_ladder(
    cli, isolated: Path
) -> None:
    """After a passing run at batch 4 the server came back running 2 at once: the sweep run
    again saw it (left level 4 out) and pin refused to write a cap of 4 (exit 3, 'Run first:
    calibrate ladder'). The run said 'it resumes at pin', status 'next: calibrate pin', and the
    next run resumed at pin and was refused again; each now names the ladder."""
    config = isolated / "calibrate.toml"
    config.write_text(TIMING.replace("[1, 2, 4]", "[4]"), "utf-8")  # batch 4, whatever the noise
    # ~0.1 s answers, several /metrics samples long: on MOCK's 36 ms answers a loaded suite saw
    # the server run 3 of 4 at most, and the ladder said it could not tell batch 4 ran whole
    with start_mock(ttft_s=0.02, per_token_s=0.002, slots=4) as mock:
        target = ("--base-url", mock.base_url, "--model", "internlm-s2")
        first = cli("run", *target, "--kind", "vllm")
        assert first.code == 0, first.err
        port = mock.port
    with start_mock(port=port, ttft_s=0.02, per_token_s=0.005, slots=2):  # ~0.26 s an answer
        stopped = cli("run", *target, "--kind", "vllm", "--from", "sweep")
        assert stopped.code == 3, stopped.err
        assert "pin refused" in stopped.err, stopped.err
        lines = stopped.err.splitlines()
        assert lines[-1] == "next: once that is fixed, calibrate run again: it resumes at ladder"
        status = cli("status", *target, "--json")
        assert status.code == 0 and status.json["next"] == "calibrate ladder", status.err
        config.write_text(TIMING.replace("[1, 2, 4]", "[1, 2]"), "utf-8")  # what it runs now
        again = cli("run", *target, "--kind", "vllm")
    first = again.err.splitlines()[0]
    assert first.endswith("single, repro passed: resuming at ladder"), again.err
    assert again.code == 0, again.err
    # batch 2 where the ladder's rounds tell it from batch 1; beside CPU burners they could not,
    # and FAST's --conservative took batch 1, saying so — what it runs now either way
    pinned = re.search(r"pinned batch (\d+), concurrency", again.err)
    assert pinned is not None and pinned[1] in ("1", "2"), again.err
    if pinned[1] == "1":
        assert "batch 1, the conservative answer, taken under noise" in again.err, again.err
