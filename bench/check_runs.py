"""Check restored raw study runs against the hash manifest the repository keeps of them.

    python bench/check_runs.py                    # runs/study-runs/ against bench/results/study-runs.tsv
    python bench/check_runs.py DIR [--manifest F]
    python bench/check_runs.py --only study-adaptive  # the files of one study only
    python bench/check_runs.py --add study-adaptive   # list runs/study-runs/study-adaptive/'s files not yet listed

The raw rows of the study's runs (each run's run.json, metrics.jsonl, eval.jsonl and summary.json) are not in the
repository's tip: bench/results/study-*.json.gz keep what every table is generated from, and study-runs.tsv the
path, sha256 and size of every raw file. To restore them from the commit before their removal:

    git checkout "$(git log --diff-filter=D -1 --format=%H -- bench/results/study-runs)^" -- bench/results/study-runs
    python bench/check_runs.py bench/results/study-runs

(the same with runs/study-runs for the studies whose raw runs were kept there). Every raw file a committed summary
names (its `raw_files`) must be in the manifest with the same hash: tests/bench/test_study.py checks it.

Exit 0 when every file of the manifest is there with its hash and size, 1 otherwise (one line per file that is not).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prefix(only: str) -> str:
    """The manifest paths' prefix of one study folder ('' for all)."""
    return only.rstrip("/") + "/" if only else ""


def read(manifest: Path) -> dict[str, tuple[str, int]]:
    """The manifest: path -> (sha256, size in bytes)."""
    rows = (line.split("\t") for line in manifest.read_text().splitlines()[1:])
    return {path: (sha, int(size)) for path, sha, size in rows}


def check(folder: Path, manifest: Path, only: str = "") -> list[str]:
    """One line per manifest file (under `only`/ when given) that is missing under folder or differs in sha256 or
    size."""
    bad = []
    for path, (sha, size) in read(manifest).items():
        if not path.startswith(prefix(only)):
            continue
        f = folder / path
        if not f.is_file():
            bad.append(f"{path}: missing")
            continue
        data = f.read_bytes()
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            bad.append(f"{path}: differs ({len(data)} bytes, manifest {size})")
    return bad


def unlisted(folder: Path, manifest: Path, sub: str) -> list[str]:
    """Manifest lines (path, sha256, size) for the files under folder/sub that the manifest does not list yet."""
    listed = read(manifest)
    lines = []
    for f in sorted(p for p in (folder / sub).rglob("*") if p.is_file()):
        path = f.relative_to(folder).as_posix()
        if path not in listed:
            data = f.read_bytes()
            lines.append(f"{path}\t{hashlib.sha256(data).hexdigest()}\t{len(data)}")
    return lines


def summary_gaps(results: Path, manifest: Path) -> list[str]:
    """One line per raw file named by a committed summary (bench/results/study-*.json.gz, each run's `raw_files`)
    that the manifest lacks or lists with another hash or size."""
    listed, gaps = read(manifest), []
    for f in sorted(results.glob("study-*.json.gz")):
        for run in json.loads(gzip.decompress(f.read_bytes())).get("runs", []):
            base = run["run_dir"].split("study-runs/", 1)[1]
            for name, h in (run.get("raw_files") or {}).items():
                if listed.get(f"{base}/{name}") != (h["sha256"], h["bytes"]):
                    gaps.append(f"{f.name}: {base}/{name}")
    return gaps


def add(folder: Path, manifest: Path, sub: str) -> int:
    """Append the unlisted files under folder/sub to the manifest (a temporary file renamed over it)."""
    lines = unlisted(folder, manifest, sub)
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(manifest.read_text() + "".join(line + "\n" for line in lines))
    tmp.replace(manifest)
    return len(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, nargs="?", default=Path("runs/study-runs"))
    ap.add_argument("--manifest", type=Path, default=ROOT / "bench/results/study-runs.tsv")
    ap.add_argument("--only", metavar="SUB", default="", help="check only the manifest's files under SUB/")
    ap.add_argument("--add", metavar="SUB", help="append FOLDER/SUB's unlisted files to the manifest")
    args = ap.parse_args()
    if args.add:
        if not (args.folder / args.add).is_dir():
            sys.exit(f"error: no folder {args.folder / args.add}")
        print(f"listed {add(args.folder, args.manifest, args.add)} more files of {args.add}", file=sys.stderr)
        return
    bad = check(args.folder, args.manifest, args.only)
    for line in bad:
        print(line)
    n = sum(path.startswith(prefix(args.only)) for path in read(args.manifest))
    print(f"{n - len(bad)} of {n} files match {args.manifest.name}", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
