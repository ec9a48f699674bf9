"""One batch across several servers: per-endpoint slots, a dead one benched, other weights refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.config import Overrides, load
from tests.batch_helpers import assert_valid_jsonl, write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock

FAST = {"ttft_s": 0.005, "per_token_s": 0.0002, "slots": 4}
DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there


def _baseline(cli, isolated: Path, base_url: str) -> None:
    write_config(isolated / "calibrate.toml", base_url)
    assert cli("single").code == 0
    assert (isolated / "baselines/single.jsonl").exists()


def test_two_endpoints_share_the_items_and_report_each(cli, isolated: Path) -> None:
    with start_mock(**FAST) as a, start_mock(**FAST) as b:
        _baseline(cli, isolated, a.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 60)
        out = isolated / "out.jsonl"
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "--base-url",
            a.base_url,
            "--base-url",
            f"{b.base_url}#c=2",
            "-c",
            "3",
            "--json",
        )
    assert result.code == 0, result.err
    assert len(assert_valid_jsonl(out)) == 60
    summary = result.json
    by_url = {e["url"]: e for e in summary["endpoints"]}
    assert by_url[a.base_url]["concurrency"] == 3 and by_url[b.base_url]["concurrency"] == 2
    assert by_url[a.base_url]["done"] > 0 and by_url[b.base_url]["done"] > 0
    assert by_url[a.base_url]["done"] + by_url[b.base_url]["done"] == 60
    assert all(e["items_per_s"] > 0 for e in summary["endpoints"])
    assert summary["endpoint_check"]["usable"] == [a.base_url, b.base_url]
    assert "fixed prompt matches the baseline" in result.err
    assert f"{b.base_url}: " in result.err and "items/s (c=2)" in result.err


def test_a_dead_endpoint_is_benched_and_the_other_does_every_item(cli, isolated: Path) -> None:
    with start_mock(**FAST) as a:
        _baseline(cli, isolated, a.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 30)
        out = isolated / "out.jsonl"
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "--base-url",
            DEAD,
            "--base-url",
            a.base_url,
            "-c",
            "4",
            "--json",
        )
    assert result.code == 0, result.err
    assert all(r["ok"] for r in assert_valid_jsonl(out)) and result.json["done"] == 30
    assert f"{DEAD}: benched" in result.err
    assert [e["url"] for e in result.json["endpoints"]] == [a.base_url]
    assert result.json["concurrency"] == 4  # the benched one's 4 slots never ran
    # the plan line, said before the check, counted 8; the text says what ran, as --json does
    assert "(concurrency 8 from" in result.err
    assert "concurrency 4 on the endpoint(s) that answered (4 benched slot(s) unused)" in result.err


def test_an_endpoint_with_other_weights_is_refused_by_name(cli, isolated: Path) -> None:
    with start_mock(**FAST) as a, start_mock(**FAST, text_seed=7) as other:
        _baseline(cli, isolated, a.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 20)
        out = isolated / "out.jsonl"
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "--base-url",
            a.base_url,
            "--base-url",
            other.base_url,
        )
        sent_a, sent_other = (
            a.model.snapshot().requests_total,
            other.model.snapshot().requests_total,
        )
    assert result.code == 1, result.err
    assert f"endpoint(s) {other.base_url} answer the fixed prompt differently" in result.err
    assert a.base_url not in result.err.split("answer the fixed prompt differently")[0][-80:]
    assert not out.exists(), "nothing was dispatched: no empty --out is left behind"
    assert sent_other == 1 and sent_a == 2, "only the fixed prompt: single's, then the check's"


@pytest.mark.parametrize("existing", [False, True])
def test_a_batch_refused_before_any_item_leaves_no_out_it_created(
    cli, isolated: Path, existing: bool
) -> None:
    """No server answers: exit 4, and the --out this run would have created is not left behind
    empty (a file the user already had stays, as it was)."""
    write_config(isolated / "calibrate.toml", DEAD)
    tasks = write_tasks(isolated / "tasks.jsonl", 5)
    out = isolated / "out.jsonl"
    if existing:
        out.write_bytes(b"")
    result = cli("batch", "--input", str(tasks), "--out", str(out), "--base-url", DEAD)
    assert result.code == 4, result.err
    assert out.exists() == existing and (not existing or out.read_bytes() == b"")
    assert not (isolated / "out.jsonl.lock").exists()


def test_without_a_baseline_several_endpoints_warn_and_run(cli, isolated: Path) -> None:
    with start_mock(**FAST) as a, start_mock(**FAST) as b:
        write_config(isolated / "calibrate.toml", a.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 10)
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(isolated / "out.jsonl"),
            "--base-url",
            a.base_url,
            "--base-url",
            b.base_url,
        )
    assert result.code == 0, result.err
    assert "no baseline" in result.err


def test_base_urls_in_the_config_are_the_endpoints(cli, isolated: Path) -> None:
    with start_mock(**FAST) as a, start_mock(**FAST) as b:
        write_config(
            isolated / "calibrate.toml",
            a.base_url,
            f'base_urls = ["{a.base_url}#c=2", "{b.base_url}#c=1"]\n',
        )
        tasks = write_tasks(isolated / "tasks.jsonl", 10)
        result = cli("batch", "--input", str(tasks), "--out", str(isolated / "out.jsonl"), "--json")
    assert result.code == 0, result.err
    assert [(e["url"], e["concurrency"]) for e in result.json["endpoints"]] == [
        (a.base_url, 2),
        (b.base_url, 1),
    ]


@pytest.mark.parametrize(
    "entry, message",
    [
        ("http://h:8000/v1#x=1", "only c=N"),
        ("http://h:8000/v1#c=0", "c must be in"),
        ("ftp://h/v1", "not an http(s) URL"),
    ],
)
def test_bad_base_urls_are_config_errors(cli, isolated: Path, entry: str, message: str) -> None:
    path = write_config(
        isolated / "calibrate.toml", "http://127.0.0.1:8000/v1", f'base_urls = ["{entry}"]\n'
    )
    tasks = write_tasks(isolated / "tasks.jsonl", 2)
    result = cli("batch", "--config", str(path), "--input", str(tasks), "--out", "o.jsonl")
    assert result.code == 2 and message in result.err, result.err
    assert not (isolated / "o.jsonl").exists()


def test_one_base_url_from_the_environment_replaces_the_list(isolated: Path) -> None:
    path = write_config(
        isolated / "calibrate.toml",
        "http://a:1/v1",
        'base_urls = ["http://b:2/v1", "http://c:3/v1#c=4"]\n',
    )
    cfg = load(Overrides(config_path=str(path)), {})
    assert cfg.target.base_url == "http://b:2/v1" and len(cfg.target.base_urls) == 2
    env = load(Overrides(config_path=str(path)), {"CALIBRATE_BASE_URL": "http://d:4"})
    assert env.target.base_url == "http://d:4/v1" and env.target.base_urls == ()
    assert json.dumps(cfg.to_public_json())  # the list is shown (redacted) too
