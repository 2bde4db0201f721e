"""Every method on the embedded world for the same wall-clock budget: time to reward, side by side.

    python bench/methods.py                               # 12 methods x seeds 0 1 2, 4 minutes each, 2 at a time
    python bench/methods.py --minutes 1 --seeds 0 --methods branch-mix dance-grpo    # a quick look
    python bench/methods.py --report-only                 # the table and plots again, from the runs on disk
    python bench/methods.py --seeds 0 --work runs/bench-methods-rerun --name methods-rerun \
        --against bench/results/methods.json              # a second run, checked against the first one's spread

Each run is `treegrpo train --preset M --seed S` with the world's defaults (16 prompts of shapes-train an
iteration, lr 1e-4 or the rate a preset's [for_model.tiny-shapes] table names: 3e-5 for `branch` and `tree-grpo`,
the best of bench/study.py's sweep; presets keep the papers' tree shapes), one CPU thread,
`train.max_minutes` as the budget and a held-out evaluation (56 test prompts x 4 ODE samples, the same
noises every time) every eighth of it; the training clock excludes those evaluations. Runs go in a
round-robin order (seed by seed, the method order rotated each seed) on `--parallel` workers, so
machine noise is shared between methods. An interrupted benchmark picks up where it stopped: finished
runs are kept, unfinished ones resumed.

Then `treegrpo compare` over all runs, with dance-grpo as the baseline (target: its mean final held-out
gain over each run's first held-out evaluation), with the weights `eval` uses (the EMA where a preset keeps
one) and with the trained ones: bench/results/methods.json (machine, torch, commit, every run's summary,
compare's numbers as `compare` and `compare_raw`), and the full pages with plots and sample grids under the work
folder (runs/bench-methods/compare[-raw]/index.html). `python bench/results_page.py` puts the table and a plot
in docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

METHODS = [
    "dance-grpo",
    "flow-grpo",
    "mix-grpo",
    "branch",
    "branch-widpru",
    "branch-deppru",
    "branch-mix",
    "branch-mix-flow",
    "tree-grpo",
    "treepo",
    "nft",
    "tree-nft",
]
TREEGRPO = [sys.executable, "-m", "treegrpo_cli"]
RESULTS = Path("bench/results")


def schedule(methods: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """Seed by seed, the method order rotated by one each seed (no method always first or last)."""
    return [(methods[(i + k) % len(methods)], s) for k, s in enumerate(seeds) for i in range(len(methods))]


def train_args(method: str, seed: int, run: Path, minutes: float) -> list[str]:
    budget = {"train.max_minutes": minutes, "train.eval_every_minutes": minutes / 8}
    return train_command(method, seed, run, [f"{k}={v}" for k, v in budget.items()])


def train_command(preset: str, seed: int, run: Path, sets: list[str]) -> list[str]:
    """`treegrpo train` for one benchmark run with its budget's --sets, or its resumption when begun."""
    if (run / "run.json").exists():
        return ["train", "--resume", str(run), "--json"]
    quiet = ["train.iterations=100000", "train.sample_every=100000", "train.save_every=10"]
    args = ["train", "--preset", preset, "--seed", str(seed), "--run-dir", str(run), "--json"]
    return args + [a for s in quiet + sets for a in ("--set", s)]


def run_one(method: str, seed: int, work: Path, minutes: float, log) -> dict:
    run = work / f"{method}-seed{seed}"
    done = run / "summary.json"
    if done.exists():
        return json.loads(done.read_text())
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    out = subprocess.run(TREEGRPO + train_args(method, seed, run, minutes), env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{method} seed {seed} failed: {out.stderr.strip().splitlines()[-1:]}")
    row = {
        "method": method,
        "seed": seed,
        "run_dir": str(run),
        "commit": commit(),
        "process_minutes": (time.perf_counter() - t0) / 60,
        "loadavg_1m": [load0, os.getloadavg()[0]],  # the budget is wall-clock: other work slows a run
        "summary": json.loads(out.stdout),
    }
    done.write_text(json.dumps(row, indent=1) + "\n")
    sm, nan = row["summary"], float("nan")
    log(
        f"{method} seed {seed}: {sm['iterations']} iterations, held-out "
        f"{sm.get('heldout_before', nan):.3f} -> {sm.get('heldout_after', nan):.3f}"
    )
    return row


def machine() -> dict:
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else ""
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads_per_run": 1,
    }


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


