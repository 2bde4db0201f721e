"""Check restored raw study runs against the hash manifest the repository keeps of them.

    python bench/check_runs.py                    # runs/study-runs/ against bench/results/study-runs.tsv
    python bench/check_runs.py DIR [--manifest F]

The raw rows of the study's runs (each run's run.json, metrics.jsonl, eval.jsonl and summary.json) are not in the
repository's tip: bench/results/study-*.json.gz keep what every table is generated from, and study-runs.tsv the
path, sha256 and size of every raw file. To restore them from the commit before their removal:

    git checkout "$(git log --diff-filter=D -1 --format=%H -- bench/results/study-runs)^" -- bench/results/study-runs
    python bench/check_runs.py bench/results/study-runs

Exit 0 when every file of the manifest is there with its hash and size, 1 otherwise (one line per file that is not).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(folder: Path, manifest: Path) -> list[str]:
    """One line per manifest file that is missing under folder or differs in sha256 or size."""
    bad = []
    for line in manifest.read_text().splitlines()[1:]:
        path, sha, size = line.split("\t")
        f = folder / path
        if not f.is_file():
            bad.append(f"{path}: missing")
            continue
        data = f.read_bytes()
        if len(data) != int(size) or hashlib.sha256(data).hexdigest() != sha:
            bad.append(f"{path}: differs ({len(data)} bytes, manifest {size})")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, nargs="?", default=Path("runs/study-runs"))
    ap.add_argument("--manifest", type=Path, default=ROOT / "bench/results/study-runs.tsv")
    args = ap.parse_args()
    bad = check(args.folder, args.manifest)
    for line in bad:
        print(line)
    n = len(args.manifest.read_text().splitlines()) - 1
    print(f"{n - len(bad)} of {n} files match {args.manifest.name}", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
