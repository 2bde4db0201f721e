"""Which edges go into the backward pass (BranchGRPO pruning, methods.md 6.3-6.4 and 13.5-13.6).

Pruning never changes sampling or rewards: it runs after the advantages and only masks edges.
Every mask is [N] bool over the nodes of a batch of trees and refers to the edge INTO the node.

    base_mask     trainable edges: not a root, an SDE edge, and not the last step when the image
                  is the last step's x0-prediction (that action does not affect the reward).
    width_mask    BranchGRPO width pruning below the last split step of each tree:
                  "parent-top1" keeps the best child of every last-split parent and its subtree,
                  "extreme" keeps the paths to the best and worst leaves of the whole batch.
    depth_window  BranchGRPO's sliding window of excluded node depths.
    prune         base & width & depth, width/depth only while pruning is active.
    step_mask     the first int(timestep_fraction * T) steps (Flow-GRPO's released code trains 9 of 10).
Edges whose advantage is zero are left out by default (engine.credit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from .advantages import depth_levels, num_children, subtree_sum
from .sde import DECODES
from .tree import leaf_mask

WIDTHS = ("none", "parent-top1", "extreme")
ZERO_ADVANTAGE = 1e-6  # |A| at or below this counts as zero (a z-score of tied rewards is ~1e-9, not 0)


@dataclass(frozen=True)
class PruneConfig:
    width: str = "none"  # "none" | "parent-top1" | "extreme"
    extreme_frac: float = 0.25  # extreme: keep the best and the worst frac of the batch's leaves (each >= 1)
    depth_window: int = 0  # number of node depths excluded from the backward pass (0 = off)
    depth_start: int = 15  # shallowest excluded node depth at iteration 0
    depth_every: int = 30  # the window moves by one depth every this many iterations
    depth_direction: int = -1  # -1 toward shallower depths (released code), +1 toward deeper
    depth_stop: int = 9  # -1: shallowest excluded depth >= this; +1: deepest excluded depth <= this
    active_until: float = 1.0  # width/depth pruning only while iteration <= active_until * max_iterations
    timestep_fraction: float = (
        1.0  # train only the edges of the first int(frac * T) steps (Flow-GRPO's code: 0.99, 9 of 10)
    )
    train_last: bool = False  # with sampler.decode = "x0", also train the last step's edge (BranchGRPO's released code;
    # that action does not change the decoded image, so the papers' objective has no gradient there)
    skip_zero_advantage: bool = True  # leave out edges with |A| <= ZERO_ADVANTAGE (a tied group, a depth below
    # min_std): no policy gradient, only forwards and a diluted mean (references: false)

    def validate(self) -> None:
        if self.width not in WIDTHS:
            raise ConfigError(f"pruning.width must be one of {', '.join(WIDTHS)}; got {shown(self.width)}")
        if self.depth_direction not in (-1, 1):
            raise ConfigError(f"pruning.depth_direction must be one of -1, 1; got {shown(self.depth_direction)}")
        if not (0 < self.extreme_frac <= 0.5):
            raise ConfigError(f"pruning.extreme_frac must be in (0, 0.5]; got {shown(self.extreme_frac)}")
        for name, value, low in (
            ("depth_window", self.depth_window, 0),
            ("depth_start", self.depth_start, 0),
            ("depth_every", self.depth_every, 1),
            ("depth_stop", self.depth_stop, 0),
        ):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"pruning.{name} must be an integer >= {low}; got {shown(value)}")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(f"pruning.timestep_fraction must be in (0, 1]; got {shown(self.timestep_fraction)}")
        if not (self.active_until >= 0 and math.isfinite(self.active_until)):
            raise ConfigError(f"pruning.active_until must be finite and >= 0; got {shown(self.active_until)}")


def base_mask(
    parent: Tensor, *, sde: Tensor, depth: Tensor, steps: int, decode: str, train_last: bool = False
) -> Tensor:
    """[N] bool: edges that may be trained at all (before any pruning)."""
    if decode not in DECODES:
        raise ConfigError(f"sampler.decode must be one of {', '.join(DECODES)}; got {shown(decode)}")
    keep = (parent >= 0) & sde.bool()
    if decode == "x0" and not train_last:  # the scored image is the last x0-prediction: the last action is noise
        keep &= depth != steps
    return keep


def step_mask(cfg: PruneConfig, depth: Tensor, steps: int) -> Tensor:
    """[N] bool: edges (into depth d, step d - 1) among the first int(timestep_fraction * steps) steps."""
    return depth - 1 < int(cfg.timestep_fraction * steps)


def depth_window(cfg: PruneConfig, iteration: int) -> list[int]:
    """The node depths excluded from the backward pass at this iteration (ascending)."""
    if cfg.depth_window == 0:
        return []
    moves = max(int(iteration), 0) // cfg.depth_every
    lo = cfg.depth_start
    if cfg.depth_direction < 0:
        lo -= min(moves, max(0, cfg.depth_start - cfg.depth_stop))
    else:
        lo += min(moves, max(0, cfg.depth_stop - (cfg.depth_start + cfg.depth_window - 1)))
    return list(range(lo, lo + cfg.depth_window))


def _below_last_split(parent: Tensor, depth: Tensor, tree: Tensor, levels: list[Tensor]) -> tuple[Tensor, Tensor]:
    """([N] bool last-split children, [N] bool those and everything below them).

    A tree's last split depth is the largest depth of one of its nodes with >= 2 children; the
    last-split children are the children of its nodes at that depth. Trees without a split: none.
    """
    _, t = torch.unique(tree, return_inverse=True)  # [N] compact tree
    split = num_children(parent) >= 2
    last = torch.full((int(t.max()) + 1,), -1, dtype=torch.long)
    last = last.scatter_reduce(0, t[split], depth[split], "amax")  # [B], -1: no split
    at_last = (depth == last[t]) & (last[t] >= 0)  # [N] last-split parents
    nr = parent >= 0
    child = torch.zeros_like(split)
    child[nr] = at_last[parent[nr]]
    below = child.clone()
    for ids in levels[1:]:
        kids = ids[parent[ids] >= 0]
        below[kids] |= below[parent[kids]]
    return child, below


def _parent_top1(parent: Tensor, child: Tensor, value: Tensor) -> Tensor:
    """[N] bool: among last-split children, True for the best child of each parent (ties: lowest id)."""
    c = torch.nonzero(child).flatten()  # [M]
    p = parent[c]
    v = torch.nan_to_num(value[c].double(), nan=-math.inf)
    best = torch.full((parent.numel(),), -math.inf, dtype=torch.float64).scatter_reduce(0, p, v, "amax")
    cand = v == best[p]
    win = torch.full((parent.numel(),), parent.numel(), dtype=torch.long)
    win = win.scatter_reduce(0, p[cand], c[cand], "amin")
    out = torch.zeros_like(child)
    out[c] = win[p] == c
    return out


def _extreme_leaves(parent: Tensor, leaf_adv: Tensor, frac: float) -> Tensor:
    """[N] bool: the b best and b worst leaves of the batch by leaf_adv, b = max(1, round(frac * L)).

    Leaves with a NaN advantage are not ranked; ties go to the lowest id; round is half-up.
    """
    ids = torch.nonzero(leaf_mask(parent) & ~torch.isnan(leaf_adv)).flatten()  # [L]
    a = leaf_adv[ids].double()
    b = max(1, math.floor(frac * ids.numel() + 0.5))
    keep = torch.zeros(parent.numel(), dtype=torch.bool)
    keep[ids[torch.argsort(-a, stable=True)[:b]]] = True
    keep[ids[torch.argsort(a, stable=True)[:b]]] = True
    return keep


def width_mask(
    cfg: PruneConfig, parent: Tensor, depth: Tensor, tree: Tensor, value: Tensor, leaf_adv: Tensor
) -> Tensor:
    """[N] bool (True = keep) after width pruning below each tree's last split step."""
    cfg.validate()
    keep = torch.ones(parent.numel(), dtype=torch.bool)
    if cfg.width == "none" or parent.numel() == 0:
        return keep
    levels = depth_levels(parent, depth)
    child, below = _below_last_split(parent, depth, tree, levels)
    if cfg.width == "parent-top1":
        keep = ~child | _parent_top1(parent, child, value)
        for ids in levels[1:]:  # a dropped child takes its whole subtree with it
            kids = ids[parent[ids] >= 0]
            keep[kids] &= keep[parent[kids]]
        return keep
    chosen = _extreme_leaves(parent, leaf_adv, cfg.extreme_frac).to(torch.float64)
    leads = subtree_sum(parent, levels, chosen) > 0  # [N] reaches a chosen leaf
    return ~below | leads


def prune(
    cfg: PruneConfig,
    base: Tensor,
    *,
    parent: Tensor,
    depth: Tensor,
    tree: Tensor,
    value: Tensor,
    leaf_adv: Tensor,
    iteration: int,
    max_iterations: int,
) -> Tensor:
    """[N] bool edges of the backward pass: base & width & depth window (the last two only while
    iteration <= active_until * max_iterations)."""
    cfg.validate()
    keep = base.bool().clone()
    if iteration > cfg.active_until * max_iterations:
        return keep
    keep &= width_mask(cfg, parent, depth, tree, value, leaf_adv)
    window = depth_window(cfg, iteration)
    if window:
        keep &= ~torch.isin(depth, torch.tensor(window, dtype=depth.dtype))
    return keep
