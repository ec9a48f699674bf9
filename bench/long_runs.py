"""Bench rows for long runs and many servers (issue 16): an outage, two endpoints, --final.

- outage: items/s before and after the mock is killed and started again on the same port
  OUTAGE_S later; items failed must be 0.
- endpoints: two mocks of 4 slots each, c=4 per endpoint, against one mock at c=4 (target ≥ 1.9×).
- final: ``calibrate export`` over a journal of 1,000,000 lines where 10 % of the ids were
  retried (a failed line, later an ok one): time and peak RSS, next to what the id set costs.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.io.jsonl import dumps_line
from calibrate.stages.batch.sending.lanes import make_lane
from calibrate.stages.batch.sending.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.stage import BatchSpec, plan_batch, run_batch
from calibrate.state.setting import Endpoint
from tests.mockserver import start_mock_process

PARAMS = SamplingParams(temperature=0.0, max_tokens=64, top_p=1.0, seed=0)
MODEL = "internlm-s2"


def _tasks(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            handle.write(f'{{"id":"t{i:07d}","text":"定长数组的长度在编译时确定。"}}\n')
    return path


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def outage(work: Path, outage_s: float, items: int) -> dict[str, float]:
    """Kill the mock after a third of the items; start it again ``outage_s`` later."""
    mock_args = ("--ttft", "0.05", "--per-token", "0", "--slots", "8")
    tasks, out = _tasks(work / "outage-tasks.jsonl", items), work / "outage-out.jsonl"
    mock = start_mock_process(*mock_args)
    port, revived = mock.port, []
    samples: list[tuple[float, int]] = []
    killed_at = [0.0]
    done = threading.Event()

    def sample_and_break() -> None:
        start = time.perf_counter()
        while not done.is_set():
            samples.append((time.perf_counter() - start, _lines(out)))
            if not killed_at[0] and samples[-1][1] >= items // 3:
                mock.stop(signal.SIGKILL)
                killed_at[0] = samples[-1][0]
                time.sleep(outage_s)
                revived.append(start_mock_process("--port", str(port), *mock_args))
            time.sleep(0.05)

    spec = BatchSpec(input_path=tasks, out_path=out, model=MODEL, params=PARAMS, concurrency=8)
    client = OpenAIClient(mock.base_url, timeout_s=60, max_connections=8)
    events: list[OutageEvent] = []
    thread = threading.Thread(target=sample_and_break, daemon=True)
    thread.start()
    try:
        result = run_batch(
            plan_batch(spec),
            client,
            out,
            progress_every_s=3600,
            outage=OutagePolicy(limit_s=outage_s * 4),
            events=events,
        )
    finally:
        done.set()
        thread.join()
        client.close()
        mock.stop()
        for server in revived:
            server.stop()
    at_kill = next(n for t, n in samples if t >= killed_at[0])
    back = next((t, n) for t, n in samples if t > killed_at[0] and n > at_kill)
    down_s = next((e.down_s for e in events if e.event == "up"), float("nan"))
    return {
        "items": items,
        "outage_s": outage_s,
        "failed": result.failed,
        "ok": result.ok,
        "before_items_per_s": at_kill / killed_at[0],
        "after_items_per_s": (result.ok - back[1]) / (result.seconds - back[0]),
        "down_s": down_s,
        "total_s": result.seconds,
    }


def _endpoints_run(work: Path, urls: list[str], items: int, name: str) -> float:
    tasks, out = _tasks(work / f"{name}-tasks.jsonl", items), work / f"{name}-out.jsonl"
    spec = BatchSpec(
        input_path=tasks, out_path=out, model=MODEL, params=PARAMS, concurrency=4 * len(urls)
    )
    clients = [OpenAIClient(url, timeout_s=60, max_connections=4) for url in urls]
    lanes = [
        make_lane(Endpoint(url, 4, "bench"), c, OutagePolicy())
        for url, c in zip(urls, clients, strict=True)
    ]
    try:
        result = run_batch(plan_batch(spec), None, out, lanes=lanes, progress_every_s=3600)
    finally:
        for client in clients:
            client.close()
    if result.failed:
        print(f"  ({name}: {result.failed} failed)", file=sys.stderr)
    return result.items_per_s


def endpoints(work: Path, items: int) -> dict[str, float]:
    mock_args = ("--ttft", "0.1", "--per-token", "0", "--slots", "4")
    with start_mock_process(*mock_args) as a, start_mock_process(*mock_args) as b:
        one = _endpoints_run(work, [a.base_url], items, "one")
        two = _endpoints_run(work, [a.base_url, b.base_url], items, "two")
    return {"items": items, "one_items_per_s": one, "two_items_per_s": two, "ratio": two / one}


def final(work: Path, lines: int, rss: Any, id_set_mib: Any) -> dict[str, float]:
    """A journal of ``lines`` lines, 10 % of its ids retried; ``calibrate export`` over it."""
    ids = lines * 9 // 10
    retried = len(range(0, ids, 9))
    tasks = _tasks(work / "final-tasks.jsonl", ids)
    journal = work / "final-out.jsonl"
    output = "定长数组是一种长度固定的数据结构，元素类型相同，在内存中连续存放，按下标访问。"
    ok = {
        "ok": True,
        "output": output,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 30, "completion_tokens": 40, "total_tokens": 70},
        "seconds": 0.4123,
        "attempts": 1,
    }
    bad = {
        "ok": False,
        "error": {"kind": "timeout", "message": "no answer", "status": None},
        "attempts": 4,
    }
    with journal.open("w", encoding="utf-8") as handle:
        for i in range(ids):  # every 9th id failed the first time …
            record = bad if i % 9 == 0 else ok
            handle.write(dumps_line({"id": f"t{i:07d}", **record}) + "\n")
        for i in range(0, ids, 9):  # … and was done by the rerun
            handle.write(dumps_line({"id": f"t{i:07d}", **ok}) + "\n")
    written = _lines(journal)
    started = time.perf_counter()
    peak = rss(
        ["export", "--input", str(tasks), "--out", str(journal), "--to", str(work / "final.jsonl")],
        work,
    )
    elapsed = time.perf_counter() - started
    final_lines = _lines(work / "final.jsonl")
    size_mib = journal.stat().st_size / 2**20
    for path in (journal, work / "final.jsonl", tasks):
        path.unlink()
    return {
        "journal_lines": written,
        "ids": ids,
        "retried_ids": retried,
        "journal_mib": size_mib,
        "seconds": elapsed,
        "peak_rss_mib": peak,
        "id_set_mib": id_set_mib(ids),
        "final_lines": final_lines,
    }


def table(rows: dict[str, dict[str, float]]) -> str:
    out: list[str] = []
    if o := rows.get("outage"):
        out.append(
            f"outage ({o['outage_s']:g} s, mock killed and restarted on its port, c=8): "
            f"{o['before_items_per_s']:.1f} items/s before, {o['after_items_per_s']:.1f} "
            f"after; down {o['down_s']:.1f} s; {o['ok']:.0f} ok, {o['failed']:.0f} failed "
            "(target 0)"
        )
    if e := rows.get("endpoints"):
        out.append(
            f"two endpoints (4 slots each, c=4 each, {e['items']:.0f} items): "
            f"{e['two_items_per_s']:.1f} items/s vs one {e['one_items_per_s']:.1f} "
            f"→ {e['ratio']:.2f}× (target ≥ 1.9)"
        )
    if f := rows.get("final"):
        out.append(
            f"export/--final over {f['journal_lines']:,.0f} journal lines "
            f"({f['journal_mib']:.0f} MiB, {f['ids']:,.0f} ids, {f['retried_ids']:,.0f} "
            f"retried): {f['seconds']:.1f} s, peak RSS {f['peak_rss_mib']:.0f} MiB "
            f"(the id set alone ≈ {f['id_set_mib']:.0f} MiB); {f['final_lines']:,.0f} "
            "final lines"
        )
    return "\n".join(out)
