"""Credit assignment for one scored batch of trees: rewards -> edge advantages -> trained-edge mask."""

from __future__ import annotations

from torch import Tensor

from .advantages import AdvantageConfig, Advantages, combine
from .pruning import ZERO_ADVANTAGE, PruneConfig, base_mask, prune, step_mask
from .tree import Tree


def assign_credit(
    tree: Tree,
    rewards: dict[str, Tensor],
    *,
    weights: dict[str, float],
    combine_mode: str,
    advantage: AdvantageConfig,
    pruning: PruneConfig,
    steps: int,
    decode: str,
    iteration: int = 0,
    max_iterations: int = 1,
) -> tuple[Advantages, Tensor]:
    """A tree batch's structure (parent, depth, tree, group, sde, log_prob) and rewards {name: [N] with NaN off
    the leaves} -> advantages and the trained-edge mask [N] bool."""
    adv = combine(
        advantage,
        parent=tree.parent,
        depth=tree.depth,
        tree=tree.tree,
        group=tree.group(),
        rewards=rewards,
        weights=weights,
        log_prob=tree.log_prob,
        mode=combine_mode,
    )
    base = (
        base_mask(
            tree.parent, sde=tree.sde, depth=tree.depth, steps=steps, decode=decode, train_last=pruning.train_last
        )
        & adv.valid
        & step_mask(pruning, tree.depth, steps)
    )
    trained = prune(
        pruning,
        base,
        parent=tree.parent,
        depth=tree.depth,
        tree=tree.tree,
        value=adv.fused,
        leaf_adv=adv.leaf,
        iteration=iteration,
        max_iterations=max_iterations,
    )
    if pruning.skip_zero_advantage:
        trained &= adv.edge.abs() > ZERO_ADVANTAGE
    return adv, trained
