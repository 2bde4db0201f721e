"""Held-out reward during training: the mean weighted reward of ODE samples of fixed test prompts."""

from __future__ import annotations

from typing import Any

import torch

from ..engine.protocols import Kernel
from ..engine.rollout import Progress, TreeConfig, rollout
from ..models.base import Policy
from ..rewards.base import Reward, score_leaves, weighted_sum


def heldout_reward(
    policy: Policy,
    sde: Kernel,
    prompts: list[str],
    rewards: dict[str, Reward],
    weights: dict[str, float],
    samples: int,
    seed: int,
    max_batch: int = 64,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Mean (and standard error) of the weighted reward over prompts x samples ODE draws."""
    cfg = TreeConfig(sde_steps=(), trees_per_prompt=samples)
    tree, _ = rollout(policy, prompts, list(range(len(prompts))), sde, cfg, seed, max_batch, progress)
    with torch.no_grad():
        images = policy.decode(tree.image_latent).cpu()
    per_image = [prompts[int(p)] for p in tree.tree_prompt]  # [P * samples]
    scores = score_leaves(rewards, images, per_image)
    total = weighted_sum(scores, weights)
    n = total.numel()
    out: dict[str, Any] = {
        "reward_mean": float(total.mean()),
        "reward_sem": float(total.std() / n**0.5) if n > 1 else 0.0,
        "prompts": len(prompts),
        "samples": samples,
    }
    out.update({f"rewards/{k}/mean": float(v.mean()) for k, v in scores.items()})
    return out