def report(rows: list[dict], work: Path, args: argparse.Namespace) -> dict:
    """treegrpo compare over the runs (gain over each run's own base: the methods' samplers start the base
    model at slightly different rewards) -> the results file; once with the weights `eval` uses (the EMA where a
    preset keeps one) and once with the trained ones (`compare_raw`); the compare pages under the work folder."""
    from treegrpo_cli.report.compare import compare_runs, to_dict
    from treegrpo_cli.report.compare_page import write_report

    compared = {}
    for raw in (False, True):
        out = work / ("compare-raw" if raw else "compare")
        cmp = compare_runs([Path(r["run_dir"]) for r in rows], baseline="dance-grpo", gain=True, raw=raw)
        write_report(cmp, out)
        compared["compare_raw" if raw else "compare"] = to_dict(cmp)
    result = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": commit(),
        "machine": machine(),
        "minutes_per_run": args.minutes,
        "seeds": args.seeds,
        "methods": args.methods,
        "command": " ".join(["python bench/methods.py", *(a for a in sys.argv[1:] if a != "--report-only")]),
        "runs": rows,
        **compared,
    }
    if args.against:
        ref = json.loads(args.against.read_text())["compare"]
        result["against"] = against(compared["compare"], ref, str(args.against))
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def against(new: dict, ref: dict, name: str) -> dict:
    """This run checked against a reference run's reported spread: each method's held-out gain (mean over seeds)
    within the reference's mean +- 2 std over seeds (its range over seeds beside it), and its speed-up over the
    baseline within the reference's 95% interval over seeds drawn again (never reaching the target is a
    speed-up of 0). `lands`: every method passes both."""
    ref_runs: dict[str, list[float]] = {}
    for r in ref["runs"]:
        ref_runs.setdefault(r["label"], []).append(r["gain"])
    ref_groups = {g["label"]: g for g in ref["groups"]}
    out: dict[str, Any] = {"reference": name, "methods": {}, "speedups": {}}
    for g in new["groups"]:
        if g["label"] in ref_groups and g["label"] != new["baseline"]:
            out["speedups"][g["label"]] = speedup_check(g, ref_groups[g["label"]])
        gains, mean = ref_runs.get(g["label"], []), g["gain"]["mean"]
        if not gains or mean is None:
            continue
        m = sum(gains) / len(gains)
        sd = (sum((x - m) ** 2 for x in gains) / (len(gains) - 1)) ** 0.5 if len(gains) > 1 else 0.0
        out["methods"][g["label"]] = {
            "gain": mean,
            "reference_mean": m,
            "reference_std": sd,
            "reference_min": min(gains),
            "reference_max": max(gains),
            "within_range": min(gains) <= mean <= max(gains),
            "within_2_std": abs(mean - m) <= 2 * sd,
        }
    out["lands"] = all(c["within_2_std"] for c in out["methods"].values()) and all(
        c["within_interval"] for c in out["speedups"].values()
    )
    return out


def speedup_check(g: dict, ref: dict) -> dict:
    """A speed-up (0 when the mean curve never reaches the target) lands in the reference's spread when it lies
    within its 95% interval; with no interval there (no draw had a ratio), when neither reaches the target."""
    lo, hi = ref.get("speedup_low"), ref.get("speedup_high")
    speedup = g.get("speedup") or 0.0
    if lo is not None:
        assert hi is not None  # compare gives the interval's two ends together
        within = lo <= speedup <= hi
    else:
        within = g.get("speedup") is None and ref.get("speedup") is None
    return {
        "speedup": g.get("speedup"),
        "reference_speedup": ref.get("speedup"),
        "reference_low": lo,
        "reference_high": hi,
        "within_interval": within,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--minutes", type=float, default=4.0, help="training minutes per run (held-out evaluations excluded)"
    )
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (one CPU thread each)")
    ap.add_argument("--work", type=Path, default=Path("runs/bench-methods"))
    ap.add_argument("--name", default="methods", help="results file name: bench/results/NAME.json")
    ap.add_argument("--report-only", action="store_true", help="no training: report the runs already finished")
    ap.add_argument(
        "--against",
        type=Path,
        default=None,
        help="an earlier results file: do this run's gains and speed-ups land within its spread?",
    )
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(time.strftime("%H:%M:%S"), msg, flush=True)

    jobs = schedule(args.methods, args.seeds)

    def run_job(job: tuple[str, int]) -> dict:
        return run_one(*job, args.work, args.minutes, log)

    if args.report_only:
        done = [args.work / f"{m}-seed{s}" / "summary.json" for m, s in jobs]
        rows = [json.loads(p.read_text()) for p in done if p.exists()]
    else:
        with ThreadPoolExecutor(args.parallel) as pool:
            rows = list(pool.map(run_job, jobs))
    report(rows, args.work, args)
    log(
        f"wrote bench/results/{args.name}.json and bench/results/{args.name}/ ({len(rows)} runs); "
        f"the page with sample grids: {args.work / 'compare' / 'index.html'}"
    )


if __name__ == "__main__":
    main()
