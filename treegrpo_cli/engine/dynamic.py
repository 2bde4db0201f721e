"""Leaf budgets and TreePO's dynamic rollout for diffusion trees (Li et al. 2025, arXiv 2508.17445; methods.md 16).

Budgets. Every node carries a leaf budget b: how many leaves its subtree ends with. A tree's root starts with
the tree's width w (by default the fixed tree's K^m leaves, m split steps). At split j of m (1-based), a node
with budget b branches into

    c(b) = min(b, max(K, ceil(b / K^(m - j))))

children that share b as evenly as possible (the first b mod c get one more): K children while the later
splits can still grow the subtree to b leaves, more only when they cannot, a chain (one child) once b = 1.
With b = K^(m - j + 1) this is the fixed tree, node for node: a budget of w = K^m changes nothing.

Dynamic rollout (tree.dynamic). At each split step after the first, every frontier node already has its
x0-prediction (the forward of this step made it). A heuristic reads it, per tree, in node order:

    reward    the x0-prediction's reward (a `judge` callback: decode and score; for cheap rewards)
    distance  the RMS distance between x0-predictions, over the RMS of the tree's x0-predictions (no reward
              call, the same tolerance whatever the latents' scale): a proxy for a tie

(the judge scores one tree's nodes at a time, so a tree's stops do not depend on the other trees of its batch,
only, as every forward does, on the last bits a batched forward may move: a value exactly at the tolerance could
fall either side) and clusters the nodes greedily: a node within tree.stop_tol of an earlier active node of its
tree is a predicted tie (its subtree would repeat that node's outcome) and stops branching: it goes on as a chain and
ends as one leaf, and from then on it is out (not judged, no leader, never given budget). A tree whose active
frontier is one cluster is predicted to tie as a whole: every node stops. Stopped paths hand their spare budget
(b - 1 each) to the tree's active nodes (those not stopped), evenly, the first ones one more (TreePO's
"fixed_avg" divergence); a tree left without an active node re-activates its first stopped node with budget
(the fallback: branching resumes from a surviving node), so every tree keeps its w leaves as far as the cap
below allows (a stopped chain shares no prefix with the rest, so the cap may take a unit or two back). Without
tree.transfer the spare budget is not spent (fewer leaves, fewer forwards) and the fallback, which moves it, does
nothing: a tree predicted to tie keeps only its chains, as without tree.fallback. A cap on the forwards of a tree
(tree.max_evals; by default those of the undisturbed tree of width w) is never exceeded: the transferred units are
taken back, last given first, until the tree's forwards so far plus the planned rest fit (the plan with no transfer
always fits: a chain costs no more than the subtree it replaces).

Departures from TreePO (LLM): a path there finishes early (a complete, shorter answer) and its budget moves on;
a diffusion path has no early end whose image the reward could score fairly (an x0-prediction at sigma 0.8 is
a blur), so a stopped path keeps denoising, unbranched, to a full image. TreePO's fallback truncates a finished
path at a random earlier segment and samples again; here the surviving frontier node takes the budget at the
split itself (no segment is sampled twice).

What this does to the estimator. Sampling stays the policy's: every child is drawn from its parent's SDE step
with its own seeded noise, and its log-probability is that transition's under the sampling policy. The
heuristic decides only how many children a node gets, from the node's own state (its x0-prediction), so it
selects which samples exist: predicted ties get fewer leaves, distinct nodes more. No importance weight
undoes this (the choice is deterministic given the state, not an action of the policy). Estimators that
average over leaves (flat, treepo, treegrpo's group z-score, the fused mean of branch) then weight a
subtree by its leaf count: the group baseline leans toward the nodes that received budget. branch's
per-depth z-score counts each node once per depth whatever its leaves, so only the precision of its fused
value changes. The metrics row reports the stops (early_stops), fallbacks and forwards saved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, shown

HEURISTICS = ("off", "reward", "distance")

Judge = Callable[[Tensor, list[str]], Tensor]  # x0-predictions [F, ...] (on device), their prompts -> scores [F]

# inherited(key, switch): `key` got its value from an earlier config layer than `switch` (a preset's tuning that a
# later --set switched off), so a "set, but ignored" warning would blame the user for the preset
Inherited = Callable[[str, str], bool]


def never(key: str, switch: str) -> bool:
    return False


def set_but_ignored(section: Any, names: Sequence[str], switch: str, inherited: Inherited = never) -> list[str]:
    """The one-line warning for the keys `names` of a config `section` set away from their defaults, and not
    inherited, that its `switch` (e.g. "tree.dynamic") ignores at its value; [] when there are none."""
    prefix, attr = switch.split(".")
    default = type(section)()
    unused = [
        f"{prefix}.{k}"
        for k in names
        if getattr(section, k) != getattr(default, k) and not inherited(f"{prefix}.{k}", switch)
    ]
    them = "them" if len(unused) > 1 else "it"
    value = getattr(section, attr)
    return [f"warning: {', '.join(unused)} set, but {switch} = {value!r} ignores {them}"] if unused else []


@dataclass(frozen=True)
class Shape:
    """One tree's shape: its split steps (ascending) and its leaf budget."""

    split_steps: tuple[int, ...]
    width: int


