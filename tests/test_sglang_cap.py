"""SGLang's cap: read from its ``GET /get_server_info``, and "not known" when it names none.

SGLang's /get_server_info is its launch arguments: ``max_running_requests`` is null unless it was
started with ``--max-running-requests``. calibrate said "the server's cap could not be read (no
/props, no server info, …)" against it — the server info was there — and never what to pass to
make the cap known; the ladder and the sweep said nothing at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.stages.prepare.server_cap import read_cap_account
from tests.fakes import passing_ladder
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")
MOCK = {"ttft_s": 0.002, "per_token_s": 0.0005, "slots": 4, "metrics_style": "sglang"}
UNSET = (
    "the server's cap is not known (GET /get_server_info has no max_running_requests: SGLang "
    "names its cap there only when started with --max-running-requests N)"
)


def test_verify_against_sglang_without_its_cap_flag_says_not_known_and_what_to_pass(
    cli, isolated: Path
) -> None:
    with start_mock(**MOCK) as mock:
        target = open_gate(isolated, mock.base_url, FAST)
        assert cli("single").code == 0
        passing_ladder(isolated, target, batch_size=4)
        result = cli("verify", "--json")
    said = " ".join(result.err.split())
    assert result.code == 0, result.err
    assert UNSET in said, said
    assert "config consistent at batch" not in said and "no server info" not in said
    assert result.json["server_cap"] is None


def test_verify_against_sglang_started_with_its_cap_flag_reads_it(cli, isolated: Path) -> None:
    with start_mock(**MOCK, max_running_requests=4) as mock:
        target = open_gate(isolated, mock.base_url, FAST)
        assert cli("single").code == 0
        passing_ladder(isolated, target, batch_size=4)
        result = cli("verify", "--json")
    said = " ".join(result.err.split())
    assert result.code == 0, result.err
    assert "the server's cap is 4 (SGLang max_running_requests), the verified batch" in said
    assert result.json["server_cap"]["slots"] == 4


def test_the_ladder_says_sglangs_cap_is_not_known(cli, isolated: Path) -> None:
    ladder = FAST.replace("[ladder]\n", "[ladder]\nbatch_sizes = [1, 2]\nrounds = 1\n")
    with start_mock(**MOCK) as mock:
        open_gate(isolated, mock.base_url, ladder)
        result = cli("ladder", "--no-stream")
    assert result.code == 0, result.err
    assert "the server's own cap is not known (GET /get_server_info has no" in " ".join(
        result.err.split()
    )


@pytest.mark.parametrize("body", ['{"max_running_requests": null}', '{"version": "0.4.9"}'])
def test_an_answer_without_the_number_is_not_known_never_no_cap(body: str) -> None:
    account = read_cap_account(lambda path: body if path == "/get_server_info" else "")
    assert account.cap is None and "--max-running-requests N" in account.unknown
    none = read_cap_account(lambda path: "")
    assert none.cap is None and none.unknown == ""
