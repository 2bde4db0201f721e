"""Pretraining of the moving-shapes video model (models/video_latent.py) on rendered clips with noisy captions.

The image world's autoencoder is taken as it is (frozen, from the tiny-shapes weights): only the video DiT
trains, by rectified flow on the frame-stacked latents of freshly rendered clips:
    z0 = encode(clip),  eps ~ N(0, I),  sigma = shift(u),  z_sigma = (1 - sigma) z0 + sigma eps,  v* = eps - z0
    loss = || v_theta(z_sigma, sigma, caption) - v* ||^2
Every batch draws captions uniformly from the world's prompts and renders their clips with the world's caption
noise (world/motion.py noisy_clip). Encoding a clip (8 frames through the autoencoder) costs about three times a
DiT step, so clips go through a rolling bank of encoded latents (ClipBank): each step encodes `refresh` fresh
clips in place of the oldest and trains on a batch drawn from the whole bank (a bank of one batch refreshed
whole: every clip trains once). Evaluations sample the test prompts with the ODE sampler and score them with
the `motion-shapes` reward; the EMA of the weights is what is evaluated and saved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..engine.sde import FlowSDE, SamplerConfig
from ..models.latent import ShapesAE
from ..models.latent_file import load_weights, save_weights
from ..models.video_latent import VideoLatentPolicy, new_video_model
from ..rewards.motion import MotionShapesReward
from ..world.motion import FRAMES, noisy_clip, split_motion_prompts
from .pretrain import PretrainConfig, flow_step, lr_at
from .sampling import sample_scores


def clips_batch(prompts: list[str], n: int, g: torch.Generator) -> tuple[list[str], torch.Tensor]:
    """n captions drawn uniformly and their noisy clips [n, 3, FRAMES, 32, 32]."""
    idx = torch.randint(len(prompts), (n,), generator=g).tolist()
    captions = [prompts[i] for i in idx]
    return captions, torch.stack([noisy_clip(c, g) for c in captions])


class ClipBank:
    """`size` encoded clips (captions, latents [size, C, h, w]); `refresh(n)` encodes n new ones over the oldest."""

    def __init__(self, policy: VideoLatentPolicy, prompts: list[str], size: int, g: torch.Generator):
        self.policy, self.prompts, self.g, self.next = policy, prompts, g, 0
        chunks = [self._encode(min(256, size - a)) for a in range(0, size, 256)]
        self.captions = [c for caps, _ in chunks for c in caps]
        self.latents = torch.cat([z for _, z in chunks])

    def _encode(self, n: int) -> tuple[list[str], torch.Tensor]:
        captions, clips = clips_batch(self.prompts, n, self.g)
        with torch.no_grad():
            return captions, self.policy.encode_images(clips)  # [n, C F, h, w]

    def refresh(self, n: int) -> None:
        captions, z = self._encode(n)
        for c, row in zip(captions, z, strict=True):
            self.captions[self.next], self.latents[self.next] = c, row
            self.next = (self.next + 1) % len(self.captions)

    def sample(self, n: int) -> tuple[list[str], torch.Tensor]:
        """n clips drawn with replacement; the whole bank, in order, when it holds n."""
        if n == len(self.captions):
            return list(self.captions), self.latents.clone()
        idx = torch.randint(len(self.captions), (n,), generator=self.g)
        return [self.captions[i] for i in idx.tolist()], self.latents[idx]


def evaluate_clips(policy: VideoLatentPolicy, prompts: list[str], steps: int, seed: int = 1234) -> float:
    """Mean `motion-shapes` reward of one ODE sample per prompt: one rollout of them all from `seed`, sampled,
    decoded and scored through sampling.py."""
    sde = FlowSDE(SamplerConfig(steps=steps))
    scores = sample_scores(
        policy, sde, prompts, {"motion-shapes": MotionShapesReward()}, seed, batch=max(len(prompts), 1)
    )
    return float(scores["motion-shapes"].mean())


def pretrain_video(
    cfg: PretrainConfig,
    ae: ShapesAE | None,
    out: Path,
    log: Callable[[dict[str, Any]], None] = lambda row: None,
    bank: int = 0,
    refresh: int = 0,
    init: Path | None = None,
) -> dict[str, Any]:
    """The video DiT from scratch on the frozen autoencoder `ae`, with the image pretraining's schedule and model
    fields of cfg (its autoencoder and caption-noise fields do not apply: the world's noise is fixed); batches from a
    ClipBank of `bank` clips (0: cfg.batch, refreshed whole every step) renewed by `refresh` clips a step (0: all of
    a batch); writes the (EMA) weights to `out` at every evaluation; returns the last evaluation row. With `init`
    (a video weights file), training goes on from its DiT (its autoencoder is the one used; `ae` is ignored)."""
    g = torch.Generator().manual_seed(cfg.seed)
    pretrain, _, test = split_motion_prompts()
    if init is None:
        if ae is None:
            raise ValueError("pretrain_video needs an autoencoder (ae) or a video weights file to go on from (init)")
        policy = new_video_model(ae, FRAMES, cfg.seed, **cfg.dit_shape)
    else:
        dit, ae, _ = load_weights(init)
        policy = VideoLatentPolicy(dit.cfg, dit, ae, "tiny-shapes-video")
    net = policy.net
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    avg = torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema)
    ema = torch.optim.swa_utils.AveragedModel(net, multi_avg_fn=avg)
    shown = VideoLatentPolicy(net.cfg, ema.module, ae, "tiny-shapes-video")
    refresh = refresh or cfg.batch
    clips = ClipBank(policy, pretrain, bank or cfg.batch, g)
    t0, row, loss_avg = time.perf_counter(), {}, None
    for step in range(cfg.steps):
        if step:
            clips.refresh(refresh)
        captions, latents = clips.sample(cfg.batch)
        loss = flow_step(net, policy, opt, ema, captions, latents, g, cfg.shift, lr_at(cfg, step))
        loss_avg = loss if loss_avg is None else 0.98 * loss_avg + 0.02 * loss
        minutes = (time.perf_counter() - t0) / 60
        last = step == cfg.steps - 1 or bool(cfg.minutes and minutes >= cfg.minutes)
        if (step + 1) % cfg.eval_every == 0 or last:
            reward = evaluate_clips(shown, test, cfg.eval_steps)
            row = {
                "step": step + 1,
                "loss": loss_avg,
                "minutes": minutes,
                "clips": (step + 1) * cfg.batch,
                "clips_encoded": len(clips.captions) + step * refresh,
                "test_reward": reward,
            }
            save_weights(
                out,
                shown.net,
                ae,
                {
                    "pretrain": {**asdict(cfg), "bank": len(clips.captions), "refresh": refresh},
                    "world": "moving-shapes",
                    "log": row,
                    "frames": FRAMES,
                    "guidance": 1.0,
                },
            )
            log(row)
        if last:
            break
    return row
