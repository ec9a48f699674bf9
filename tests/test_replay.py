"""The user's own job as the workload, part two: replay of a finished batch (SPEC §13). A batch's
journal holds each item's real input and output tokens; ``ladder --replay JOURNAL`` measures on
exactly that distribution and ``report`` says how close it came — within the stated tolerance
(the two-sample Kolmogorov–Smirnov distance within its 95 % critical value) — drawing both
histograms, as text and in the HTML report. Against the real mock over HTTP."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.mockserver import start_mock
from tests.tier_helpers import jsonl, run_dir
from tests.tune_helpers import COMMAND, tune_config
from tests.workload_helpers import FAST_MOCK, LADDER, SEEN_MOCK, calibrated

# long enough rounds that the replay sends a few hundred requests: the tolerance is then tight
REPLAY_LADDER = LADDER.replace("min_round_s = 0\n", "") + "batch_sizes = [8]\nmin_round_s = 1.0\n"


def _job(root: Path, items: int = 150) -> Path:
    """A job whose items vary in length (log-normal, 20–600 words), as real inputs do."""
    rng = random.Random(7)
    path = root / "tasks.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for i in range(items):
            words = min(600, max(20, int(rng.lognormvariate(4.6, 0.7))))
            text = " ".join(f"w{i}x{j}" for j in range(words))
            out.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


def _batch(cli: Any, root: Path) -> Path:
    out = root / "out.jsonl"
    result = cli("batch", "--input", str(_job(root)), "--out", str(out), "-c", "8")
    assert result.code == 0, result.err
    return out


def test_a_replay_reproduces_the_jobs_token_histograms_and_the_report_draws_both(
    cli, isolated: Path
) -> None:
    # answers several times slower than FAST_MOCK's (13 ms p50 at batch 8): at 470 items/s
    # calibrate itself was the limit (0.89 of a core) and the ladder rightly ended inconclusive,
    # exit 1 (SPEC §5.14); this test is about the replayed lengths: the server sets the pace
    with start_mock(ttft_s=0.005, per_token_s=0.001) as mock:
        calibrated(cli, isolated, mock.base_url, REPLAY_LADDER)
        journal = _batch(cli, isolated)
        result = cli("ladder", "--replay", str(journal), "--json")
    assert result.code == 0, result.err
    workload = result.json["workload"]
    assert workload["source"] == "replay" and workload["replay_items"] == 150
    assert "replay of" in result.err and "150 items" in result.err
    run = run_dir(isolated, result.json["run_id"])
    sent = [r for r in jsonl(run / "records.jsonl") if not r.get("canary")]
    assert len(sent) >= 100, len(sent)
    # every answer forced to its item's own length: the job's outputs, not [prompt].max_tokens
    job = [json.loads(line) for line in journal.read_text("utf-8").splitlines()]
    job_outputs = {line["usage"]["completion_tokens"] for line in job}
    assert {r["usage"]["completion_tokens"] for r in sent} <= job_outputs

    report = cli("report", str(run), "--no-plot", "--html", str(isolated / "r.html"), "--json")
    assert report.code == 0, report.err
    fit = report.json["replay"]
    assert fit["close"] is True, fit
    for name in ("input_tokens", "output_tokens"):
        counts = fit[name]
        # the tolerance narrows with the items sent: ≤ 0.2 is 50 or more (fewer on a busy machine)
        assert counts["ks_distance"] <= counts["tolerance"] <= 0.2, counts
        assert counts["ks_distance"] <= 0.05, counts  # measured: 0.01 (every item, 5 times over)
        assert abs(counts["replay_p50"] - counts["job_p50"]) <= 0.1 * counts["job_p50"], counts
    assert "close to the job" in report.err
    assert "input tokens     job" in report.err and "output tokens    job" in report.err  # text
    html = (isolated / "r.html").read_text("utf-8")
    assert html.count('class="chart replay-histogram"') == 2 and 'id="replay-fit"' in html


def test_a_batch_api_output_file_is_replayed_too(cli, isolated: Path) -> None:
    lines = [
        {
            "id": f"batch_req_{i}",
            "custom_id": f"r{i}",
            "response": {
                "status_code": 200,
                "request_id": f"q{i}",
                "body": {"usage": {"prompt_tokens": 40 + 3 * i, "completion_tokens": 5 + i % 7}},
            },
            "error": None,
        }
        for i in range(30)
    ]
    lines.append({"id": "x", "custom_id": "bad", "response": None, "error": {"code": "500"}})
    path = isolated / "batch_output.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
    with start_mock(**SEEN_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [2]\n")
        result = cli("ladder", "--replay", str(path), "--json")
    assert result.code == 0, result.err
    assert "OpenAI Batch API output, 30 items" in result.err
    run = run_dir(isolated, result.json["run_id"])
    sent = [r for r in jsonl(run / "records.jsonl") if not r.get("canary")]
    assert {r["usage"]["completion_tokens"] for r in sent} <= {5 + i % 7 for i in range(30)}


def test_what_cannot_be_replayed_is_exit_2_before_anything_is_written(cli, isolated: Path) -> None:
    failed = isolated / "failed.jsonl"
    failed.write_text('{"id": 1, "ok": false, "error": {"kind": "http_5xx"}, "attempts": 3}\n')
    old = isolated / "old.jsonl"  # a journal from before send times were recorded
    old.write_text(
        '{"id": 1, "ok": true, "usage": {"prompt_tokens": 20, "completion_tokens": 5}}\n'
    )
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url)
        runs = sorted((isolated / "runs").iterdir())
        cases = [
            (("ladder", "--replay", str(isolated / "missing.jsonl")), "cannot read"),
            (("ladder", "--replay", str(failed)), "holds no finished item"),
            (("ladder", "--replay", str(old), "--output-tokens", "9"), "drop --output-tokens"),
            (("ladder", "--replay", str(old), "--tasks", str(old)), "are 2 workloads"),
            (("ladder", "--replay", str(old), "--axis", "context"), "drop --replay"),
            (("sweep", "--rates", "5", "--arrival", "job"), "add --replay JOURNAL"),
            (("sweep", "--replay", str(old), "--rates", "5", "--arrival", "job"), "no send times"),
            (("ladder", "--prefix-tokens", "900", "--input-tokens", "500"), "not shorter"),
            (("ladder", "--prefix-tokens", "9", "--tasks", str(old)), "job's own --prompt"),
        ]
        replay_config = isolated / "replay.toml"
        replay_config.write_text(
            (isolated / "calibrate.toml").read_text() + '\n[workload]\nsource = "replay"\n'
        )
        cases.append((("ladder", "--config", str(replay_config)), "needs its journal"))
        for args, said in cases:
            result = cli(*args)
            assert result.code == 2 and said in result.err, (args, result.err)
    assert sorted((isolated / "runs").iterdir()) == runs  # nothing written


def test_status_and_pins_header_name_the_replayed_job_and_its_prefix(cli, isolated: Path) -> None:
    server = '[server]\nkind = "vllm"\nmodel_path = "/models/internlm-s2"\n'
    with start_mock(**SEEN_MOCK, prefix_cache=True, prefill_ms_per_1k_tokens=400.0) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [2]\n" + server)
        journal = _batch(cli, isolated)
        ladder = cli("ladder", "--replay", str(journal), "--prefix-tokens", "16")
        assert ladder.code == 0, ladder.err
        status = cli("status")
        pinned = cli("pin")
    assert pinned.code == 0, pinned.err
    verified = next(x for x in status.err.splitlines() if "verified on:" in x)
    header = next(
        x for x in (isolated / "scripts/launch.sh").read_text().splitlines() if "workload" in x
    )
    for said in (verified, header):
        assert "replay of" in said and "150 items" in said, said
        assert "the first 16 tokens shared" in said, said
        assert "prefix cache on (vLLM's automatic prefix caching)" in said, said


def test_tune_measures_every_candidate_on_the_replayed_job(cli, isolated: Path) -> None:
    tune_config(isolated, 'grid = ["slots=2,4", "kv_tokens=50000"]\n', command=COMMAND)
    journal = isolated / "out.jsonl"
    journal.write_text(
        "".join(
            json.dumps(
                {"id": i, "ok": True, "usage": {"prompt_tokens": 30 + i, "completion_tokens": 8}}
            )
            + "\n"
            for i in range(40)
        )
    )
    result = cli("tune", "--replay", str(journal), "--json")
    assert result.code == 0, result.err
    records = sorted(isolated.glob("runs/*-tune-*/candidates/*/records.jsonl"))
    assert len(records) >= 2  # one per candidate, each measured on the job's own lengths
    for path in records:
        sent = [r for r in jsonl(path) if not r.get("canary")]
        assert sent and {r["usage"]["completion_tokens"] for r in sent} == {8}
        assert {r["usage"]["prompt_tokens"] for r in sent} <= set(range(30, 70))


def test_a_replay_too_small_to_judge_is_not_called_close(cli, isolated: Path) -> None:
    """A one-item job replayed on a server that does not force answer lengths (TGI): the job's
    answer was 300 tokens, the replay's about 30, KS distance 1.000 — and report said "close to
    the job" because the tolerance (1.37) was above any distance there can be. It now says too
    few to tell, in the text, --json (close: null) and the HTML."""
    journal = isolated / "one.jsonl"
    usage = {"prompt_tokens": 400, "completion_tokens": 300}
    journal.write_text(json.dumps({"id": 1, "ok": True, "usage": usage}) + "\n", "utf-8")
    with start_mock(**FAST_MOCK) as mock:
        calibrated(
            cli, isolated, mock.base_url, LADDER + 'batch_sizes = [1]\n[server]\nkind = "tgi"\n'
        )
        ladder = cli("ladder", "--replay", str(journal), "--json")
    assert ladder.code == 0, ladder.err
    run = run_dir(isolated, ladder.json["run_id"])
    report = cli("report", str(run), "--no-plot", "--html", str(isolated / "r.html"), "--json")
    assert report.code == 0, report.err
    fit = report.json["replay"]
    assert fit["output_tokens"]["ks_distance"] == 1.0 and fit["output_tokens"]["tolerance"] > 1
    assert fit["close"] is None and fit["output_tokens"]["close"] is None, fit
    assert fit["output_tokens"]["verdict"] == "too few to tell"
    said = " ".join(report.err.split())
    assert "too few to tell whether it is close to the job" in said
    assert "close to the job" not in said.replace("whether it is close to the job", "")
    html = (isolated / "r.html").read_text("utf-8")
    assert "too few to tell" in html and "<strong>close to the job" not in html
