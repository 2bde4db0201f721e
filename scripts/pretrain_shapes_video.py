"""Pretrain the moving-shapes video model (models/video_latent.py) on the CPU, on the shipped image autoencoder.

    python scripts/pretrain_shapes_video.py --threads 1 --out runs/video/w.safetensors --log runs/video/log.jsonl
        # the shipped tiny-shapes-video weights: these defaults, 55 minutes of one core beside other work
    python scripts/pretrain_shapes_video.py --steps 300 --eval-every 100 --out /tmp/v.safetensors   # a quick look

Writes the weights (safetensors: the video DiT, the autoencoder, the configs and the frame count in the
metadata) at every evaluation and a JSONL log of the loss and the test prompts' `motion-shapes` reward.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

import torch

from treegrpo_cli.models.latent_file import load_weights
from treegrpo_cli.models.registry import TINY_SHAPES
from treegrpo_cli.training.pretrain import PretrainConfig
from treegrpo_cli.training.pretrain_video import pretrain_video


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    video = {"steps": 8000, "batch": 64, "eval_every": 500}  # the image pretraining's defaults otherwise
    for f in fields(PretrainConfig):
        if not f.name.startswith("ae_") and f.name != "caption_noise":
            default = video.get(f.name, f.default)
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=default)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ae-from", type=Path, default=TINY_SHAPES, help="the image autoencoder (default: tiny-shapes)")
    ap.add_argument("--log", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bank", type=int, default=8192, help="encoded clips kept (0: one batch, fresh every step)")
    ap.add_argument("--refresh", type=int, default=8, help="fresh clips encoded per step (0: a whole batch)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = PretrainConfig(**{f.name: getattr(args, f.name) for f in fields(PretrainConfig) if hasattr(args, f.name)})
    ae = load_weights(args.ae_from)[1].requires_grad_(False).eval()

    def log(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if args.log:
            args.log.parent.mkdir(parents=True, exist_ok=True)
            with args.log.open("a") as f:
                f.write(json.dumps(row) + "\n")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    pretrain_video(cfg, ae, args.out, log, args.bank, args.refresh)


if __name__ == "__main__":
    main()
