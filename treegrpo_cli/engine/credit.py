"""Credit assignment for one scored batch of trees: rewards -> edge advantages -> trained-edge mask."""

from __future__ import annotations

from torch import Tensor

from .advantages import AdvantageConfig, Advantages, combine
from .pruning import ZERO_ADVANTAGE, PruneConfig, base_mask, prune, step_mask


def assign_credit(
    parent: Tensor,
    depth: Tensor,
    tree: Tensor,
    group: Tensor,
    sde: Tensor,
    log_prob: Tensor,
    rewards: dict[str, Tensor],
    weights: dict[str, float],
    combine_mode: str,
    adv_cfg: AdvantageConfig,
    prune_cfg: PruneConfig,
    steps: int,
    decode: str,
    iteration: int = 0,
    max_iterations: int = 1,
) -> tuple[Advantages, Tensor]:
    """All inputs [N]; rewards {name: [N] with NaN off the leaves}. Returns advantages and trained [N] bool."""
    adv = combine(adv_cfg, parent, depth, tree, group, rewards, weights, log_prob, combine_mode)
    base = (
        base_mask(parent, sde, depth, steps, decode, prune_cfg.train_last)
        & adv.valid
        & step_mask(prune_cfg, depth, steps)
    )
    trained = prune(prune_cfg, base, parent, depth, tree, adv.fused, adv.leaf, iteration, max_iterations)
    if prune_cfg.skip_zero_advantage:
        trained &= adv.edge.abs() > ZERO_ADVANTAGE
    return adv, trained
