"""Advantage estimators over a batch of rollout trees (methods.md sections 2, 3, 6.2, 7.2, 8, 9).

Every estimator is a pure function of flat per-node tensors (see tree.py for the layout):

    flat      DanceGRPO (Xue et al. 2025) / Flow-GRPO (Liu et al. 2025): leaf rewards z-scored
              within the prompt group (or with the batch std, Flow-GRPO); every edge on a leaf's
              path gets the leaf's value.
    branch    BranchGRPO (Li et al. 2025): rewards fused bottom-up into internal nodes
              (uniform mean, the paper's leaf softmax or the released code's recursive per-edge
              softmax), then z-scored per tree and per depth; an edge gets its child's value.
    treegrpo  TreeGRPO (Ding et al. 2025): leaves z-scored within the prompt group, then backed
              up post-order (log-prob softmax per the paper, plain mean per the released code).
    treepo    TreePO (Li et al. 2025, LLM) adapted to diffusion trees: the mean of the leaf's
              deviations from each sub-group (prompt group and every split ancestor's subtree),
              whitened over the batch; a prompt group whose rewards all tie gets 0 (TreePO runs
              with DAPO's filter, which drops such groups).

Shapes: N nodes over all trees of the batch; nodes are breadth-first, so a parent is always at a
smaller depth (and id) than its children. All arithmetic is float64; results are float32.

An estimator is written in one place: its function, decorated `@estimator("name", reads=(...))` with the
AdvantageConfig keys it reads. The registry (REGISTRY) gives the names advantage.estimator takes (ESTIMATORS), the
dispatch of `estimate`, the warning for a key the chosen estimator does not read (AdvantageConfig.warnings) and the
help that lists the estimators (the config reference; `treegrpo score --estimator`'s help reads the decorators from
this file's source, as the CLI starts without torch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from .dynamic import Inherited, never, set_but_ignored
from .tree import leaf_mask

FLAT_STDS = ("group", "global")
WEIGHTINGS = ("leaf-softmax", "recursive")
BACKUPS = ("logprob", "mean")
TREEPO_WEIGHTS = ("average", "group_size")
SHARED_EDGES = ("mean", "sum")
COMBINE_MODES = ("rewards", "advantages")


@dataclass(frozen=True)
class AdvantageConfig:
    estimator: str = "branch"  # the estimator (one of ESTIMATORS; the config reference lists them from REGISTRY)
    ddof: int = 1  # std correction: 1 unbiased (DanceGRPO, BranchGRPO code), 0 population
    eps: float = 1e-8  # added to the std
    flat_std: str = "group"  # flat: "group" (DanceGRPO) | "global" (Flow-GRPO: batch std, group mean)
    beta: float = 0.0  # branch fusion: 0 uniform mean of descendant leaves; >0 path-weighted
    weighting: str = "leaf-softmax"  # branch: "leaf-softmax" (paper) | "recursive" (released code)
    min_std: float = 1e-6  # branch: a depth whose std is below this gets advantage 0
    backup: str = "logprob"  # treegrpo: "logprob" (paper) | "mean" (released code)
    temperature: float = 1.0  # treegrpo backup softmax temperature
    treepo_weight: str = "average"  # treepo: "average" | "group_size"
    shared_edge: str = "mean"  # flat, treepo: an edge on several leaves' paths gets their "mean" | "sum"
    clamp: float | None = 5.0  # final clamp of edge advantages to [-clamp, clamp]; None = off

    def validate(self) -> None:
        for name, value, allowed in (
            ("estimator", self.estimator, tuple(ESTIMATORS)),
            ("flat_std", self.flat_std, FLAT_STDS),
            ("weighting", self.weighting, WEIGHTINGS),
            ("backup", self.backup, BACKUPS),
            ("treepo_weight", self.treepo_weight, TREEPO_WEIGHTS),
            ("shared_edge", self.shared_edge, SHARED_EDGES),
        ):
            if value not in allowed:
                raise ConfigError(f"advantage.{name} must be one of {', '.join(allowed)}; got {shown(value)}")
        if self.ddof not in (0, 1):
            raise ConfigError(f"advantage.ddof must be one of 0, 1; got {shown(self.ddof)}")
        for name, number, ok, rule in (
            ("eps", self.eps, self.eps >= 0, ">= 0"),
            ("beta", self.beta, self.beta >= 0, ">= 0"),
            ("min_std", self.min_std, self.min_std >= 0, ">= 0"),
            ("temperature", self.temperature, self.temperature > 0, "> 0"),
        ):
            if not (ok and math.isfinite(number)):
                raise ConfigError(f"advantage.{name} must be finite and {rule}; got {shown(number)}")
        if self.clamp is not None and not (self.clamp > 0):
            raise ConfigError(f"advantage.clamp must be > 0 or None (off); got {shown(self.clamp)}")

    def unread(self) -> tuple[str, ...]:
        """The keys the chosen estimator does not read (none for an unknown estimator: validate says it)."""
        if self.estimator not in REGISTRY:
            return ()
        reads = set(REGISTRY[self.estimator].reads) | set(OWN_KEYS)
        return tuple(f.name for f in dataclasses.fields(self) if f.name not in reads)

    def warnings(self, inherited: Inherited = never) -> list[str]:
        """A key set that the chosen estimator ignores (advantage.backup with branch): one line."""
        return set_but_ignored(self, self.unread(), "advantage.estimator", inherited)


@dataclass
class Advantages:
    edge: Tensor  # [N] float32 advantage of the edge into each node (0.0 where not valid)
    valid: Tensor  # [N] bool: the edge into the node has an advantage
    leaf: Tensor  # [N] float32 per-leaf advantage before the leaf->edge mapping (NaN on internal nodes)
    fused: Tensor  # [N] float32 per-node ranking value (branch: fused reward; else mean descendant leaf reward)


# ---------------------------------------------------------------------------------------------
# Tree helpers (vectorised per depth; shared with pruning.py)


def depth_levels(parent: Tensor, depth: Tensor) -> list[Tensor]:
    """Node ids grouped by depth, shallowest first: [D+1] tensors of int64 ids.

    Checks that every parent is shallower than its child, which makes one pass per depth
    (deepest first for bottom-up, shallowest first for top-down) see complete values.
    """
    if parent.shape != depth.shape or parent.dim() != 1:
        raise ValueError(f"parent {tuple(parent.shape)} and depth {tuple(depth.shape)} must be equal [N]")
    nr = parent >= 0
    if bool((depth[parent[nr]] >= depth[nr]).any()):
        raise ValueError("every parent must be at a smaller depth than its child")
    if parent.numel() == 0:
        return []
    order = torch.argsort(depth, stable=True)
    counts = torch.bincount(depth - int(depth.min()))
    return [ids for ids in torch.split(order, counts.tolist()) if ids.numel()]


def subtree_sum(parent: Tensor, levels: list[Tensor], x: Tensor) -> Tensor:
    """[N] sum of x over each node's subtree (the node included): bottom-up, one step per depth."""
    out = x.clone()
    for ids in reversed(levels[1:]):
        kids = ids[parent[ids] >= 0]
        out.index_add_(0, parent[kids], out[kids])
    return out


