"""The verifiable `motion-shapes` reward of the moving-shapes world (world/motion.py): clips in, one score each.

Score of a clip [3, F, H, W] for "<single or count prompt> moving <direction>", in [0, 1]:
    (W_APPEAR * appear + W_MOTION * motion) / (W_APPEAR + W_MOTION)
    appear   the `shapes` reward's score of every frame for the still prompt (colour, kind, count, size), averaged
             over the frames: an object that fades, melts or changes colour mid-clip loses credit
    motion   1 when the asked-for objects (right colour and kind) are found in the first and the last frame and the
             mean of their centroids travels along the direction at least MIN_TRAVEL of the world's travel for that
             many frames (SPEED px a frame), and across it at most ACROSS px; else 0
So the world's own clip of the prompt scores 1, the right objects standing still or moving another way 0.5.
Text outside the grammar scores 0; an image (a one-frame clip) earns no motion credit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..world.detect import Det, detect
from ..world.motion import DIRECTIONS, SPEED, MotionPrompt, parse_motion_prompt
from .base import register
from .shapes import score_detections

W_APPEAR, W_MOTION = 1.0, 1.0
MIN_TRAVEL = 0.5  # of SPEED x (frames - 1)
ACROSS = 3.0  # px


def _centroid(dets: list[Det], p: MotionPrompt) -> tuple[float, float] | None:
    wanted = {(g.colour, g.kind) for g in p.still.groups}
    hits = [d for d in dets if (d.colour, d.kind) in wanted]
    if not hits:
        return None
    return sum(d.cx for d in hits) / len(hits), sum(d.cy for d in hits) / len(hits)


def motion_credit(first: list[Det], last: list[Det], p: MotionPrompt, frames: int) -> float:
    """1 when the asked-for objects' mean centroid moved the asked way far enough and straight enough."""
    a, b = _centroid(first, p), _centroid(last, p)
    if a is None or b is None or frames < 2:
        return 0.0
    ux, uy = DIRECTIONS[p.direction]
    dx, dy = b[0] - a[0], b[1] - a[1]
    along, across = dx * ux + dy * uy, abs(dx * uy - dy * ux)
    return float(along >= MIN_TRAVEL * SPEED * (frames - 1) and across <= ACROSS)


def motion_scores(videos: Tensor, prompts: list[str]) -> Tensor:
    """videos [B, 3, F, H, W] (or images [B, 3, H, W]) float in [0, 1] or uint8, prompts [B] -> scores [B]."""
    if len(videos) != len(prompts):
        raise ValueError(f"{len(videos)} clips but {len(prompts)} prompts")
    x = videos.float() / 255.0 if videos.dtype == torch.uint8 else videos.float().clamp(0, 1)
    x = x[:, :, None] if x.dim() == 4 else x  # [B, 3, F, H, W]
    B, F = x.shape[0], x.shape[2]
    out = torch.zeros(B, dtype=torch.float32)
    for i, text in enumerate(prompts):
        p = parse_motion_prompt(text)
        if p is None:
            continue
        dets = detect(x[i].transpose(0, 1))  # per frame
        appear = sum(score_detections(p.still, d) for d in dets) / F
        motion = motion_credit(dets[0], dets[-1], p, F)
        out[i] = (W_APPEAR * appear + W_MOTION * motion) / (W_APPEAR + W_MOTION)
    return out


class MotionShapesReward:
    """The moving-shapes world's reward: the shapes of every frame and the direction they travel."""

    name = "motion-shapes"
    video = True  # takes the clips whole (score_leaves does not split them into frames)

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        return motion_scores(images, prompts)


register(MotionShapesReward.name, MotionShapesReward, summary="the moving-shapes world's clips: shapes and motion")
