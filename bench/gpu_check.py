"""The GPU check: the random-weight command-line path of four released models (train 2 iterations, resume to 3,
eval the checkpoint, export it), then bench/flux_iteration.py on FLUX.1-dev for three presets at four prompts an
iteration. One JSON with the device's name and the commit, and every step's seconds and exit code.

    bash bench/gpu_check.sh             # on a GPU machine (the wrapper installs carried wheels first)
    python bench/gpu_check.py --tiny    # the same steps on the CPU at policy.size="tiny" (a smoke test)
    bash bench/gpu_check.sh --variants base,compile,cudnn,batch16 [--preset branch-mix-flow] [--iterations 2]
        # the MFU candidates instead: each one flux_iteration.py process on the same card, with its speed-up over
        # base -> bench/results/gpu_variants-<device>.json

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
# speed candidates for the MFU work (models/speed.py), each flux_iteration.py's arguments on top of today's defaults
VARIANTS: dict[str, list[str]] = {
    "base": [],
    "compile": ["--set", "policy.compile=blocks"],
    "cudnn": ["--set", "policy.attention=_native_cudnn"],
    "torch-flash": ["--set", "policy.attention=_native_flash"],
    "flash": ["--set", "policy.attention=flash"],  # flash-attn's FlashAttention-2, where installed
    "fa3": ["--set", "policy.attention=_flash_3"],  # FlashAttention-3 (Hopper), where installed
    "batch16": ["--max-batch", "16"],
    "no-checkpointing": ["--no-gradient-checkpointing"],
    "checkpoint-half": ["--set", "policy.checkpoint_blocks=0.5"],  # every second block keeps its activations
    "compile+batch16": ["--set", "policy.compile=blocks", "--max-batch", "16"],
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help='policy.size="tiny" on the CPU')
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check (steps past it skip)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--prompts", type=int, default=4, help="prompts an iteration in flux_iteration.py")
    ap.add_argument("--iterations", type=int, default=1, help="iterations of each flux_iteration.py case")
    ap.add_argument("--main-job", action="store_true", help="time `treegrpo train` (the embedded default) last")
    ap.add_argument(
        "--variants",
        default=None,
        help=f"instead of the check: flux_iteration.py's speed candidates, one preset, against 'base' in this call "
        f"({','.join(VARIANTS)})",
    )
    ap.add_argument("--preset", default="branch-mix-flow", help="the preset --variants runs")
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
        self.t0, self.budget = time.perf_counter(), budget
        self.rows: list[dict[str, Any]] = []

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


def flux_iteration(
    steps: Steps, args: argparse.Namespace, name: str, presets: str, out: Path, extra: list[str]
) -> dict[str, Any] | None:
    """One bench/flux_iteration.py process (FLUX.1-dev, LoRA) as a step; its results file, if it wrote one."""
    cmd = [sys.executable, str(ROOT / "bench" / "flux_iteration.py"), "--model", "flux-dev", "--modes", "lora"]
    cmd += ["--presets", presets, "--prompts", str(args.prompts), "--iterations", str(args.iterations)]
    steps.run(name, [*cmd, *extra, "--out", str(out), *(["--tiny"] if args.tiny else [])])
    return json.loads(out.read_text()) if out.is_file() else None


def iteration_bench(steps: Steps, args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    out = work / "flux_iteration.json"
    return flux_iteration(steps, args, f"flux_iteration.py: flux-dev, {args.presets}", args.presets, out, [])


def variant_bench(steps: Steps, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Each --variants candidate as its own flux_iteration.py process on the same card, then its ratios to
    'base' (the steady-state iteration: the last of --iterations)."""
    rows: list[dict[str, Any]] = []
    for name in args.variants.split(","):
        out = work / f"variant-{name}.json"
        bench = flux_iteration(
            steps, args, f"variant {name}: flux-dev, {args.preset}", args.preset, out, VARIANTS[name]
        )
        row = mfu_table(bench)[0] if bench and bench.get("results") else {"preset": args.preset}
        status = steps.rows[-1]["status"] if not row.get("error") else "case error"  # the script ran; the case not
        rows.append({"variant": name, "status": status, **row})
    base = next((r for r in rows if r["variant"] == "base" and r.get("rollout_s")), None)
    for r in rows:
        for phase in ("rollout_s", "train_s"):
            if base and r.get(phase) and base.get(phase):
                r[f"{phase.removesuffix('_s')}_speedup"] = round(base[phase] / r[phase], 3)
    return rows


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
    unknown = [v for v in (args.variants or "").split(",") if v and v not in VARIANTS]
    if unknown:
        print(f"unknown --variants {', '.join(unknown)}: known are {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    name = device_name()
    if name == "cpu" and not args.tiny:
        print("gpu_check.py needs a CUDA GPU; --tiny runs the same steps on the CPU", file=sys.stderr)
        return 2
    steps = Steps(args.budget)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        variants = variant_bench(steps, args, Path(tmp)) if args.variants else None
        for model in args.models.split(",") if not args.variants else ():
            cli_path(steps, model, args.tiny, Path(tmp))
        bench = iteration_bench(steps, args, Path(tmp)) if not args.variants else None
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
        "variants": variants,
        "flux_iteration": bench,
    }
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    stem = f"gpu_{'variants' if args.variants else 'check'}-{slug}{'-tiny' if args.tiny else ''}"
    outs = [args.out or ROOT / "bench" / "results" / f"{stem}.json"]
    outs += [Path(os.environ["OUT"]) / outs[0].name] if os.environ.get("OUT") else []
    for path in outs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")
    for r in variants or ():
        speed = f"rollout x{r.get('rollout_speedup', '-')}, update x{r.get('train_speedup', '-')}"
        print(f"{r['variant']:<18} {r['status']:<18} {speed}  MFU {r.get('rollout_mfu')} / {r.get('train_mfu')}")
    print(
        "GREEN" if result["green"] else "NOT GREEN: " + ", ".join(r["step"] for r in steps.rows if r["status"] != "ok")
    )
    return 0 if result["green"] else 1


if __name__ == "__main__":
    sys.exit(main())
