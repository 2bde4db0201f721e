"""Pretrain the embedded tiny-shapes model (autoencoder, then a latent DiT by rectified flow) on a CPU.

    # the shipped weights: seed 0, the defaults (75 min)
    python scripts/pretrain_shapes.py --threads 2 --state runs/ship/state.pt
    python scripts/pretrain_shapes.py --steps 300 --ae-steps 200 --out /tmp/w.safetensors   # a quick look
    # a rerun beside the shipped file: rerun it to go on after a stop
    python scripts/pretrain_shapes.py --threads 2 --out runs/rerun/w.safetensors \
        --log runs/rerun/log.jsonl --state runs/rerun/state.pt
    python scripts/pretrain_shapes.py --init treegrpo_cli/data/tiny-shapes.safetensors --ae-steps 0 \
        --lr 1e-4 --warmup 1 --decay-from 1 --minutes 15 --out /tmp/more.safetensors  # the equal-compute control
    python scripts/pretrain_shapes.py --depth 6 --steps 5000 --ae-from treegrpo_cli/data/tiny-shapes.safetensors \
        --out runs/trial/w.safetensors --log runs/trial/log.jsonl   # a trial of another DiT on the shipped autoencoder

Writes the weights (safetensors, config in the metadata), and next to --log a JSONL log, the loss and
held-out reward curve (PNG) and a captioned sample grid of the test prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

import torch

from treegrpo_cli.engine.rollout import TreeConfig, rollout
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.models.latent import LatentDiTPolicy
from treegrpo_cli.models.latent_file import load_weights
from treegrpo_cli.plots import image_grid, line_chart, save_png, side_by_side
from treegrpo_cli.rewards.shapes import shapes_scores
from treegrpo_cli.training.pretrain import PretrainConfig, own_distribution_prompts, pretrain, resume_step
from treegrpo_cli.world.shapes import load_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in fields(PretrainConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    ap.add_argument("--out", type=Path, default=Path("treegrpo_cli/data/tiny-shapes.safetensors"))
    ap.add_argument("--init", type=Path, default=None, help="continue from these weights")
    ap.add_argument(
        "--ae-from",
        type=Path,
        default=None,
        help="a new DiT on this weights file's autoencoder: skips the autoencoder stage (and its random draws)",
    )
    ap.add_argument("--log", type=Path, default=Path("docs/pretrain/log.jsonl"))
    ap.add_argument(
        "--state",
        type=Path,
        default=None,
        help="keep the whole training state here at every evaluation; rerun the same command to resume",
    )
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = PretrainConfig(**{f.name: getattr(args, f.name) for f in fields(PretrainConfig)})
    args.log.parent.mkdir(parents=True, exist_ok=True)
    rows = []

    def log(row):
        rows.append(row)
        with open(args.log, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)

    start = resume_step(args.state, cfg) if args.state else None
    if start is None:
        args.log.write_text("")
    else:  # resuming: keep the log up to the state's step
        rows = (
            [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
            if args.log.exists()
            else []
        )
        rows = [r for r in rows if r.get("stage") != "dit" or r["step"] <= start]
        args.log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = pretrain(cfg, args.out, args.init, log=log, state=args.state, ae_from=args.ae_from)
    figures(rows, args.out, args.log.parent)
    print(json.dumps(final))


def figures(rows: list[dict], weights: Path, folder: Path) -> None:
    dit = [r for r in rows if r.get("stage") == "dit"]
    loss = line_chart(
        {"loss": ([r["step"] for r in dit], [r["loss"] for r in dit])}, "rectified-flow loss (EMA)", "step", "loss"
    )
    ev = [r for r in dit if "test_reward" in r]
    rew = line_chart(
        {
            "test prompts": ([r["step"] for r in ev], [r["test_reward"] for r in ev]),
            "pretraining captions": ([r["step"] for r in ev], [r["pretrain_reward"] for r in ev]),
        },
        "shapes reward (ODE samples)",
        "step",
        "reward",
    )
    save_png(side_by_side([loss, rew]), folder / "curves.png")
    net, ae, meta = load_weights(weights)
    policy = LatentDiTPolicy(net.cfg, net, ae)
    for name, prompts in (
        ("samples-test.png", load_split("test")[:24]),
        ("samples-own.png", own_distribution_prompts(24)),
    ):
        tree, _ = rollout(
            policy, prompts, list(range(len(prompts))), FlowSDE(SamplerConfig(steps=10)), TreeConfig(sde_steps=()), 1234
        )
        with torch.no_grad():
            images = policy.decode(tree.image_latent)
        scores = shapes_scores(images, prompts)
        save_png(
            image_grid(images, [f"{p} ({s:.2f})" for p, s in zip(prompts, scores.tolist(), strict=True)], ncol=6),
            folder / name,
        )


if __name__ == "__main__":
    try:
        main()
    except TreegrpoError as e:
        sys.exit(f"error: {e}")
