"""Tree rollout: every method is a tree of some shape.

Flat GRPO (DanceGRPO) is a root that splits into G independent children at step 0; Flow-GRPO is
G single-chain trees per prompt; MixGRPO is a flat tree whose steps outside a window are ODE;
BranchGRPO splits every frontier node into K children at a few steps; TreeGRPO splits at every
step of an SDE window inside an ODE trajectory.

The frontier of one denoising step, across all trees of the batch, goes through the model in one
batched forward (chunked by max_batch). One forward per parent gives the mean of all its children.
Every node's noise comes from its own generator, seeded by a hash of (seed, prompt id, tree, path),
so trees do not depend on batching, chunking or the number of processes.

Correlated branching (BranchGRPO): siblings share xi_0, child b adds its own eta_b,
    xi_b = (xi_0 + s*eta_b) / sqrt(1 + s^2)
so each child has exactly the one-step SDE marginal and siblings correlate by 1/(1+s^2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from .dynamic import (
    HEURISTICS,
    Inherited,
    Judge,
    Shape,
    TreeBudgets,
    check_shape,
    never,
    set_but_ignored,
    split_counts,
    tree_evals,
)
from .protocols import Kernel, Policy, select
from .tree import Tree

BRANCH_NOISES = ("correlated", "scaled")
MASK63 = (1 << 63) - 1
SHARED = -1  # child slot of the noise that siblings share
MAX_TREES_PER_PROMPT = 10_000  # stated maximum of tree.trees_per_prompt (Flow-GRPO samples 24 chains per prompt)

Progress = Callable[[str, int, int], None]  # (phase, done, total); the one progress callback type


@dataclass(frozen=True)
class TreeConfig:
    split_steps: tuple[int, ...] = ()  # steps at which every frontier node gets `branch` children
    branch: int = 2  # K children per split
    branch_noise: str = "correlated"  # "correlated" (paper) | "scaled" (released BranchGRPO code)
    branch_s: float = 4.0  # s of correlated branching; inf = independent children
    split_noise_scale: float = 4.0  # "scaled" only: independent noise times this, log-prob with the unscaled std
    sde_steps: tuple[int, ...] | None = None  # stochastic steps (None = all); split steps are always SDE
    trees_per_prompt: int = 1  # trees per prompt, each with its own root noise
    init_same_noise: bool = False  # one root noise for every tree of the rollout
    # TreePO's dynamic rollout and leaf budgets (engine/dynamic.py); the defaults keep the fixed tree
    dynamic: str = "off"  # "off" | "reward": x0-predictions' rewards | "distance": their RMS distance (no reward call)
    stop_tol: float = (
        0.0  # dynamic: within this of an earlier active node of the tree = a predicted tie: stop branching
    )
    transfer: bool = True  # dynamic: stopped paths hand their spare leaf budget to the tree's active nodes
    fallback: bool = True  # dynamic + transfer: a tree with no active node left re-activates its first stopped node
    width: int = 0  # leaves per tree; 0: the fixed tree's branch ** (split steps)
    max_evals: int = 0  # cap on one tree's forwards, never exceeded; 0: those of the undisturbed tree of `width`

    def validate(self, steps: int, decode: str) -> None:
        bad = [s for s in self.split_steps if not 0 <= s < steps]
        if bad:
            raise ConfigError(f"tree.split_steps {shown(bad)} outside the {steps} denoising steps 0..{steps - 1}")
        if len(set(self.split_steps)) != len(self.split_steps):
            raise ConfigError(f"tree.split_steps has repeated steps: {shown(list(self.split_steps))}")
        if self.split_steps and self.branch < 2:
            raise ConfigError(f"tree.branch must be >= 2 when splitting, got {self.branch}")
        if decode == "x0" and steps - 1 in self.split_steps:
            raise ConfigError(
                f"a split at the last step {steps - 1} yields identical images when decoding "
                "the x0-prediction; move it earlier or set sampler.decode = 'final'"
            )
        if self.branch_noise not in BRANCH_NOISES:
            raise ConfigError(
                f"tree.branch_noise must be one of {', '.join(BRANCH_NOISES)}; got {shown(self.branch_noise)}"
            )
        if not self.branch_s > 0:  # s = 0: every child gets the shared noise, all siblings identical
            raise ConfigError(f"tree.branch_s must be > 0 (inf: independent children), got {self.branch_s}")
        if self.trees_per_prompt < 1:
            raise ConfigError(f"tree.trees_per_prompt must be >= 1, got {self.trees_per_prompt}")
        if self.trees_per_prompt > MAX_TREES_PER_PROMPT:
            raise ConfigError(
                f"tree.trees_per_prompt = {self.trees_per_prompt:,} is more than the maximum of "
                f"{MAX_TREES_PER_PROMPT:,} trees per prompt"
            )
        if self.sde_steps is not None and any(not 0 <= s < steps for s in self.sde_steps):
            raise ConfigError(f"tree.sde_steps {shown(list(self.sde_steps))} outside 0..{steps - 1}")
        self._validate_budget(steps)

    def _validate_budget(self, steps: int) -> None:
        if self.dynamic not in HEURISTICS:
            raise ConfigError(f"tree.dynamic must be one of {', '.join(HEURISTICS)}; got {shown(self.dynamic)}")
        if not (self.stop_tol >= 0 and math.isfinite(self.stop_tol)):
            raise ConfigError(f"tree.stop_tol must be finite and >= 0, got {self.stop_tol}")
        for name in ("width", "max_evals"):
            if getattr(self, name) < 0:
                raise ConfigError(f"tree.{name} must be >= 0 (0: the fixed tree's), got {getattr(self, name)}")
        if self.width > 1 and not self._splits(steps):
            raise ConfigError(f"tree.width = {self.width} needs split steps (a tree without splits has one leaf)")
        if self.dynamic != "off" and len(self._splits(steps)) < 2:
            raise ConfigError(
                f"tree.dynamic = {shown(self.dynamic)} decides at the split steps after the first: it needs >= 2 "
                f"split steps and tree.split_steps has {shown(self._splits(steps))}; add split steps or set "
                'tree.dynamic = "off"'
            )
        need = tree_evals(self.shape(steps), steps, self.branch)
        if self.max_evals and self.max_evals < need:
            raise ConfigError(
                f"tree.max_evals = {self.max_evals} is below the {need} forwards of the tree itself (width "
                f"{self.shape(steps).width}); raise it or set 0"
            )

    def ignored(self) -> tuple[str, ...]:
        """The keys that take no effect at this tree.dynamic."""
        return ("stop_tol", "transfer", "fallback") if self.dynamic == "off" else ()

    def warnings(self, inherited: Inherited = never) -> list[str]:
        """Legal values that are almost surely a mistake: dynamic keys the user set with tree.dynamic off, a
        tolerance that stops nothing or everything, a group of one image."""
        out = set_but_ignored(self, self.ignored(), "tree.dynamic", inherited)
        if self.dynamic == "distance" and self.stop_tol == 0:
            out.append(
                "warning: tree.dynamic = 'distance' with tree.stop_tol = 0 stops only identical x0-predictions: "
                "set tree.stop_tol (treepo: 0.1)"
            )
        if self.dynamic == "distance" and self.stop_tol >= math.sqrt(2):
            out.append(
                f"warning: tree.stop_tol = {self.stop_tol:g} is at least the distance of two unrelated x0-predictions "
                "(about 1.41 of their RMS): nearly every node would stop (treepo: 0.1)"
            )
        if self.width == 1 and self.trees_per_prompt == 1:
            out.append(
                "warning: tree.width = 1 with tree.trees_per_prompt = 1: each prompt's group is one image, so every "
                "advantage is 0 and nothing trains"
            )
        return out

    def budgeted(self) -> bool:
        """Trees built from leaf budgets (engine/dynamic.py) rather than K children at every split."""
        return self.dynamic != "off" or self.width > 0 or self.max_evals > 0

    def shape(self, steps: int, width: int | None = None) -> Shape:
        """The tree's shape: its split steps and leaf budget (width, else tree.width, else the fixed tree's)."""
        splits = tuple(self._splits(steps))
        return Shape(splits, width or self.width or self.branch ** len(splits))

    def is_sde(self, step: int) -> bool:
        return self.sde_steps is None or step in self.sde_steps or step in self.split_steps

    def children(self, step: int) -> int:
        return self.branch if step in self.split_steps else 1

    def model_evals(self, steps: int) -> int:
        """Forwards per tree: one per node at depths 0..T-1, in closed form (no loop over the steps, so a
        bound on the count can be checked before the steps are); a budgeted tree's cap."""
        if self.budgeted():
            return self.max_evals or tree_evals(self.shape(steps), steps, self.branch)
        total, width, done = 0, 1, 0
        for s in self._splits(steps):  # steps done..s run at this width, then every node splits
            total += width * (s + 1 - done)
            width *= self.branch
            done = s + 1
        return total + width * (steps - done)

    def leaves(self, steps: int) -> int:
        """Leaves per tree (a budgeted tree's most: a dynamic one without transfer may end with fewer)."""
        return self.width or self.branch ** len(self._splits(steps))

    def _splits(self, steps: int) -> list[int]:
        return sorted({s for s in self.split_steps if 0 <= s < steps})