def top_down_sum(parent: Tensor, levels: list[Tensor], x: Tensor) -> Tensor:
    """[N] sum of x over each node's ancestors and itself (root to node): one step per depth."""
    out = x.clone()
    for ids in levels[1:]:
        kids = ids[parent[ids] >= 0]
        out[kids] += out[parent[kids]]
    return out


def num_children(parent: Tensor) -> Tensor:
    """[N] int64 number of children of every node."""
    return torch.bincount(parent[parent >= 0], minlength=parent.numel())


def _softmax_backup(parent: Tensor, levels: list[Tensor], value: Tensor, logit: Tensor, subtree_mass: bool) -> Tensor:
    """[N] bottom-up value(p) = sum_c softmax_c(s_c) value(c) over p's children c; leaves keep value.

    s_c = logit[c] (+ mass(c) with subtree_mass, where mass(leaf) = 0, mass(p) = logsumexp_c s_c).
    With subtree_mass, value(n) = softmax over the leaves below n of (sum of logit on the path n->leaf).
    """
    val, mass = value.clone(), torch.zeros_like(value)
    for ids in reversed(levels[1:]):
        c = ids[parent[ids] >= 0]
        p = parent[c]  # [M]
        s = logit[c] + mass[c] if subtree_mass else logit[c]  # [M]
        mx = torch.full_like(val, -math.inf).scatter_reduce(0, p, s, "amax")
        e = torch.exp(s - mx[p])
        den = torch.zeros_like(val).index_add_(0, p, e)
        num = torch.zeros_like(val).index_add_(0, p, e * val[c])
        ps = torch.unique(p)
        val[ps] = num[ps] / den[ps]
        mass[ps] = mx[ps] + torch.log(den[ps])
    return val


