"""A batch sending to several servers holds each one's target lock (shared): a ladder measuring
the second server is never run beside it, nor the batch beside that ladder (SPEC §11)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate import config
from calibrate.state.ledger import target_fingerprint
from calibrate.state.target_lock import hold
from tests.batch_helpers import write_tasks
from tests.mockserver import start_mock
from tests.tier_helpers import open_gate

OTHER = "http://192.0.2.77:9/v1"  # another host: another target (never contacted here)


def test_a_batch_is_refused_while_a_ladder_measures_its_second_endpoint(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url)
        cfg = config.load(config.Overrides(config_path=str(isolated / "calibrate.toml")), {})
        other = target_fingerprint(replace(cfg, target=replace(cfg.target, base_url=OTHER)))
        tasks = write_tasks(isolated / "tasks.jsonl", 4)
        with hold(isolated / "runs", other, "ladder"):  # a ladder measuring the other server
            refused = cli(
                "batch",
                "--base-url",
                f"{mock.base_url}#c=1",
                "--base-url",
                f"{OTHER}#c=1",
                "--input",
                str(tasks),
                "--out",
                "out.jsonl",
            )
        sent = mock.model.snapshot().requests_total
    assert refused.code == 2, refused.err
    assert "a ladder (PID" in refused.err and f"({other})" in refused.err, refused.err
    assert sent == 0, "the batch sent nothing"