def children(b: int, branch: int, later: int) -> int:
    """c(b): children of a node with budget b at a split followed by `later` more splits."""
    if b < 1:
        raise ValueError(f"a node's leaf budget must be >= 1, got {b}")
    return min(b, max(branch, -(-b // branch**later)))


def share(b: int, c: int) -> list[int]:
    """b leaves over c children, as evenly as possible, the first ones one more."""
    return [b // c + (i < b % c) for i in range(c)]


@lru_cache(maxsize=65536)
def subtree_evals(b: int, j: int, splits: tuple[int, ...], steps: int, branch: int) -> int:
    """Forwards of the subtree below a node with budget b at split index j (0-based) of `splits`, not counting the
    node's own forward at that step (already run when the split is decided)."""
    c = children(b, branch, len(splits) - 1 - j)
    if j == len(splits) - 1:
        return b * (steps - 1 - splits[j])  # every leaf's chain after the last split
    seg = splits[j + 1] - splits[j]  # forwards of a child up to and including the next split
    q, r = divmod(b, c)  # share(b, c) in closed form: r children of q + 1 leaves, c - r of q
    more = r * (seg + subtree_evals(q + 1, j + 1, splits, steps, branch)) if r else 0
    return more + (c - r) * (seg + subtree_evals(q, j + 1, splits, steps, branch))


def tree_evals(shape: Shape, steps: int, branch: int) -> int:
    """Forwards of a whole tree of this shape when nothing stops (rows; times evals_per_row for CFG)."""
    if not shape.split_steps:
        return steps
    s = shape.split_steps
    return s[0] + 1 + subtree_evals(shape.width, 0, s, steps, branch)


def check_shape(shape: Shape, steps: int) -> None:
    s = shape.split_steps
    if list(s) != sorted(set(s)) or any(not 0 <= x < steps for x in s):
        raise ConfigError(
            f"a tree's split steps {shown(list(s))} must be distinct, ascending and within 0..{steps - 1}"
        )
    if shape.width < 1 or (not s and shape.width != 1):
        raise ConfigError(f"a tree's width must be >= 1 (exactly 1 without split steps), got {shape.width}")


# --- the heuristic ----------------------------------------------------------------------------


def tie_leaders(values: Tensor, trees: Sequence[int], tol: float) -> list[int]:
    """Greedy leader clustering per tree, in node order: each node's leader (the first earlier leader of its tree
    within tol: a predicted tie), or -1 where it leads. values [F] (a score) or [F, D] (a flattened x0-prediction);
    a node is within tol of another when |v - v'| <= tol, or for vectors when the RMS of v - v' is <= tol."""
    v = values.detach().double().cpu()
    v = v.view(v.shape[0], -1)
    leader, leaders = [-1] * len(trees), dict[int, list[int]]()
    for n, t in enumerate(trees):
        own = leaders.setdefault(t, [])
        if own:
            d = (v[own] - v[n]).pow(2).mean(1).sqrt()  # [leaders]
            near = torch.nonzero(d <= tol).flatten()
            if len(near):
                leader[n] = own[int(near[0])]
                continue
        own.append(n)
    return leader


def tie_verdicts(values: Tensor, trees: Sequence[int], tol: float) -> list[bool]:
    """Per frontier node, in node order: stop (a predicted tie) or not (tie_leaders: a node with a leader stops);
    a tree of >= 2 nodes and one cluster stops all."""
    leader = tie_leaders(values, trees, tol)
    size, clusters = dict[int, int](), dict[int, int]()
    for n, t in enumerate(trees):
        size[t] = size.get(t, 0) + 1
        clusters[t] = clusters.get(t, 0) + (leader[n] < 0)
    return [leader[n] >= 0 or (size[t] >= 2 and clusters[t] == 1) for n, t in enumerate(trees)]


def distance_values(x0: Tensor, node_tree: Sequence[int]) -> Tensor:
    """[F, D] each node's flattened x0-prediction over the RMS of its tree's: a tolerance on their distance is then
    relative, whatever the latents' scale (the `distance` heuristic's values)."""
    values = x0.flatten(1).double().cpu()
    _, inv = torch.unique(torch.tensor(list(node_tree)), return_inverse=True)
    sq = torch.zeros(int(inv.max()) + 1, dtype=torch.float64).index_add_(0, inv, values.pow(2).mean(1))
    size = torch.bincount(inv).double()
    return values / (sq / size).sqrt().clamp(min=1e-12)[inv].unsqueeze(1)


# --- one tree's split -------------------------------------------------------------------------


@dataclass
class SplitPlan:
    budget: list[int]  # each frontier node's budget after the decision
    counts: list[int]  # its children
    stopped: int  # nodes that stopped branching (had budget to give)
    fallback: bool  # a stopped node was re-activated
    taken_back: int  # transferred units the cap took back
    out: list[bool] = field(default_factory=list)  # each node on a stopped path from here on (a chain to one leaf)


def plan_split(
    budgets: list[int],
    stop: list[bool],
    *,
    cost: Callable[[int], int],
    branch: int,
    later: int,
    room: int,
    transfer: bool = True,
    fallback: bool = True,
) -> SplitPlan:
    """The split of one tree's frontier: budgets and stop verdicts in node order (True also for a node already on a
    stopped path); cost(b) the forwards below a node with budget b; room = the cap minus the tree's forwards so far
    (what the plan may still spend). Only nodes not stopped receive the spare budget."""
    stopped = [s and b >= 2 for s, b in zip(stop, budgets, strict=True)]
    new = [1 if s else b for s, b in zip(stopped, budgets, strict=True)]
    spare = sum(b - 1 for s, b in zip(stopped, budgets, strict=True) if s) if transfer else 0
    active = [i for i, s in enumerate(stop) if not s]  # a predicted tie gets no budget, whatever its own
    fell = False
    if spare and not active and fallback:
        active, fell = [stopped.index(True)], True
    units = [active[u % len(active)] for u in range(spare)] if active else []
    for i in units:
        new[i] += 1
    total, back = sum(cost(b) for b in new), 0
    while total > room and units:  # the cap: the last-given transferred units come back first
        i = units.pop()
        total += cost(new[i] - 1) - cost(new[i])
        new[i] -= 1
        back += 1
    if total > room:
        raise ValueError(f"a split plan needs {total} forwards with only {room} left under the cap")
    out = [s and i not in active for i, s in enumerate(stop)]
    return SplitPlan(new, [children(b, branch, later) for b in new], sum(stopped), fell, back, out)


# --- a rollout's splits ---------------------------------------------------------------------------


@dataclass
class TreeBudgets:
    """Per tree of a rollout batch: its shape, its cap on forwards, the forwards so far and its prompt; what the
    dynamic rollout did (early_stops, fallbacks, judged_images, taken_back)."""

    shapes: list[Shape]
    cap: list[int]
    spent: list[int]
    prompts: list[str]
    stats: dict[str, int] = field(default_factory=dict)  # early_stops, fallbacks, judged_images, taken_back


def split_counts(
    cfg: Any,
    step: int,
    *,
    steps: int,
    node_tree: list[int],
    node_budget: list[int],
    x0: Tensor,
    trees: TreeBudgets,
    judge: Judge | None,
    node_out: list[bool] | None = None,
) -> tuple[list[int], list[list[int]], list[bool]]:
    """Children of every frontier node (its tree node_tree[f], budget node_budget[f], node_out[f]: on a stopped path;
    x0 [F, ...] the step's x0-predictions), their budgets and whether each node is on a stopped path after this
    step (its children inherit it): c(b) at a tree's split steps, after the heuristic's stops from its second split
    on; one child elsewhere. cfg: the TreeConfig (branch, dynamic, stop_tol, transfer, fallback)."""
    n, T = len(node_tree), steps
    out = list(node_out) if node_out is not None else [False] * n
    counts, budgets = [1] * n, [[b] for b in node_budget]
    at: dict[int, list[int]] = {}  # tree -> its frontier nodes, when this step is one of its splits
    for f, t in enumerate(node_tree):
        if step in trees.shapes[t].split_steps:
            at.setdefault(t, []).append(f)
    if not at:
        return counts, budgets, out
    stop = _verdicts(cfg, step, node_tree, x0, trees, {t: [f for f in fs if not out[f]] for t, fs in at.items()}, judge)
    for t, nodes in at.items():
        splits = trees.shapes[t].split_steps
        j = splits.index(step)
        plan = plan_split(
            [node_budget[f] for f in nodes],
            [stop.get(f, False) or out[f] for f in nodes],
            cost=functools.partial(_below, j=j, splits=splits, steps=T, branch=cfg.branch),
            branch=cfg.branch,
            later=len(splits) - 1 - j,
            room=trees.cap[t] - trees.spent[t],
            transfer=cfg.transfer,
            fallback=cfg.fallback,
        )
        for f, b, c, o in zip(nodes, plan.budget, plan.counts, plan.out, strict=True):
            counts[f], budgets[f], out[f] = c, share(b, c), o
        for key, value in (
            ("early_stops", plan.stopped),
            ("fallbacks", int(plan.fallback)),
            ("taken_back", plan.taken_back),
        ):
            trees.stats[key] = trees.stats.get(key, 0) + value
    return counts, budgets, out


def _below(b: int, j: int, splits: tuple[int, ...], steps: int, branch: int) -> int:
    return subtree_evals(b, j, splits, steps, branch)


def _verdicts(
    cfg: Any, step: int, node_tree: list[int], x0: Tensor, trees: TreeBudgets, at: dict[int, list[int]], judge
) -> dict[int, bool]:
    """The heuristic's stop verdict of every node of `at` (a tree's nodes not on a stopped path) at a split after its
    tree's first (engine/dynamic.py)."""
    nodes = [f for t, fs in at.items() if trees.shapes[t].split_steps[0] != step for f in fs]
    if cfg.dynamic == "off" or not nodes:
        return {}
    idx = torch.tensor(nodes, device=x0.device)
    if cfg.dynamic == "reward":
        if judge is None:
            raise ConfigError("tree.dynamic = 'reward' scores x0-predictions with the run's reward: no judge given")
        parts = []  # one call per tree: its scores cannot depend on which other trees share the batch
        for t in dict.fromkeys(node_tree[f] for f in nodes):
            mine = [f for f in nodes if node_tree[f] == t]
            parts.append(judge(x0[torch.tensor(mine, device=x0.device)], [trees.prompts[t]] * len(mine)).double().cpu())
        values = torch.cat(parts)
        trees.stats["judged_images"] = trees.stats.get("judged_images", 0) + len(nodes)
    else:
        values = distance_values(x0[idx], [node_tree[f] for f in nodes])
    stop = tie_verdicts(values, [node_tree[f] for f in nodes], cfg.stop_tol)
    return dict(zip(nodes, stop, strict=True))
