"""Reward-hacking monitors that need no weights: per-image statistics, sample diversity and drift from the base.

A policy that games its reward often shows it in plain image statistics before a reward model notices: pictures
going dark or washed out, colours collapsing to a few, saturation pushed up, high-frequency texture (adversarial
noise) growing, JPEG size running away; or every sample of a prompt converging to one picture. These functions
turn images into such numbers; comparing them with the base model's on the same prompts and noises ("drift")
says how far training has moved each one, in units of the base's own spread.

Images are read as the rewards read them (rewards.base.reward_images: float clamped and rounded to uint8, so a
float picture and its uint8 copy give the same numbers); videos [B, 3, F, H, W] give the mean over their frames.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import reward_images
from .jpeg import jpeg_kb

DARK = 0.1  # luminance below this: a dark pixel
BRIGHT = 0.9  # luminance above this: a bright pixel
LUMA = (0.299, 0.587, 0.114)  # Rec. 601 luminance weights of R, G, B
COLOUR_LEVELS = 4  # levels per channel of the colour histogram (4 ** 3 = 64 bins)
JPEG_QUALITY = 95
FEATURE_SIZE = 16  # pixel_features: images pooled to FEATURE_SIZE x FEATURE_SIZE
FLAT_STD = 1e-9  # drift: a base spread at most this (relative to the base mean, or 1) counts as none
STATS = ("dark_fraction", "bright_fraction", "colour_entropy", "saturation", "high_frequency", "jpeg_kb")


def _frames(images: Tensor) -> tuple[Tensor, int, int]:
    """Checked images or videos -> (frames [B F, 3, H, W] float32 in [0, 1], B, F)."""
    if not isinstance(images, Tensor):
        raise ValueError(f"images must be a tensor [B, 3, H, W] or [B, 3, F, H, W], got {type(images).__name__}")
    shape = list(images.shape)
    ok = images.dim() in (4, 5) and shape[1] == 3 and all(n > 0 for n in shape[2:])
    if not ok:
        raise ValueError(f"images must be [B, 3, H, W] or [B, 3, F, H, W] with H, W, F > 0, got shape {shape}")
    if images.dtype != torch.uint8 and not images.dtype.is_floating_point:
        raise ValueError(f"images must be float in [0, 1] or uint8, got {images.dtype} of shape {shape}")
    if images.dtype.is_floating_point and not bool(torch.isfinite(images).all()):
        bad = int((~torch.isfinite(images)).sum())
        raise ValueError(f"images of shape {shape} hold {bad} non-finite values (NaN or inf)")
    x = reward_images(images.detach().cpu())
    if x.dim() == 4:
        return x, x.shape[0], 1
    B, _, n, H, W = x.shape
    return x.transpose(1, 2).reshape(B * n, 3, H, W), B, n


def _colour_entropy(x: Tensor) -> Tensor:
    """[N] Shannon entropy in bits of the colours of frames [N, 3, H, W] quantised to COLOUR_LEVELS per channel."""
    q = ((x * 255).round().long() * COLOUR_LEVELS) // 256  # uint8 value -> level 0 .. COLOUR_LEVELS - 1
    bins = COLOUR_LEVELS**3
    index = (q[:, 0] * COLOUR_LEVELS + q[:, 1]) * COLOUR_LEVELS + q[:, 2]  # [N, H, W]
    N = x.shape[0]
    index = index.reshape(N, -1) + torch.arange(N).unsqueeze(1) * bins
    p = torch.bincount(index.reshape(-1), minlength=N * bins).view(N, bins).double()
    p = p / p.sum(1, keepdim=True)
    terms = torch.where(p > 0, -p * torch.log2(p.clamp_min(1e-300)), torch.zeros_like(p))
    return terms.sum(1).float()


def _high_frequency(x: Tensor) -> Tensor:
    """[N] mean |difference| over every pair of horizontally or vertically neighbouring pixels, all channels."""
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1)
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1)
    pairs = dx.shape[1] + dy.shape[1]
    return (dx.sum(1) + dy.sum(1)) / max(pairs, 1)  # a 1 x 1 image has no neighbours: 0


def image_stats(images: Tensor) -> dict[str, Tensor]:
    """Per-image statistics [B] float32 (see STATS) of images [B, 3, H, W] (float in [0, 1] or uint8) or the mean
    over frames of videos [B, 3, F, H, W]:

    dark_fraction / bright_fraction  share of pixels with Rec. 601 luminance < DARK / > BRIGHT
    colour_entropy                   entropy in bits of the colours at COLOUR_LEVELS per channel (0 .. 6)
    saturation                       mean HSV saturation (max - min) / max over channels, 0 where max is 0
    high_frequency                   mean |difference| of neighbouring pixels, horizontal and vertical pairs pooled
    jpeg_kb                          JPEG size in kB at quality JPEG_QUALITY (the jpeg rewards' encoding)
    """
    x, B, n = _frames(images)
    luma = LUMA[0] * x[:, 0] + LUMA[1] * x[:, 1] + LUMA[2] * x[:, 2]
    hi, lo = x.amax(1), x.amin(1)
    saturation = torch.where(hi > 0, (hi - lo) / hi.clamp_min(1e-12), torch.zeros_like(hi))
    per_frame = {
        "dark_fraction": (luma < DARK).float().flatten(1).mean(1),
        "bright_fraction": (luma > BRIGHT).float().flatten(1).mean(1),
        "colour_entropy": _colour_entropy(x),
        "saturation": saturation.flatten(1).mean(1),
        "high_frequency": _high_frequency(x),
        "jpeg_kb": jpeg_kb(x, quality=JPEG_QUALITY),
    }
    return {k: v.float().view(B, n).mean(1) for k, v in per_frame.items()}


def pixel_features(images: Tensor) -> Tensor:
    """[B, D] float32: images [B, 3, H, W] average-pooled to FEATURE_SIZE x FEATURE_SIZE and flattened
    (D = 3 * 16 * 16); videos [B, 3, F, H, W] pool each frame and flatten them all (D = 3 * F * 16 * 16)."""
    x, B, _ = _frames(images)
    pooled = F.adaptive_avg_pool2d(x, (FEATURE_SIZE, FEATURE_SIZE))
    return pooled.reshape(B, -1).float()


def _mean_pairwise(points: Tensor) -> float:
    """Mean L2 distance over the unordered pairs of points [M, D] (M >= 2)."""
    d = torch.cdist(points, points)
    i, j = torch.triu_indices(len(points), len(points), offset=1)
    return float(d[i, j].mean())


def diversity(features: Tensor, groups: Tensor | Sequence[int]) -> dict[str, float]:
    """Diversity of samples features [N, D] grouped by prompt ids groups [N]:

    within  mean over the groups with >= 2 samples of the mean pairwise L2 distance inside the group
    across  mean pairwise L2 distance between the group means (every group, however many samples)

    NaN where undefined (no group with two samples; fewer than two groups)."""
    if not isinstance(features, Tensor) or features.dim() != 2:
        shape = list(features.shape) if isinstance(features, Tensor) else type(features).__name__
        raise ValueError(f"features must be a tensor [N, D], got {shape}")
    ids = torch.as_tensor(groups)
    if ids.dim() != 1 or len(ids) != len(features):
        raise ValueError(f"groups must be [N] = [{len(features)}] prompt ids, got shape {list(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"groups must be integer prompt ids, got {ids.dtype}")
    x = features.detach().cpu().double()
    members = [x[ids.cpu() == g] for g in torch.unique(ids.cpu())]
    within = [_mean_pairwise(m) for m in members if len(m) >= 2]
    means = torch.stack([m.mean(0) for m in members]) if members else x[:0]
    return {
        "within": sum(within) / len(within) if within else math.nan,
        "across": _mean_pairwise(means) if len(means) >= 2 else math.nan,
    }


def drift(now: Mapping[str, Tensor], base: Mapping[str, Tensor]) -> dict[str, float]:
    """For each statistic both per-image dicts hold (same prompts and noises, e.g. image_stats of the current and
    the base model): (mean_now - mean_base) / std_base, std_base the population std over the base's images; where
    the base does not vary (std 0, or within FLAT_STD of it), the raw difference mean_now - mean_base."""
    out = {}
    for key in (k for k in base if k in now):
        a = torch.as_tensor(now[key]).detach().cpu().double().flatten()
        b = torch.as_tensor(base[key]).detach().cpu().double().flatten()
        if len(a) != len(b):
            raise ValueError(f"drift of {key!r}: {len(a)} images now but {len(b)} in the base; score the same ones")
        if len(b) == 0:
            out[key] = math.nan
            continue
        out[key] = standardised(float(a.mean() - b.mean()), float(b.std(correction=0)), float(b.mean()))
    return out


def standardised(diff: float, std: float, mean: float) -> float:
    """A difference of means in units of the base's spread std; the raw difference where the base does not vary
    (std within FLAT_STD of 0, relative to the base mean or 1)."""
    return diff if std <= FLAT_STD * max(abs(mean), 1.0) else diff / std
