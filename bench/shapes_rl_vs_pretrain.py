"""Does RL add what more pretraining would not? The equal-compute control on the embedded world.

    python bench/shapes_rl_vs_pretrain.py [--preset branch] [--out bench/results/shapes_rl_vs_pretrain.json]
    python bench/shapes_rl_vs_pretrain.py --rl-run runs/default --rl-minutes 14.2   # reuse a timed run
    python bench/shapes_rl_vs_pretrain.py --model tiny-shapes-video --preset tree-grpo-mean \
        --out bench/results/video_rl_vs_pretrain.json                                # the moving-shapes world

1. base:    the shipped weights (--model), mean reward (`shapes`, or `motion-shapes`) on the held-out test prompts
            (deterministic ODE sampler with the RL run's step count, --samples seeds per prompt);
2. RL:      `treegrpo train` with the preset on the embedded default (its own run folder), then the
            same evaluation of the final weights; its wall-clock minutes are recorded;
3. control: continued rectified-flow pretraining of the DiT from the shipped weights (same autoencoder,
            same noisy-caption data) for the same minutes (constant learning rate --control-lr), then the
            same evaluation.
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

from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.models.latent_file import load_weights
from treegrpo_cli.models.registry import EMBEDDED, load_policy
from treegrpo_cli.prompts import load_prompts
from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.heldout import heldout_reward
from treegrpo_cli.training.pretrain import PretrainConfig, pretrain
from treegrpo_cli.training.pretrain_video import pretrain_video

WORLDS = {"tiny-shapes": ("shapes", "shapes-test"), "tiny-shapes-video": ("motion-shapes", "motion-test")}


def test_reward(policy, model: str, samples: int, steps: int, seed: int = 777) -> dict:
    """Mean and standard error of the world's reward over its test prompts x samples ODE draws (the same
    root noises for every policy evaluated: paired comparisons)."""
    reward, prompts = WORLDS[model]
    r = heldout_reward(
        policy,
        FlowSDE(SamplerConfig(steps=steps)),
        load_prompts(prompts),
        {reward: get_reward(reward)},
        {reward: 1.0},
        samples=samples,
        seed=seed,
    )
    return {"mean": r["reward_mean"], "sem": r["reward_sem"], "n": r["prompts"] * samples}


def run_rl(preset: str, model: str, run_dir: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "treegrpo_cli", "train", "--preset", preset, "--model", model]
    cmd += ["--run-dir", str(run_dir), *extra]
    subprocess.run(cmd, check=True)
    return (time.perf_counter() - t0) / 60


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="branch")
    ap.add_argument("--model", choices=sorted(WORLDS), default="tiny-shapes", help="the embedded world")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--control-lr", type=float, default=1e-4)
    ap.add_argument("--work", type=Path, default=Path("runs/bench-shapes"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/shapes_rl_vs_pretrain.json"))
    ap.add_argument("--set", action="append", default=[], help="passed to treegrpo train")
    ap.add_argument(
        "--rl-run",
        type=Path,
        default=None,
        help="reuse this finished `treegrpo train` run folder instead of training again",
    )
    ap.add_argument(
        "--rl-minutes",
        type=float,
        default=None,
        help="with --rl-run: the wall-clock minutes of that command (the control gets as many)",
    )
    args = ap.parse_args()
    if args.rl_run and args.rl_minutes is None:
        ap.error("--rl-run needs --rl-minutes (the wall-clock of that train command)")
    return args


def control_run(args: argparse.Namespace, minutes: float, steps: int) -> tuple[dict, float, dict]:
    """Supervised pretraining from the embedded weights for `minutes`: its test reward, minutes and weights' meta."""
    ctl_path = args.work / "control.safetensors"
    ctl_cfg = PretrainConfig(
        steps=10**7, minutes=minutes, lr=args.control_lr, warmup=1, decay_from=1.0, eval_every=10**9, ae_steps=0, seed=1
    )
    t0 = time.perf_counter()
    if args.model == "tiny-shapes-video":  # a bank of 1024 encoded clips, 8 fresh a step (its filling is not timed)
        pretrain_video(ctl_cfg, None, ctl_path, init=EMBEDDED[args.model][0], bank=1024, refresh=8)
    else:
        pretrain(ctl_cfg, ctl_path, init=EMBEDDED[args.model][0])
    ctl_minutes = (time.perf_counter() - t0) / 60
    meta = load_weights(ctl_path)[2]
    control = test_reward(load_policy(str(ctl_path)), args.model, args.samples, steps)
    return control, ctl_minutes, meta


def main() -> None:
    args = parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    if args.rl_run:
        run, minutes = args.rl_run, args.rl_minutes
    else:
        run = args.work / f"rl-{time.strftime('%Y%m%d-%H%M%S')}"
        minutes = run_rl(args.preset, args.model, run, [x for s in args.set for x in ("--set", s)])
    run_info = json.loads((run / "run.json").read_text()) if (run / "run.json").exists() else {}
    steps = run_info.get("config", {}).get("sampler", {}).get("steps", 10)
    policy = load_policy(args.model)
    base = test_reward(policy, args.model, args.samples, steps)
    print("base", base, flush=True)
    ck = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    policy.load_trainable_state(ck.ema if ck.ema is not None else ck.model)  # as `treegrpo eval --checkpoint`
    rl = test_reward(policy, args.model, args.samples, steps)
    print("rl", rl, "minutes", minutes, flush=True)

    control, ctl_minutes, meta = control_run(args, minutes, steps)
    print("control", control, flush=True)

    result = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "model": args.model,
        "preset": None if args.rl_run else args.preset,
        "sets": args.set,
        "run_dir": str(run),
        "rl_command": run_info.get("command"),
        "rl_config": run_info.get("config"),
        "samples_per_prompt": args.samples,
        "sampler_steps": steps,
        "base": base,
        "rl": rl,
        "rl_minutes": minutes,
        "rl_gain": rl["mean"] - base["mean"],
        "control": control,
        "control_minutes": ctl_minutes,
        "control_lr": args.control_lr,
        "control_images": meta.get("log", {}).get("images", meta.get("log", {}).get("clips")),
        "control_gain": control["mean"] - base["mean"],
    }
    result["control_gain_over_rl_gain"] = result["control_gain"] / result["rl_gain"] if result["rl_gain"] else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
