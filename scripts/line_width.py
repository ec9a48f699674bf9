"""Pass stdin through to stdout, then fail (exit 1) when a line was wider than WIDTH columns.

`make demo` pipes its output through it: every line of the demo fits 100 columns (tables fit by
their columns, prose wraps). Widths are terminal cells (a CJK character is two); ANSI colour
codes count for nothing.

usage: bash scripts/demo.sh 2>&1 | python scripts/line_width.py 100
"""

from __future__ import annotations

import re
import sys

from rich.cells import cell_len

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def main(argv: list[str]) -> int:
    width = int(argv[1]) if len(argv) > 1 else 100
    wide: list[str] = []
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        shown = ANSI.sub("", line.rstrip("\n"))
        if cell_len(shown) > width:
            wide.append(shown)
    if wide:
        print(f"{len(wide)} lines wider than {width} columns:", file=sys.stderr)
        for line in wide:
            print(f"  ({cell_len(line)}) {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
