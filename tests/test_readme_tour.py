"""The README's tour, run as written (the mock on a free port instead of 8000): it ends clean —
every command exits 0 and the batch, the job itself, warns of nothing (it used to end on "warning:
2 items exceed 20 tokens … run calibrate ladder --tasks tasks.jsonl": the ladder had measured the
fixed prompt, not the job's items)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.helpers import REPO, said
from tests.mockserver import start_mock

TOUR_MOCK = {"slots": 4, "oom_at": 6}  # the tour's `calibrate mock --slots 4 --oom-at 6`


def _tour() -> str:
    """The README's second bash block of the tour: the config, then the commands."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tour = readme.split("## A five-minute tour on a laptop", 1)[1]
    blocks = re.findall(r"```bash\n(.*?)```", tour, re.DOTALL)
    script = next(b for b in blocks if "cat > calibrate.toml" in b)
    assert "calibrate run " in script, "the tour leads with calibrate run"
    return script


def test_the_readme_tour_runs_as_written_and_ends_clean(isolated: Path) -> None:
    script = _tour()
    assert "127.0.0.1:8000" in script
    with start_mock(ttft_s=0.05, per_token_s=0.004, **TOUR_MOCK) as mock:
        body = script.replace("source .venv/bin/activate\n", "").replace(
            "127.0.0.1:8000", f"127.0.0.1:{mock.port}"
        )
        env = {**os.environ, "PATH": f"{REPO / '.venv/bin'}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body],
            cwd=isolated,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    err = said(done.stderr)
    assert done.returncode == 0, err
    assert "calibrate run passed: single, repro, ladder, sweep, pin" in err, err
    assert "launch script: scripts/launch.sh (vllm)" in err and "config consistent" in err
    lines = err.splitlines()
    batch = lines[next(n for n, ln in enumerate(lines) if ln.startswith("batch: 2 total")) :]
    assert [ln for ln in batch if ln.startswith("warning:")] == [], err  # the job: no warning
    assert batch[-1].startswith("all 2 items ok: out.jsonl"), err