def _stats(x: Tensor, key: Tensor, ddof: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-key mean, std (ddof) and count of x [M], each broadcast back to [M]."""
    _, inv = torch.unique(key, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    cnt = torch.zeros(k, dtype=x.dtype).index_add_(0, inv, torch.ones_like(x))
    mean = torch.zeros(k, dtype=x.dtype).index_add_(0, inv, x) / cnt
    ss = torch.zeros(k, dtype=x.dtype).index_add_(0, inv, (x - mean[inv]) ** 2)
    std = torch.sqrt(ss / (cnt - ddof).clamp(min=1))
    return mean[inv], std[inv], cnt[inv]


def _zscore(x: Tensor, key: Tensor, ddof: int, eps: float) -> Tensor:
    mean, std, _ = _stats(x, key, ddof)
    return (x - mean) / (std + eps)


# ---------------------------------------------------------------------------------------------
# Estimators


@dataclass
class Batch:
    """What an estimator reads: the batch's per-node tensors on the CPU."""

    parent: Tensor  # [N] int64
    depth: Tensor  # [N] int64
    tree: Tensor  # [N] int64
    group: Tensor  # [N] int64
    reward: Tensor  # [N] float64, NaN on internal nodes
    logp: Tensor  # [N] float64 edge log-prob, NaN -> 0
    levels: list[Tensor]
    leaf: Tensor  # [N] bool

    def leaf_mean(self, x: Tensor) -> Tensor:
        """[N] uniform mean of x over each node's descendant leaves."""
        on = self.leaf.to(torch.float64)
        return subtree_sum(self.parent, self.levels, torch.where(self.leaf, x, 0.0)) / subtree_sum(
            self.parent, self.levels, on
        )


EstimatorFn = Callable[[AdvantageConfig, Batch], Advantages]  # before the final clamp and float32


@dataclass(frozen=True)
class Estimator:
    """One registered advantage estimator (the `estimator` decorator makes it)."""

    name: str  # what advantage.estimator names it
    fn: EstimatorFn
    reads: tuple[str, ...]  # the AdvantageConfig keys it reads, besides OWN_KEYS (the others warn when set)


REGISTRY: dict[str, Estimator] = {}  # name -> Estimator, in registration order
ESTIMATORS = REGISTRY.keys()  # the names (a live view: an estimator registered later is listed too)
OWN_KEYS = ("estimator", "clamp")  # read by `estimate` itself, whatever the estimator


def estimator(name: str, reads: Sequence[str] = ()) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register the decorated function as the estimator `name` that reads the AdvantageConfig keys `reads`."""
    keys = {f.name for f in dataclasses.fields(AdvantageConfig)}
    unknown = sorted(set(reads) - keys)
    if unknown:
        raise ValueError(f"estimator {name!r} reads {', '.join(unknown)}: not AdvantageConfig keys")
    if name in REGISTRY:
        raise ValueError(f"estimator {name!r} is registered twice")

    def register(fn: EstimatorFn) -> EstimatorFn:
        REGISTRY[name] = Estimator(name, fn, tuple(reads))
        return fn

    return register


def choices() -> str:
    """The estimators' names for a help string: "flat" | "branch" | ..."""
    return " | ".join(f'"{name}"' for name in ESTIMATORS)


def readers(key: str) -> list[str]:
    """The estimators that read the AdvantageConfig key `key` (every one for OWN_KEYS)."""
    return [e.name for e in REGISTRY.values() if key in e.reads or key in OWN_KEYS]


def _batch(parent, depth, tree, group, reward, log_prob) -> Batch:
    n = parent.numel()
    for name, t in (("depth", depth), ("tree", tree), ("group", group), ("reward", reward), ("log_prob", log_prob)):
        if t.shape != (n,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({n},) like parent")
    parent, depth = parent.long().cpu(), depth.long().cpu()
    lp = log_prob.detach().cpu().double()
    return Batch(
        parent,
        depth,
        tree.long().cpu(),
        group.long().cpu(),
        reward.detach().cpu().double(),
        torch.nan_to_num(lp, nan=0.0),
        depth_levels(parent, depth),
        leaf_mask(parent),
    )


def from_leaves(cfg: AdvantageConfig, b: Batch, leaf_adv: Tensor) -> Advantages:
    """Path estimators: each edge gets the mean (or sum) of its descendant leaves' advantages."""
    x = torch.where(b.leaf, leaf_adv, 0.0)
    edge = subtree_sum(b.parent, b.levels, x)  # [N]
    if cfg.shared_edge == "mean":
        edge = edge / subtree_sum(b.parent, b.levels, b.leaf.to(torch.float64))
    valid = b.parent >= 0
    return Advantages(
        edge=torch.where(valid, edge, 0.0),
        valid=valid,
        leaf=torch.where(b.leaf, leaf_adv, math.nan),
        fused=b.leaf_mean(b.reward),
    )


@estimator("flat", reads=("ddof", "eps", "flat_std", "shared_edge"))
def _flat(cfg: AdvantageConfig, b: Batch) -> Advantages:
    ids = torch.nonzero(b.leaf).flatten()  # [L]
    r, g = b.reward[ids], b.group[ids]
    mean, std, _ = _stats(r, g, cfg.ddof)
    if cfg.flat_std == "global":
        std = torch.full_like(r, float(_stats(r, torch.zeros_like(g), cfg.ddof)[1][0]))
    adv = torch.full_like(b.reward, math.nan)
    adv[ids] = (r - mean) / (std + cfg.eps)
    return from_leaves(cfg, b, adv)


def _branch_fused(cfg: AdvantageConfig, b: Batch) -> Tensor:
    """[N] fused reward: uniform (beta 0), paper leaf softmax, or the code's recursive softmax."""
    if cfg.beta == 0:
        return torch.where(b.leaf, b.reward, b.leaf_mean(b.reward))
    return _softmax_backup(
        b.parent, b.levels, b.reward, cfg.beta * b.logp, subtree_mass=cfg.weighting == "leaf-softmax"
    )


@estimator("branch", reads=("ddof", "eps", "beta", "weighting", "min_std"))
def _branch(cfg: AdvantageConfig, b: Batch) -> Advantages:
    fused = _branch_fused(cfg, b)  # [N]
    key = b.tree * (int(b.depth.max()) + 1) + b.depth  # [N] (tree, depth)
    mean, std, cnt = _stats(fused, key, cfg.ddof)
    adv = torch.where(std < cfg.min_std, 0.0, (fused - mean) / (std + cfg.eps))
    valid = (cnt > 1) & (b.parent >= 0)
    adv = torch.where(valid, adv, 0.0)
    return Advantages(edge=adv, valid=valid, leaf=torch.where(b.leaf, adv, math.nan), fused=fused)


@estimator("treegrpo", reads=("ddof", "eps", "backup", "temperature"))
def _treegrpo(cfg: AdvantageConfig, b: Batch) -> Advantages:
    ids = torch.nonzero(b.leaf).flatten()  # [L]
    leaf = torch.full_like(b.reward, math.nan)
    leaf[ids] = _zscore(b.reward[ids], b.group[ids], cfg.ddof, cfg.eps)
    logit = b.logp / cfg.temperature if cfg.backup == "logprob" else torch.zeros_like(b.logp)
    edge = _softmax_backup(b.parent, b.levels, torch.nan_to_num(leaf), logit, subtree_mass=False)
    valid = b.parent >= 0
    return Advantages(edge=torch.where(valid, edge, 0.0), valid=valid, leaf=leaf, fused=b.leaf_mean(b.reward))


@estimator("treepo", reads=("ddof", "eps", "treepo_weight", "shared_edge"))
def _treepo(cfg: AdvantageConfig, b: Batch) -> Advantages:
    ids = torch.nonzero(b.leaf).flatten()  # [L]
    r = b.reward[ids]  # [L]
    _, g = torch.unique(b.group, return_inverse=True)  # [N] compact group
    on = b.leaf.to(torch.float64)
    gsize = torch.zeros(int(g.max()) + 1, dtype=torch.float64).index_add_(0, g, on)  # [G] leaves
    gsum = torch.zeros_like(gsize).index_add_(0, g, torch.where(b.leaf, b.reward, 0.0))
    gmean, gsize_n = (gsum / gsize)[g], gsize[g]  # [N]
    mean = b.leaf_mean(b.reward)  # [N] subtree mean
    size = subtree_sum(b.parent, b.levels, on)  # [N] subtree leaves
    # split ancestors whose leaf set is not the whole prompt group (identical sets count once)
    q = ((num_children(b.parent) >= 2) & (size < gsize_n)).to(torch.float64)  # [N]
    by_size = cfg.treepo_weight == "group_size"
    w = q * (size if by_size else 1.0)
    W = top_down_sum(b.parent, b.levels, w)[ids]  # [L] sum of weights
    WM = top_down_sum(b.parent, b.levels, w * mean)[ids]  # [L] sum w * mean
    gw = (gsize_n[ids] >= 2).to(torch.float64) * (gsize_n[ids] if by_size else 1.0)  # [L] whole group
    num, den = gw * (r - gmean[ids]) + W * r - WM, gw + W
    a = torch.where(den > 0, num / den.clamp(min=1e-300), 0.0)  # [L]
    # TreePO's pipeline drops prompt groups whose rewards all tie (DAPO's filter) before this estimator: their
    # leaves get 0 and the whitening is over the rest (on an irregular tree the rest's mean is not 0, and whitened
    # with them a tied group's leaves would all get the same nonzero value)
    lo = torch.full_like(gsize, math.inf).scatter_reduce_(0, g[ids], r, "amin")  # [G]
    keep = (lo != torch.full_like(gsize, -math.inf).scatter_reduce_(0, g[ids], r, "amax"))[g[ids]]  # [L]
    z = torch.zeros_like(a)
    z[keep] = _zscore(a[keep], torch.zeros_like(ids[keep]), cfg.ddof, cfg.eps)  # batch whitening
    leaf = torch.full_like(b.reward, math.nan)
    leaf[ids] = z
    return from_leaves(cfg, b, leaf)


def _finish(cfg: AdvantageConfig, a: Advantages) -> Advantages:
    edge = a.edge if cfg.clamp is None else a.edge.clamp(-cfg.clamp, cfg.clamp)
    return Advantages(edge=edge.float(), valid=a.valid, leaf=a.leaf.float(), fused=a.fused.float())


def estimate(
    cfg: AdvantageConfig,
    *,
    parent: Tensor,
    depth: Tensor,
    tree: Tensor,
    group: Tensor,
    reward: Tensor,
    log_prob: Tensor,
) -> Advantages:
    """Advantages of every edge of a batch of trees; all inputs [N] (see the module docstring)."""
    cfg.validate()
    b = _batch(parent, depth, tree, group, reward, log_prob)
    return _finish(cfg, REGISTRY[cfg.estimator].fn(cfg, b))


def combine(
    cfg: AdvantageConfig,
    *,
    parent: Tensor,
    depth: Tensor,
    tree: Tensor,
    group: Tensor,
    rewards: dict[str, Tensor],
    weights: dict[str, float],
    log_prob: Tensor,
    mode: str,
) -> Advantages:
    """Several rewards: "rewards" = estimate on sum_k w_k r_k; "advantages" (MixGRPO, TreeGRPO
    multi-reward) = sum_k w_k estimate(r_k), valid from the first reward, clamped after summing."""
    if mode not in COMBINE_MODES:
        raise ConfigError(f"reward.combine must be one of {', '.join(COMBINE_MODES)}; got {shown(mode)}")
    if not rewards:
        raise ConfigError("at least one reward is needed")
    if set(rewards) != set(weights):
        raise ConfigError(f"reward weights name {shown(sorted(weights))} but the rewards are {shown(sorted(rewards))}")
    names = list(rewards)
    nodes = {"parent": parent, "depth": depth, "tree": tree, "group": group, "log_prob": log_prob}
    if mode == "rewards":
        total = sum(float(weights[k]) * rewards[k].double() for k in names)
        assert isinstance(total, Tensor)  # rewards is not empty
        return estimate(cfg, reward=total, **nodes)
    raw = replace(cfg, clamp=None)
    parts = [(float(weights[k]), estimate(raw, reward=rewards[k], **nodes)) for k in names]
    edge, leaf, fused = (sum(w * getattr(a, f).double() for w, a in parts) for f in ("edge", "leaf", "fused"))
    valid = parts[0][1].valid
    return _finish(cfg, Advantages(edge=torch.where(valid, edge, 0.0), valid=valid, leaf=leaf, fused=fused))
