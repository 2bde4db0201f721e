"""Does `treegrpo train` align the embedded world? Timed runs, then held-out evaluation at two seeds.

    python bench/world_rl.py                                  # `treegrpo train` with no options, seeds 0 1 2
    python bench/world_rl.py --seeds 0 --preset dance-grpo    # a baseline on the same world and budget
    python bench/world_rl.py --seeds 0 --train-arg=--set --train-arg=train.lr=3e-4
    python bench/world_rl.py --run runs/tree-grpo-2026... --minutes 8.5 --name default-seed0   # evaluate a finished run
    python bench/world_rl.py --model tiny-shapes-video --seeds 0 --name video   # the moving-shapes world (48 x 8 clips)

For every seed: `treegrpo train [--preset P] --seed S --run-dir RUN [train args]`, timed by the wall
clock, then `treegrpo eval --checkpoint RUN --baseline tiny-shapes --prompts shapes-test --metric
shapes --num-images 8 --seed E --json` for every evaluation seed E (ODE samples, the same root
noises for the trained model and its baseline: a paired difference over 56 x 8 = 448 images).
Writes bench/results/world_rl-<name>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

TREEGRPO = [sys.executable, "-m", "treegrpo_cli"]


def train(seed: int, preset: str | None, run: Path, extra: list[str]) -> dict:
    cmd = [
        "train",
        *(["--preset", preset] if preset else []),
        "--seed",
        str(seed),
        "--run-dir",
        str(run),
        *extra,
        "--json",
    ]
    t0 = time.perf_counter()
    done = subprocess.run(TREEGRPO + cmd, check=True, capture_output=True, text=True)
    summary = json.loads(done.stdout)
    return {
        "command": "treegrpo " + " ".join(cmd[:-1]),
        "wall_minutes": (time.perf_counter() - t0) / 60,
        "summary": summary,
    }


WORLDS = {"tiny-shapes": ("shapes", "shapes-test"), "tiny-shapes-video": ("motion-shapes", "motion-test")}


def evaluate(run: Path, seed: int, num_images: int, model: str = "tiny-shapes") -> dict:
    metric, prompts = WORLDS[model]
    cmd = [
        "eval",
        "--checkpoint",
        str(run),
        "--baseline",
        model,
        "--prompts",
        prompts,
        "--metric",
        metric,
        "--num-images",
        str(num_images),
        "--seed",
        str(seed),
        "--json",
    ]
    out = json.loads(subprocess.run(TREEGRPO + cmd, check=True, capture_output=True, text=True).stdout)
    m = out["metrics"][metric]
    return {
        "command": "treegrpo " + " ".join(cmd[:-1]),
        "seed": seed,
        "trained": m["mean"],
        "baseline": m["baseline_mean"],
        "gain": m["delta"],
        "n": m["n"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=None, help="method preset (default: train's own default)")
    ap.add_argument("--model", choices=sorted(WORLDS), default="tiny-shapes", help="the embedded world")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval-seeds", type=int, nargs="+", default=[5, 6])
    ap.add_argument("--num-images", type=int, default=8)
    ap.add_argument("--train-arg", action="append", default=[], help="passed to treegrpo train (repeatable)")
    ap.add_argument("--work", type=Path, default=Path("runs/bench-world"))
    ap.add_argument("--name", default=None, help="results name (default: the preset, or 'default')")
    ap.add_argument("--run", type=Path, default=None, help="evaluate this finished `treegrpo train` run instead")
    ap.add_argument("--minutes", type=float, default=None, help="with --run: the wall-clock minutes of its command")
    args = ap.parse_args()
    if args.run and args.minutes is None:
        ap.error("--run needs --minutes (the wall clock of that train command)")
    name = args.name or args.preset or "default"
    out = Path("bench/results") / f"world_rl-{name}.json"
    runs = []
    for seed in [None] if args.run else args.seeds:
        if args.run:
            run, info = args.run, json.loads((args.run / "run.json").read_text())
            row = {"command": info["command"], "wall_minutes": args.minutes, "summary": _summary(run)}
            seed = info["config"]["seed"]
        else:
            assert seed is not None  # None stands for --run's own seed only; --seeds are ints
            run = args.work / f"{name}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
            row = train(seed, args.preset, run, ["--model", args.model, *args.train_arg])
        row["evals"] = [evaluate(run, e, args.num_images, args.model) for e in args.eval_seeds]
        row["seed"], row["run_dir"] = seed, str(run)
        runs.append(row)
        print(
            json.dumps({k: row[k] for k in ("seed", "wall_minutes")} | {"gains": [e["gain"] for e in row["evals"]]}),
            flush=True,
        )
        result = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cpus": torch.get_num_threads(),
            "commit": _commit(),
            "model": args.model,
            "preset": args.preset,
            "train_args": args.train_arg,
            "runs": runs,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")


def _summary(run: Path) -> dict:
    from treegrpo_cli.training.rundir import summary
    from treegrpo_cli.training.runlog import read_metrics

    return summary(run, 0, False) if read_metrics(run) else {}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
