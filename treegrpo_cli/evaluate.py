"""Held-out evaluation: the reward of deterministic ODE samples of a prompt list.

Every tree is a single chain with no noise after its root (`sde_steps=()`), so for fixed weights
and seed the images are fixed, and two policies evaluated with the same seed see the same root
noises: their difference is a paired comparison.
"""

from __future__ import annotations

from typing import Any

import torch

from .engine.rollout import Progress, TreeConfig, rollout
from .engine.sde import FlowSDE
from .models.base import Policy
from .rewards.base import Reward, score_leaves


def heldout_reward(policy: Policy, sde: FlowSDE, prompts: list[str], rewards: dict[str, Reward],
                   weights: dict[str, float], samples: int, seed: int, max_batch: int = 64,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Mean (and standard error) of the weighted reward over prompts x samples ODE draws."""
    cfg = TreeConfig(sde_steps=(), trees_per_prompt=samples)
    tree, _ = rollout(policy, prompts, list(range(len(prompts))), sde, cfg, seed, max_batch, progress)
    with torch.no_grad():
        images = policy.decode(tree.image_latent).cpu()
    per_image = [prompts[int(p)] for p in tree.tree_prompt]                   # [P * samples]
    scores = score_leaves(rewards, images, per_image)
    total = sum(w * scores[n] for n, w in weights.items())
    n = total.numel()
    out: dict[str, Any] = {"reward_mean": float(total.mean()),
                           "reward_sem": float(total.std() / n ** 0.5) if n > 1 else 0.0,
                           "prompts": len(prompts), "samples": samples}
    out.update({f"rewards/{k}/mean": float(v.mean()) for k, v in scores.items()})
    return out
