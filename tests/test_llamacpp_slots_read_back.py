"""A managed llama.cpp's slots: what its ``/props`` says, not only the ``--parallel`` it was given.

Some llama.cpp builds run another slot count than ``--parallel`` asked (``--parallel 1`` became 4
slots, with a unified KV cache each slot may use the whole context). verify said "the server's
cap is 1 (the managed llama.cpp parallel, …), the verified batch" from the flag calibrate passed,
while the server's own ``/props`` said ``total_slots: 4``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import free_port, managed_config, mock_command, passing_ladder

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def _script(root: Path, port: int, batch: int, slots: int) -> Path:
    """A pinned llama.cpp script whose server runs ``slots`` slots whatever it was given."""
    command = mock_command("--expose-props").replace("{port}", str(port))
    script = root / "scripts/launch.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        "#!/usr/bin/env bash\n# kind: llamacpp\nset -euo pipefail\n"
        f"export PORT={port}\nexport BATCH_SIZE={batch}\nexport MAX_CONCURRENCY={batch}\n"
        f"exec {command.replace('{concurrency}', str(slots))}\n",
        encoding="utf-8",
    )
    return script


@pytest.mark.parametrize(("slots", "passed"), [(4, False), (1, True)])
def test_verify_reads_a_managed_llamacpps_slots_back_from_props(
    cli, isolated: Path, slots: int, passed: bool
) -> None:
    port = free_port()
    managed_config(isolated, port, mock_command())
    script = _script(isolated, port, 1, slots)
    started = cli("server", "start", "--script", str(script))
    assert started.code == 0, started.err
    try:
        single = cli("single", "--json")
        assert single.code == 0, single.err
        passing_ladder(isolated, single.json["record"]["target"], batch_size=1)
        result = cli("verify", "--json")
    finally:
        assert cli("server", "stop").code == 0
    said = " ".join(result.err.split())
    assert (result.code == 0) is passed, said
    assert result.json["server_cap"]["source"] == "llama.cpp /props total_slots"
    if passed:
        assert "the server's cap is 1 (llama.cpp /props total_slots), the verified batch" in said
    else:
        assert "the server runs at cap 4 (llama.cpp /props total_slots), not the verified" in said
