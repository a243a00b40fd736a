"""After `make test`: every package module's line coverage, from the .coverage file the run left; fails (exit 1)
naming each module below the floor (default 60 %).  Usage: python scripts/coverage_floor.py [FLOOR]"""

from __future__ import annotations

import sys
from pathlib import Path

import coverage


def main(floor: float) -> int:
    cov = coverage.Coverage(data_file=str(Path(".coverage")))
    cov.load()
    low = []
    root = Path(__file__).resolve().parents[1] / "src" / "tiergate"
    for file in sorted(root.rglob("*.py")):      # modules no test imported count too (0 %)
        path = str(file)
        _, statements, _, missing, _ = cov.analysis2(path)
        if statements:
            pct = 100.0 * (len(statements) - len(missing)) / len(statements)
            if pct < floor:
                low.append((pct, path.split("/src/", 1)[1]))
    if low:
        for pct, name in sorted(low):
            print(f"coverage floor: {name} {pct:.0f}% < {floor:.0f}%")
        return 1
    print(f"coverage floor: every measured module of src/tiergate is at {floor:.0f}% or more")
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))