# --- seeds -----------------------------------------------------------------------------------


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def mix_seed(*values: int) -> int:
    """A 63-bit seed from a sequence of integers (order matters)."""
    h = 0x5EED
    for v in values:
        h = _splitmix64(h ^ (v & 0xFFFFFFFFFFFFFFFF))
    return h & MASK63


def node_noise(seed: int, shape: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """Standard normal noise [*shape] from the node's own generator, made on `device` (so a GPU rollout
    never uploads noise; CUDA's generator draws other numbers than the CPU's for the same seed)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32, device=device)


def branch_noise(
    cfg: TreeConfig,
    parent_seed: int,
    child_seeds: list[int],
    shape: tuple[int, ...],
    device: torch.device | str = "cpu",
) -> Tensor:
    """[K, *shape] unit-variance noise for the K children of one parent."""
    eta = torch.stack([node_noise(s, shape, device) for s in child_seeds])
    if len(child_seeds) == 1:
        return eta
    if cfg.branch_noise == "scaled":
        return eta * cfg.split_noise_scale
    if math.isinf(cfg.branch_s):
        return eta
    xi0 = node_noise(mix_seed(parent_seed, SHARED), shape, device)
    return (xi0 + cfg.branch_s * eta) / math.sqrt(1 + cfg.branch_s**2)


# --- rollout ---------------------------------------------------------------------------------


@dataclass
class _Level:
    """The nodes of one depth, built up before they are concatenated into the Tree."""

    parent: list[int] = field(default_factory=list)
    tree: list[int] = field(default_factory=list)
    child: list[int] = field(default_factory=list)
    seed: list[int] = field(default_factory=list)
    latent: list[Tensor] = field(default_factory=list)
    log_prob: list[Tensor] = field(default_factory=list)
    x0: list[Tensor] = field(default_factory=list)
    budget: list[int] = field(default_factory=list)  # each node's leaf budget (engine/dynamic.py)
    sde_in: list[bool] = field(default_factory=list)  # the edge into the node was a stochastic step with noise
    prev_x0: Tensor | None = None  # [F, ...] the parents' x0-predictions (a multistep solver's history), on device
    out: list[bool] = field(default_factory=list)  # each node on a path the dynamic rollout stopped (engine/dynamic.py)


def _roots(
    cfg: TreeConfig,
    prompt_ids: list[int],
    seed: int,
    shape: tuple[int, ...],
    earlier_ids: list[int] | tuple[int, ...] = (),
    device: torch.device | str = "cpu",
    widths: list[int] | None = None,
) -> _Level:
    """One root per tree. Its seed (which all its descendants' seeds derive from) is unique per
    (prompt id, tree); with init_same_noise only the root *latent* is shared by every tree."""
    lvl, seen = _Level(), dict[int, int]()  # seen: trees per prompt id so far
    for pid in earlier_ids:  # the same prompt in an earlier part of this batch
        seen[pid] = seen.get(pid, -1) + 1
    shared = node_noise(mix_seed(seed, SHARED, 0), shape, device) if cfg.init_same_noise else None
    for p, pid in enumerate(prompt_ids):
        rep = seen[pid] = seen.get(pid, -1) + 1  # a prompt listed twice gets further trees
        for j in range(cfg.trees_per_prompt):
            s = mix_seed(seed, pid, rep * cfg.trees_per_prompt + j)
            lvl.parent.append(-1)
            lvl.tree.append(p * cfg.trees_per_prompt + j)
            lvl.child.append(0)
            lvl.seed.append(s)
            lvl.latent.append(shared.clone() if shared is not None else node_noise(s, shape, device))
            lvl.log_prob.append(torch.tensor(float("nan")))
            lvl.budget.append(widths[p] if widths else 1)
            lvl.sde_in.append(False)
            lvl.out.append(False)
    return lvl


def _forward(policy: Policy, x: Tensor, sigma: Tensor, cond, rows: Tensor, max_batch: int) -> Tensor:
    """Velocity of every frontier node, in chunks of at most max_batch rows."""
    out = []
    with torch.no_grad():
        for a in range(0, x.shape[0], max_batch):
            sl = slice(a, a + max_batch)
            out.append(policy.velocity(x[sl], sigma[sl], select(cond, rows[sl])).float())
    return torch.cat(out)


def _noised(
    cfg: TreeConfig,
    sde: Kernel,
    *,
    lvl: _Level,
    kids: list[list[int]],
    noisy: list[bool],
    kid_sde: list[bool],
    std0: Tensor,
    reps: Tensor,
    mean: Tensor,
) -> tuple[Tensor, Tensor]:
    """The children's latents and log-probs [sum(counts)]: each SDE node's children get noise from their own seeds
    (correlated siblings) and one batched Gaussian step; an ODE node's children are its mean (log-prob NaN).
    kids[f]: node f's child seeds; std0, reps [F]: each node's step std and children; mean: the children's means."""
    dev, shape = mean.device, tuple(mean.shape[1:])
    lat, lp = mean, torch.full((mean.shape[0],), float("nan"), device=dev)
    if not any(noisy):
        return lat, lp
    xi = torch.cat([branch_noise(cfg, lvl.seed[f], kids[f], shape, dev) for f in range(len(noisy)) if noisy[f]])
    std = std0.to(dev).repeat_interleave(reps)  # [sum(counts)]
    view = (-1, *([1] * (mean.dim() - 1)))
    if all(noisy):
        lat = mean + std.view(view) * xi
        return lat, sde.log_prob(lat, mean, std)
    rows = torch.tensor(kid_sde, device=dev).nonzero().flatten()  # some trees split here, others do not
    lat = mean.clone()
    lat[rows] = mean[rows] + std[rows].view(view) * xi
    lp[rows] = sde.log_prob(lat[rows], mean[rows], std[rows])
    return lat, lp


def _expand(
    cfg: TreeConfig,
    sde: Kernel,
    step: int,
    lvl: _Level,
    first_id: int,
    v: Tensor,
    x: Tensor,
    trees: TreeBudgets,
    judge: Judge | None = None,
) -> _Level:
    """Children of every node of one frontier, from the batched velocity v [F, C, H, W]. Everything stays
    on x's device: the means, each node's noise (from its own seed), the Gaussian step and the log-probs."""
    n, dev = x.shape[0], x.device
    noisy = [
        (cfg.sde_steps is None or step in cfg.sde_steps or step in trees.shapes[t].split_steps) and sde.has_noise(step)
        for t in lvl.tree
    ]
    mixed = 0 < sum(noisy) < n
    if mixed and sde.cfg.solver != "euler":
        raise ConfigError("trees of one batch with different split steps need sampler.solver = 'euler'")
    res = sde.step(x, v, torch.full((n,), step, dtype=torch.long), torch.tensor(noisy), lvl.prev_x0)
    counts, budgets, out = split_counts(
        cfg,
        step,
        steps=sde.cfg.steps,
        node_tree=lvl.tree,
        node_budget=lvl.budget,
        x0=res.x0,
        trees=trees,
        judge=judge,
        node_out=lvl.out,
    )
    reps = torch.tensor(counts, device=dev)
    mean = res.mean.repeat_interleave(reps, dim=0)  # [sum(counts), C, H, W]
    kids = [[mix_seed(s, c) for c in range(k)] for s, k in zip(lvl.seed, counts, strict=True)]  # child seeds
    kid_sde = [z for z, k in zip(noisy, counts, strict=True) for _ in range(k)]
    lat, lp = _noised(cfg, sde, lvl=lvl, kids=kids, noisy=noisy, kid_sde=kid_sde, std0=res.std, reps=reps, mean=mean)
    last = step == sde.cfg.steps - 1
    nxt = _Level()
    for f in range(n):
        for c in range(counts[f]):
            nxt.parent.append(first_id + f)
            nxt.tree.append(lvl.tree[f])
            nxt.child.append(c)
            nxt.seed.append(kids[f][c])
        nxt.budget += budgets[f]
        nxt.out += [out[f]] * counts[f]
    nxt.sde_in = kid_sde
    nxt.latent, nxt.log_prob = list(lat.unbind(0)), list(lp.unbind(0))
    nxt.x0 = list(res.x0.repeat_interleave(reps, dim=0).unbind(0)) if last else []  # the last step's
    if sde.cfg.solver != "euler" and not any(noisy):  # a stochastic step restarts the multistep history
        nxt.prev_x0 = res.x0.repeat_interleave(reps, dim=0)
    return nxt


def _offload(lvl: _Level) -> _Level:
    """Copy a finished level's tensors to (pinned) host memory without waiting for the copy; the frontier
    keeps its device tensors for the next forward. Read only after _assemble synchronises."""

    def host(ts: list[Tensor]) -> list[Tensor]:
        if not ts or ts[0].device.type == "cpu":
            return ts
        stacked = torch.stack(ts)
        out = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
        out.copy_(stacked, non_blocking=True)
        return list(out.unbind(0))

    return _Level(
        lvl.parent,
        lvl.tree,
        lvl.child,
        lvl.seed,
        host(lvl.latent),
        host(lvl.log_prob),
        host(lvl.x0),
        lvl.budget,
        lvl.sde_in,
    )


def _trees(cfg: TreeConfig, prompts: list[str], steps: int, decode: str, shapes: list[Shape] | None) -> TreeBudgets:
    """Each tree's shape (one per prompt, its trees alike; None: the config's), cap on forwards and prompt."""
    shapes = shapes or [cfg.shape(steps)] * len(prompts)
    if len(shapes) != len(prompts):
        raise ConfigError(f"{len(shapes)} tree shapes for {len(prompts)} prompts")
    for sh in shapes:
        check_shape(sh, steps)
        if decode == "x0" and steps - 1 in sh.split_steps:
            raise ConfigError(f"a split at the last step {steps - 1} yields identical images when decoding x0")
    per_tree = [sh for sh in shapes for _ in range(cfg.trees_per_prompt)]
    own = [tree_evals(sh, steps, cfg.branch) for sh in per_tree]
    cap = [cfg.max_evals or e for e in own]
    if any(e > c for e, c in zip(own, cap, strict=True)):
        raise ConfigError(f"a tree of {max(own)} forwards is over tree.max_evals = {cfg.max_evals}")
    return TreeBudgets(per_tree, cap, [0] * len(per_tree), [p for p in prompts for _ in range(cfg.trees_per_prompt)])


def rollout(
    policy: Policy,
    prompts: list[str],
    prompt_ids: list[int],
    sde: Kernel,
    cfg: TreeConfig,
    seed: int,
    *,
    max_batch: int = 64,
    progress: Progress | None = None,
    earlier_ids: list[int] | tuple[int, ...] = (),
    shapes: list[Shape] | None = None,
    judge: Judge | None = None,
    stats: dict[str, int] | None = None,
) -> tuple[Tree, int]:
    """Roll out trees_per_prompt trees for every prompt. Returns the tree batch and its model evaluations.
    earlier_ids: the prompt ids of earlier parts of the same batch rolled out separately (shards), so that a
    prompt listed more than once gets the same further trees as in one call. shapes: each prompt's split steps
    and leaf budget (None: the config's); judge: scores x0-predictions for tree.dynamic = "reward"; stats, if
    given, has what the dynamic rollout did added to it (early_stops, fallbacks, judged_images, evals_fixed, ...)."""
    T = sde.cfg.steps
    cfg.validate(T, sde.cfg.decode)
    if max_batch < 1:
        raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
    shape = tuple(policy.latent_shape)
    device = next(iter(policy.trainable_parameters())).device
    cond = policy.encode(prompts)
    trees = _trees(cfg, prompts, T, sde.cfg.decode, shapes)
    widths = [sh.width for sh in trees.shapes[:: cfg.trees_per_prompt]]
    frontier = _roots(cfg, prompt_ids, seed, shape, earlier_ids, device, widths)
    levels, first_ids, nfe = [], [0], 0
    for i in range(T):
        lvl = frontier
        x = torch.stack(lvl.latent)
        rows = torch.tensor(lvl.tree, device=device) // cfg.trees_per_prompt
        sigma = torch.full((x.shape[0],), float(sde.sigmas[i]), device=device)
        v = _forward(policy, x, sigma, cond, rows, max_batch)
        nfe += x.shape[0] * policy.evals_per_row
        for t in lvl.tree:
            trees.spent[t] += 1
        first_ids.append(first_ids[-1] + len(lvl.parent))
        frontier = _expand(cfg, sde, i, lvl, first_ids[-2], v, x, trees, judge)
        levels.append(_offload(lvl))
        if progress:
            progress("rollout", i + 1, T)
    levels.append(_offload(frontier))
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # the pinned copies have landed
    if any(s > c for s, c in zip(trees.spent, trees.cap, strict=True)):
        raise RuntimeError(f"a tree ran past its cap on forwards: {trees.spent} > {trees.cap}")
    if stats is not None:
        _add_stats(stats, trees, T, cfg.branch, policy.evals_per_row, nfe)
    return _assemble(levels, cfg, sde, prompt_ids), nfe


def _add_stats(stats: dict[str, int], trees: TreeBudgets, steps: int, branch: int, per_row: int, nfe: int) -> None:
    """What the dynamic rollout did, added to `stats` (a batch may be rolled out in several calls: chunks, shards)."""
    fixed = sum(tree_evals(sh, steps, branch) for sh in trees.shapes) * per_row
    for key, n in {**trees.stats, "evals_fixed": fixed, "evals_saved": fixed - nfe}.items():
        stats[key] = stats.get(key, 0) + n


def _assemble(levels: list[_Level], cfg: TreeConfig, sde: Kernel, prompt_ids: list[int]) -> Tree:
    depth = torch.cat([torch.full((len(lvl.parent),), d, dtype=torch.long) for d, lvl in enumerate(levels)])
    sde_edge = torch.tensor([z for lvl in levels for z in lvl.sde_in], dtype=torch.bool)
    last = levels[-1]
    image = torch.stack(last.x0) if sde.cfg.decode == "x0" else torch.stack(last.latent)  # host tensors
    tree_prompt = torch.tensor(prompt_ids, dtype=torch.long).repeat_interleave(cfg.trees_per_prompt)
    return Tree(
        parent=torch.tensor([p for lvl in levels for p in lvl.parent], dtype=torch.long),
        depth=depth,
        tree=torch.tensor([t for lvl in levels for t in lvl.tree], dtype=torch.long),
        child=torch.tensor([c for lvl in levels for c in lvl.child], dtype=torch.long),
        sigma=sde.sigmas[depth].float(),
        sde=sde_edge,
        log_prob=torch.stack([lp for lvl in levels for lp in lvl.log_prob]).float(),
        seed=torch.tensor([s for lvl in levels for s in lvl.seed], dtype=torch.long),
        latent=torch.stack([x for lvl in levels for x in lvl.latent]).float(),
        image_latent=image.float(),
        tree_prompt=tree_prompt,
    )
