"""How long the CLI takes to start: `treegrpo --help` and `treegrpo train --help` against `python -c pass`.

    python bench/startup.py [--repeat 10]

Median wall time of each over --repeat runs (after one warm-up run); writes bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "treegrpo --help": [sys.executable, "-m", "treegrpo_cli", "--help"],
    "treegrpo train --help": [sys.executable, "-m", "treegrpo_cli", "train", "--help"],
}


def median_seconds(cmd: list[str], repeat: int) -> float:
    subprocess.run(cmd, capture_output=True, check=True)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("bench/results/startup.json"))
    args = ap.parse_args()
    result = {name: median_seconds(cmd, args.repeat) for name, cmd in CASES.items()}
    for name, s in result.items():
        print(f"{name:24s} {s:.3f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"repeat": args.repeat, "median_seconds": result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
