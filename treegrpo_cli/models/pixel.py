"""A small pixel-space text-to-image flow network: the first Policy adapter.

Images are their own latents (3 x H x W in [-1, 1]); the prompt is a bag of hashed words. Random
weights are fine for exercising the engine; the pretrained embedded model builds on the same
adapter interface.
"""

from __future__ import annotations

import copy
import math
import re
import zlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Conditions, PixelNetPolicy


@dataclass(frozen=True)
class PixelConfig:
    image_size: int = 32
    channels: int = 3
    width: int = 16  # conv channels
    blocks: int = 2  # residual blocks
    buckets: int = 512  # hashed word vocabulary (bucket 0 is padding)
    text_dim: int = 64
    max_words: int = 16
    seed: int = 0  # weight init seed


def tokenize(prompts: list[str], buckets: int, max_words: int) -> tuple[Tensor, Tensor]:
    """-> ids [P, W] int64 (0 = pad), mask [P, W] float32."""
    ids = torch.zeros(len(prompts), max_words, dtype=torch.long)
    for p, text in enumerate(prompts):
        words = re.findall(r"[a-z0-9]+", text.lower())[:max_words]
        for w, word in enumerate(words):
            ids[p, w] = 1 + zlib.crc32(word.encode()) % (buckets - 1)
    return ids, (ids > 0).float()


def sigma_embedding(sigma: Tensor, dim: int) -> Tensor:
    """[B] -> [B, dim] sinusoidal features of 1000*sigma."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=sigma.device) / half)
    args = 1000.0 * sigma.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=1)


class ResBlock(nn.Module):
    def __init__(self, width: int, cond_dim: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, width)
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.film = nn.Linear(cond_dim, 2 * width)
        self.norm2 = nn.GroupNorm(8, width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, h: Tensor, c: Tensor) -> Tensor:  # h [B, w, H, W], c [B, cond]
        scale, shift = self.film(c)[:, :, None, None].chunk(2, dim=1)
        y = self.conv1(F.silu(self.norm1(h)))
        y = self.norm2(y) * (1 + scale) + shift
        return h + self.conv2(F.silu(y))


class PixelFlowNet(nn.Module):
    def __init__(self, cfg: PixelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.text_dim
        self.words = nn.Embedding(cfg.buckets, d, padding_idx=0)
        self.time = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.conv_in = nn.Conv2d(cfg.channels, cfg.width, 3, padding=1)
        self.blocks = nn.ModuleList(ResBlock(cfg.width, d) for _ in range(cfg.blocks))
        self.conv_out = nn.Conv2d(cfg.width, cfg.channels, 3, padding=1)

    def forward(self, x: Tensor, sigma: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
        text = (self.words(ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        c = self.time(sigma_embedding(sigma, self.cfg.text_dim)) + text  # [B, d]
        h = self.conv_in(x)
        for block in self.blocks:
            h = block(h, c)
        return self.conv_out(F.silu(h))


class PixelPolicy(PixelNetPolicy):
    """Policy adapter: pixel latents in [-1, 1], hashed-word conditions."""

    net: PixelFlowNet

    def __init__(self, cfg: PixelConfig = PixelConfig(), name: str = "pixel", net: PixelFlowNet | None = None):
        self.cfg, self.name = cfg, name
        if net is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                net = PixelFlowNet(cfg)
        self.net = net
        self.latent_shape = (cfg.channels, cfg.image_size, cfg.image_size)

    def encode(self, prompts: list[str]) -> Conditions:
        ids, mask = tokenize(prompts, self.cfg.buckets, self.cfg.max_words)
        return {"ids": ids.to(self._device()), "mask": mask.to(self._device())}

    def describe(self) -> dict:
        return {"name": self.name, "adapter": "pixel", "config": asdict(self.cfg)}

    def reference(self) -> PixelPolicy:
        net = copy.deepcopy(self.net).requires_grad_(False)
        return PixelPolicy(self.cfg, name=f"{self.name}-reference", net=net)
