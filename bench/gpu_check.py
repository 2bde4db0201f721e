"""The GPU check: the random-weight command-line path of four released models (train 2 iterations, resume to 3,
eval the checkpoint, export it), then bench/flux_iteration.py on FLUX.1-dev for three presets at four prompts an
iteration. One JSON with the device's name and the commit, and every step's seconds and exit code.

    bash bench/gpu_check.sh             # on a GPU machine (the wrapper installs carried wheels first)
    python bench/gpu_check.py --tiny    # the same steps on the CPU at policy.size="tiny" (a smoke test)

Each step runs as its own process with a time limit; a step past the check's budget is recorded as skipped, so
the JSON is always written. Results: bench/results/gpu_check-<device>.json (and $OUT/ when set).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("flux-dev", "qwen-image", "flux2-klein-4b", "wan2.1-t2v-1.3b")
PRESETS = ("tree-grpo-mean", "branch-mix-flow", "dance-grpo")
PROMPTS = ("a red fox in the snow", "a lighthouse at dusk")
# the CLI path checks that every command runs at the release's size, not the method: few steps, small images
CLI_SETS = {"sampler.steps": 6, "rollout.num_prompts": 1, "train.eval_samples": 1, "policy.resolution": 512}
VIDEO_SETS = {"policy.resolution": 480, "policy.frames": 17}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help='policy.size="tiny" on the CPU')
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check (steps past it skip)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--prompts", type=int, default=4, help="prompts an iteration in flux_iteration.py")
    ap.add_argument("--iterations", type=int, default=1, help="iterations of each flux_iteration.py case")
    ap.add_argument("--main-job", action="store_true", help="time `treegrpo train` (the embedded default) last")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


class Steps:
    """Runs commands one after another inside a budget; records seconds, exit code and the last lines."""

    def __init__(self, budget: float):
        self.t0, self.budget, self.rows = time.perf_counter(), budget, []

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def run(self, name: str, argv: list[str]) -> dict[str, Any]:
        row: dict[str, Any] = {"step": name, "command": " ".join(argv)}
        if self.left() < 5:
            row.update(rc=None, status="skipped (budget)")
            self.rows.append(row)
            return row
        t = time.perf_counter()
        try:
            p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=self.left())
            row.update(rc=p.returncode, status="ok" if p.returncode == 0 else "failed")
            row["tail"] = (p.stdout + p.stderr).strip().splitlines()[-4:]
        except subprocess.TimeoutExpired:
            row.update(rc=None, status="timeout")
        row["seconds"] = round(time.perf_counter() - t, 1)
        print(f"{row['status']:>8} {row.get('seconds', 0):7.1f}s  {name}", flush=True)
        self.rows.append(row)
        return row


def cli_path(steps: Steps, model: str, tiny: bool, work: Path) -> None:
    """train 2 iterations, resume to 3, eval the checkpoint, export it: random weights, nothing downloaded."""
    cli = [sys.executable, "-m", "treegrpo_cli"]
    prompts = work / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    sets: dict[str, Any] = {"policy.weights": '"random"', "policy.size": '"tiny"' if tiny else '"full"'}
    if not tiny:
        sets.update(CLI_SETS, **(VIDEO_SETS if model.startswith("wan") else {}))
    sets.update({"sampler.steps": 4, "rollout.num_prompts": 1, "train.eval_samples": 1} if tiny else {})
    sets["rollout.eval_prompts"] = json.dumps(str(prompts))
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    run = work / f"run-{model}"
    train = [*cli, "train", "--model", model, "--reward", "jpeg-compressibility", "--prompts", str(prompts)]
    if steps.run(f"{model}: train 2 iterations", [*train, *args, "--iterations", "2", "--run-dir", str(run)])["rc"]:
        return
    steps.run(f"{model}: resume to 3", [*cli, "train", "--resume", str(run), "--iterations", "3"])
    ev = [*cli, "eval", "--checkpoint", str(run), "--metric", "jpeg-compressibility", "--prompts", str(prompts)]
    steps.run(f"{model}: eval the checkpoint", [*ev, "--steps", "4", "--json"])
    steps.run(f"{model}: export", [*cli, "export", str(run), "--out", str(work / f"export-{model}")])


def iteration_bench(steps: Steps, args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    out = work / "flux_iteration.json"
    cmd = [sys.executable, str(ROOT / "bench" / "flux_iteration.py"), "--model", "flux-dev", "--modes", "lora"]
    cmd += [
        "--presets",
        args.presets,
        "--prompts",
        str(args.prompts),
        "--iterations",
        str(args.iterations),
        "--out",
        str(out),
    ]
    steps.run("flux_iteration.py: flux-dev, " + args.presets, [*cmd, *(["--tiny"] if args.tiny else [])])
    return json.loads(out.read_text()) if out.is_file() else None


def mfu_table(bench: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for case in (bench or {}).get("results", []):
        last = case["iterations"][-1] if case.get("iterations") else {}
        rows.append({"preset": case["preset"], "error": case.get("error")} | {
            k: last.get(k) for k in ("rollout_s", "train_s", "rollout_mfu", "train_mfu", "trained_edges")
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    name = device_name()
    if name == "cpu" and not args.tiny:
        print("gpu_check.py needs a CUDA GPU; --tiny runs the same steps on the CPU", file=sys.stderr)
        return 2
    steps = Steps(args.budget)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for model in args.models.split(","):
            cli_path(steps, model, args.tiny, Path(tmp))
        bench = iteration_bench(steps, args, Path(tmp))
        if args.main_job:
            main_job = [sys.executable, "-m", "treegrpo_cli", "train", "--run-dir", str(Path(tmp) / "main-job")]
            steps.run("main job: treegrpo train", main_job + (["--iterations", "2"] if args.tiny else []))
    result = {
        "command": " ".join(["bash bench/gpu_check.sh", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "device": name,
        "commit": commit(),
        "seconds": round(time.perf_counter() - steps.t0, 1),
        "green": all(r["status"] == "ok" for r in steps.rows),
        "steps": steps.rows,
        "mfu": mfu_table(bench),
        "flux_iteration": bench,
    }
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    outs = [args.out or ROOT / "bench" / "results" / f"gpu_check-{slug}{'-tiny' if args.tiny else ''}.json"]
    outs += [Path(os.environ["OUT"]) / outs[0].name] if os.environ.get("OUT") else []
    for path in outs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")
    print(
        "GREEN" if result["green"] else "NOT GREEN: " + ", ".join(r["step"] for r in steps.rows if r["status"] != "ok")
    )
    return 0 if result["green"] else 1


if __name__ == "__main__":
    sys.exit(main())
