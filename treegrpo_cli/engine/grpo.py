"""The GRPO update over the trained edges of a batch of trees.

Per trained edge e = (parent p -> child c) with stored behaviour log-prob l_old and advantage A:

    rho_e = exp(l_new - l_old),   L_e = max(-A*rho_e, -A*clip(rho_e, 1-eps, 1+eps))

and the loss of an optimizer step is the mean of L_e over its trained edges (`loss_norm = "mean"`,
BranchGRPO's objective), the mean over its parents of the sum of each parent's children's L_e
(`"node-sum"`, TreeGRPO's released code), or BranchGRPO's and DanceGRPO's per-transition accumulation
(`"per-transition"`: a step every `accum_edges` edges). One forward at a parent gives the SDE
mean for all of its children, so every child edge's ratio comes from that one forward (TreeGRPO's
amortisation). Parents go through the model in chunks of max_batch, like the rollout's frontier.

Optional KL to a reference policy (Flow-GRPO): beta * ||mu_theta - mu_ref||^2 / (2 std^2), per edge.

GRPO-Guard (engine/ratio_guard.py): `ratio_norm` replaces rho_e by RatioNorm's step-normalised ratio (the behaviour
means it needs come from forwards without gradient), `step_reweight` multiplies L_e by 1 / (sigma_t - sigma_t+1).
Flow-DPPO (engine/kl_mask.py): `trust = "kl-mask"` replaces the clip by -A*rho_e, zeroed past a KL to the behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from . import kl_mask as km
from . import ratio_guard as rg
from .kl_mask import kl_to_reference
from .protocols import Conditions, Kernel, Policy, select
from .sde import gaussian_log_prob
from .tree import Tree
from .update import UPDATES, Context, Credited, Update, register_update

LOSS_NORMS = ("mean", "node-sum", "per-transition")
TRANSITION_NORMS = ("tree", "accum")
KL_FORMS = ("paper", "code")
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class TrainConfig:
    iterations: int = 100  # online iterations (rollout, score, update)
    lr: float = 1e-5  # AdamW's learning rate
    # how the learning rate moves over the run, by iteration (every optimizer step of iteration i takes one rate, the
    # metrics row's lr): "constant" | "linear" | "cosine": after the warm-up, from lr at iteration warmup_iterations
    # down toward lr x lr_min_ratio at train.iterations: lr x (r + (1 - r) f), r = lr_min_ratio, f = 1 - t (linear)
    # or (1 + cos(pi t)) / 2 (cosine), t = (i - warmup_iterations) / (iterations - warmup_iterations). A function of
    # the iteration, so a resumed run repeats it; extending a run with --iterations moves the rest of its decay
    lr_schedule: str = "constant"
    warmup_iterations: int = 0  # a linear warm-up: iteration i < warmup_iterations trains at lr x (i + 1) /
    # (warmup_iterations + 1), then the schedule starts at lr (0 = off)
    lr_min_ratio: float = 0.0  # linear, cosine: the decay's floor as a fraction of lr, in [0, 1] (0: toward 0)
    weight_decay: float = 1e-4  # AdamW's decoupled weight decay (each step scales the weights by 1 - lr x weight_decay
    # at that step's rate; 0 = off)
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.999  # AdamW's second-moment decay
    clip_range: float = 1e-3  # eps of the ratio clip (BranchGRPO 1e-3; DanceGRPO, Flow-GRPO 1e-4)
    max_grad_norm: float = 1.0  # the gradient's global norm is clipped to this before each optimizer step
    minibatches: int = 1  # optimizer steps per iteration: parents split at random into this many parts
    loss_norm: str = "mean"  # "mean" over the trained edges (paper) | "node-sum": a parent's children's losses summed,
    # mean over parents (TreeGRPO's code) | "per-transition": a step every accum_edges edges (BranchGRPO's code)
    accum_edges: int = 12  # per-transition: an optimizer step every this many edges ...
    accum_trees: int = 0  # ... of every this many trees of the batch (the launch script's trees per process, whose
    # gradients its processes average: BranchGRPO 2), i.e. accum_edges x trees / accum_trees edges a step; 0: per batch
    transition_norm: str = "tree"  # per-transition: each edge's loss / (accum_edges x trained edges per tree), as the
    # released BranchGRPO code | "accum": / accum_edges only
    kl_beta: float = 0.0  # KL to the reference (initial) policy, Flow-GRPO form; 0 = off
    kl_form: str = "paper"  # "paper": |mu - mu_ref|^2 / (2 std^2), std = g sqrt(-dsigma) | "code": / (2 g^2)
    ratio_norm: str = "none"  # GRPO-Guard's RatioNorm (arXiv 2510.22319; engine/ratio_guard.py, methods.md 19), any
    # GRPO preset: "none" | "paper": each edge's log-ratio (l - l_old + |mu - mu_old|^2 / (2 s^2)) s, s the step's std,
    # mu_old the behaviour mean | "code": |mu - mu_old|^2 is its mean over the optimizer step's edges of the step (the
    # flow_grpo script). Costs a forward without gradient of each parent trained after the first optimizer step
    # ("code": one more). Needs sampler.log_prob_form = "gaussian"
    step_reweight: str = "none"  # GRPO-Guard's gradient reweighting: "none" | "dt": each edge's clipped loss x 1 /
    # (sigma_t - sigma_t+1), its step's size (the paper, the flow_grpo script; not Flow-Factory); KL keeps its weight
    trust: str = "clip"  # the trust region: "clip" the ratio | "kl-mask": Flow-DPPO (arXiv 2606.11025; methods.md 20),
    # -A rho, zeroed where KL(behaviour || new) of the edge's step >= kl_mask_threshold and the move goes away from it
    kl_mask_threshold: float = 0.0  # kl-mask's delta, in the reduction's units (0: the released recipe's 1e-5 per
    # latent element, x D with "sum": the same mask either way)
    kl_mask_reduction: str = "sum"  # "sum" over latent elements, the exact KL (paper) | "mean": / D (UniRL's code)
    ema_decay: float = 0.0  # EMA of the weights used by eval; 0 = off
    ema_every: int = 1  # an EMA update after optimizer step s (counted over the run) when (s + 1) % ema_every == 0, as
    # Flow-GRPO's EMAModuleWrapper (its code: 8); 0 = once per iteration, after its last step (DanceGRPO's code)
    ema_warmup: bool = False  # decay min((1 + s) / (10 + s), ema_decay) at optimizer step s (Flow-GRPO's code)
    objective: str = "grpo"  # "grpo": the clipped policy gradient on SDE edges | "nft": DiffusionNFT on the leaves
    # (engine/nft.py, the [nft] section) | "awm": Advantage Weighted Matching on the leaves (engine/awm.py, [awm])
    # | "dgpo": DGPO, a prompt's leaves one group (engine/dgpo.py, [dgpo])

    def validate(self) -> None:
        if self.loss_norm not in LOSS_NORMS:
            raise ConfigError(f"train.loss_norm must be one of {', '.join(LOSS_NORMS)}; got {shown(self.loss_norm)}")
        if self.transition_norm not in TRANSITION_NORMS:
            raise ConfigError(
                f"train.transition_norm must be one of {', '.join(TRANSITION_NORMS)}; got {shown(self.transition_norm)}"
            )
        self._validate_lr()
        if self.objective not in UPDATES:  # every registered update (engine/update.py)
            raise ConfigError(f"train.objective must be one of {', '.join(UPDATES)}; got {shown(self.objective)}")
        if self.kl_form not in KL_FORMS:
            raise ConfigError(f"train.kl_form must be one of {', '.join(KL_FORMS)}; got {shown(self.kl_form)}")
        for name, allowed in (("ratio_norm", rg.RATIO_NORMS), ("step_reweight", rg.STEP_REWEIGHTS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"train.{name} must be one of {', '.join(allowed)}; got {shown(getattr(self, name))}")
        km.validate(self)
        if not isinstance(self.ema_every, int) or self.ema_every < 0:
            raise ConfigError(
                f"train.ema_every must be an integer >= 0 (0 = once per iteration); got {shown(self.ema_every)}"
            )
        if not isinstance(self.accum_trees, int) or self.accum_trees < 0:
            raise ConfigError(f"train.accum_trees must be an integer >= 0 (0 = off); got {shown(self.accum_trees)}")
        for name in ("iterations", "minibatches", "accum_edges"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "clip_range", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"train.{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"train.ema_decay must be in [0, 1) (0 = off), got {self.ema_decay}")
        if not self.kl_beta >= 0:
            raise ConfigError(f"train.kl_beta must be >= 0 (0 = off), got {self.kl_beta}")

    def _validate_lr(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(
                f"train.lr_schedule must be one of {', '.join(LR_SCHEDULES)}; got {shown(self.lr_schedule)}"
            )
        if not isinstance(self.warmup_iterations, int) or self.warmup_iterations < 0:
            raise ConfigError(
                f"train.warmup_iterations must be an integer >= 0 (0 = off); got {shown(self.warmup_iterations)}"
            )
        if not 0 <= self.lr_min_ratio <= 1:
            raise ConfigError(f"train.lr_min_ratio must be in [0, 1], got {self.lr_min_ratio}")
        if not 0 <= self.weight_decay < math.inf:
            raise ConfigError(f"train.weight_decay must be >= 0 (0 = off), got {self.weight_decay}")

    def warnings(self) -> list[str]:
        """Legal learning-rate settings that are almost surely a mistake, one line each."""
        out = []
        if self.warmup_iterations >= self.iterations:
            out.append(
                f"warning: train.warmup_iterations = {self.warmup_iterations} is not below train.iterations = "
                f"{self.iterations}: the learning rate never reaches train.lr"
            )
        if self.lr_schedule == "constant" and self.lr_min_ratio != TrainConfig.lr_min_ratio:
            out.append('warning: train.lr_min_ratio set, but train.lr_schedule = "constant" ignores it')
        keys = [f"train.{k}" for k in ("ratio_norm", "step_reweight", "trust") if getattr(self, k) not in km.OFF]
        if keys and self.objective != "grpo":
            out.append(f"warning: {', '.join(keys)} set, but train.objective = {self.objective} ignores it")
        return out + km.warnings(self, TrainConfig())


def lr_at(cfg: TrainConfig, iteration: int) -> float:
    """The learning rate of every optimizer step of iteration `iteration` (from 0): train.lr_schedule after
    train.warmup_iterations of linear warm-up. A function of the iteration alone, so a resumed run repeats it."""
    warm = cfg.warmup_iterations
    if iteration < warm:
        return cfg.lr * (iteration + 1) / (warm + 1)
    if cfg.lr_schedule == "constant":
        return cfg.lr
    t = min((iteration - warm) / max(cfg.iterations - warm, 1), 1.0)
    f = 1.0 - t if cfg.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    floor = cfg.lr_min_ratio
    return cfg.lr * (floor + (1.0 - floor) * f)


def make_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW at train.lr (the trainer sets each iteration's rate, lr_at, before its update)."""
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group's learning rate, for the optimizer steps that follow."""
    for group in opt.param_groups:
        group["lr"] = lr


def clip_objective(ratio: Tensor, adv: Tensor, clip: float) -> Tensor:
    """[E] the pessimistic PPO loss max(-A r, -A clip(r, 1 - eps, 1 + eps)) of the ratios r [E]."""
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))


def clipped_loss(new_lp: Tensor, old_lp: Tensor, adv: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """[E] per-edge pessimistic PPO loss and ratio."""
    ratio = torch.exp(new_lp - old_lp)
    return clip_objective(ratio, adv, clip), ratio


@dataclass
class Batch:
    """What one update needs from a scored tree batch."""

    tree: Tree
    trained: Tensor  # [N] bool, edges in the backward pass
    advantage: Tensor  # [N] float32, edge advantages (already clamped)
    cond: Conditions  # one row per tree of the batch


@dataclass
class Parallel:
    """How one rank of a data-parallel update takes part (dist.py): its edges of every optimizer step of
    the global plan (the same number of steps on every rank, some maybe empty), each step's global loss
    divisor, a gradient sum over ranks and a concatenation of per-edge tensors over ranks. A sharded
    model (FSDP) runs collectives in every forward and backward: `chunks` then gives, per step, the
    number of forward/backward chunks every rank runs (a rank with fewer pads with zero-weight ones)."""

    minibatches: list[Tensor]
    denominators: list[float]
    sync: Callable[[list[torch.nn.Parameter]], None]
    gather: Callable[[Tensor], Tensor]
    chunks: list[int] | None = None
    clip: Callable[[list[torch.nn.Parameter], float], float] | None = None  # a sharded model's gradient clipping


def canonical_key(tree: Tree) -> Tensor:
    """[N] int64 (tree index, position among the tree's nodes): the same for a batch rolled out in one
    process or in rank-sized parts and concatenated, so the minibatch plan does not depend on the layout."""
    t, n = tree.tree, tree.num_nodes
    order = torch.argsort(t, stable=True)
    counts = torch.bincount(t, minlength=int(t.max()) + 1 if n else 0)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.empty_like(t)
    pos[order] = torch.arange(n) - starts[t[order]]
    return t * max(n, 1) + pos


def minibatches(b: Batch, cfg: TrainConfig, gen: torch.Generator) -> list[Tensor]:
    """Lists of trained child-node ids; a parent's children always stay together ("mean", "node-sum")."""
    edges = torch.nonzero(b.trained).flatten()
    key = canonical_key(b.tree)
    if cfg.loss_norm == "per-transition":
        edges = edges[torch.argsort(key[edges])]
        edges = edges[torch.randperm(len(edges), generator=gen)]
        return list(edges.split(step_edges(cfg, b.tree.num_trees)))
    parents = torch.unique(b.tree.parent[edges])
    parents = parents[torch.argsort(key[parents])]
    parents = parents[torch.randperm(len(parents), generator=gen)]
    groups = parents.tensor_split(min(cfg.minibatches, max(len(parents), 1)))
    owner = b.tree.parent[edges]
    return [edges[torch.isin(owner, g)] for g in groups if len(g)]


@dataclass
class EdgeTerms:
    """One chunk's forward: per edge [E] the new log-prob (with grad), the KL and the parent's slot; per parent [P]
    the SDE mean [P, C, H, W] (with grad), its std and its step (on the CPU); the model evaluations it took."""

    new_lp: Tensor
    kl: Tensor | None
    evals: int
    mean: Tensor
    std: Tensor
    step: Tensor
    slot: Tensor


def _edge_terms(
    policy: Policy, sde: Kernel, b: Batch, edges: Tensor, ref: Policy | None, kl_form: str = "paper"
) -> tuple[Tensor, Tensor | None, int]:
    """New log-probs [E] (with grad) and KL [E] of a chunk of edges, from one forward per parent."""
    e = _edge_step(policy, sde, b, edges, ref, kl_form)
    return e.new_lp, e.kl, e.evals


def _edge_step(
    policy: Policy, sde: Kernel, b: Batch, edges: Tensor, ref: Policy | None, kl_form: str = "paper"
) -> EdgeTerms:
    """A chunk of edges through the model: one forward per parent gives every child edge's terms."""
    t = b.tree
    parents, slot = torch.unique(t.parent[edges], return_inverse=True)  # [P], [E]
    dev = next(iter(policy.trainable_parameters())).device
    x = t.latent[parents].to(dev)
    sigma, step = t.sigma[parents].to(dev), t.depth[parents]
    cond = select(b.cond, t.tree[parents].to(dev))
    v = policy.velocity(x, sigma, cond)
    res = sde.step(x, v, step, torch.ones(len(parents), dtype=torch.bool))
    child = t.latent[edges].to(dev)
    new_lp = gaussian_log_prob(child, res.mean[slot], res.std[slot].to(dev), sde.cfg.log_prob_reduction)
    kl = None
    if ref is not None:
        with torch.no_grad():
            ref_mean = sde.step(x, ref.velocity(x, sigma, cond), step, torch.ones(len(parents), dtype=torch.bool)).mean
        dsigma = (sde.sigmas[step + 1] - sde.sigmas[step]).to(dev)  # [P], < 0
        kl = kl_to_reference(res.mean, ref_mean, res.std.to(dev), dsigma, kl_form)[slot]
    return EdgeTerms(new_lp, kl, len(parents) * policy.evals_per_row, res.mean, res.std.to(dev), step, slot)


UpdateHook = Callable[[], None]


def loss_denominators(b: Batch, cfg: TrainConfig, plan: list[Tensor]) -> list[float]:
    """The divisor of each optimizer step's summed edge losses."""
    if cfg.loss_norm == "mean":
        return [float(len(mb)) for mb in plan]
    if cfg.loss_norm == "node-sum":
        return [float(len(torch.unique(b.tree.parent[mb]))) for mb in plan]
    per_tree = _edges_per_tree(b) if cfg.transition_norm == "tree" else 1.0
    return [step_edges(cfg, b.tree.num_trees) * per_tree for _ in plan]


def step_edges(cfg: TrainConfig, trees: int) -> int:
    """Edges of one per-transition optimizer step: accum_edges, or accum_edges per accum_trees of the batch's
    trees (BranchGRPO's code steps every 12 transitions of each process's 2 trees, its 8 processes' gradients
    averaged: a batch of 16 trees takes a step every 96 of its transitions)."""
    return max(1, round(cfg.accum_edges * trees / cfg.accum_trees)) if cfg.accum_trees else cfg.accum_edges


def grpo_update(
    policy: Policy,
    opt: torch.optim.Optimizer,
    sde: Kernel,
    b: Batch,
    cfg: TrainConfig,
    gen: torch.Generator,
    *,
    max_batch: int = 64,
    ref: Policy | None = None,
    after_step: UpdateHook | None = None,
    parallel: Parallel | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, float]:
    """One iteration's GRPO update; returns metrics (ratios before each step, grad norms, model evaluations).
    progress("update", edges done, edges in all) after each chunk's backward."""
    params = list(policy.trainable_parameters())
    ratios, losses, norms, kls, evals, first, pads = [], [], [], [], 0, [], 0
    plan = parallel.minibatches if parallel else minibatches(b, cfg, gen)
    denoms = parallel.denominators if parallel else loss_denominators(b, cfg, plan)
    edges, done = sum(len(mb) for mb in plan), 0
    plan_chunks = [_parent_chunks(b.tree.parent, mb, max_batch) for mb in plan]
    ratio_guard = _ratio_guard(policy, sde, b, cfg, plan_chunks, parallel)
    for k, (chunks, denom) in enumerate(zip(plan_chunks, denoms, strict=True)):
        opt.zero_grad(set_to_none=True)
        bias = ratio_guard.step_bias(k, chunks, b.tree.log_prob, b.advantage) if ratio_guard else None
        for j, chunk in enumerate(chunks):
            e = _edge_step(policy, sde, b, chunk, ref, cfg.kl_form)
            new_lp, kl, n = e.new_lp, e.kl, e.evals
            adv, old = b.advantage[chunk].to(new_lp.device), b.tree.log_prob[chunk].to(new_lp.device)
            if ratio_guard:
                loss_e, ratio, carry = ratio_guard.loss(e, k, j, old, adv, bias)
            else:
                (loss_e, ratio), carry = clipped_loss(new_lp, old, adv, cfg.clip_range), None
            if kl is not None:
                loss_e = loss_e + cfg.kl_beta * kl
                kls.append(kl.detach().cpu())
            ((loss_e if carry is None else loss_e + carry).sum() / denom).backward()
            ratios.append(ratio.detach().cpu())
            if k == 0:
                first.append(ratio.detach().cpu())
            losses.append(loss_e.detach().cpu())
            evals += n
            done += len(chunk)
            if progress:
                progress("update", done, edges)
        for _ in range((parallel.chunks[k] if parallel and parallel.chunks else 0) - len(chunks)):
            _pad_chunk(policy, sde, b, ref, cfg.kl_form)
            pads += 1
        if parallel:
            parallel.sync(params)
        clip = parallel.clip if parallel and parallel.clip else _clip_grad_norm
        norms.append(clip(params, cfg.max_grad_norm))
        opt.step()
        if after_step:
            after_step()
    if parallel:  # every rank reports the whole batch's metrics
        ratios, losses = _all(ratios, parallel), _all(losses, parallel)
        kls = _all(kls, parallel) if ref is not None else kls
        first = _all(first, parallel)
        evals = int(parallel.gather(torch.tensor([evals])).sum())
    out = _metrics(ratios, losses, norms, kls, evals, first, cfg)
    out.update(ratio_guard.mask_metrics(parallel.gather if parallel else None) if ratio_guard else {})
    if parallel and parallel.chunks is not None:  # sharded: zero-weight chunks run to keep the ranks in step
        out["pad_chunks"] = int(parallel.gather(torch.tensor([pads])).sum())
    return out


def _ratio_guard(
    policy: Policy, sde: Kernel, b: Batch, cfg: TrainConfig, chunks: list[list[Tensor]], parallel: Parallel | None
) -> rg.RatioGuard | None:
    """GRPO-Guard or Flow-DPPO's KL mask for this update (None when all three are off), holding the behaviour means
    of the parents trained after the first optimizer step (forwards without gradient, now)."""
    if cfg.ratio_norm == "none" and cfg.step_reweight == "none" and cfg.trust == "clip":
        return None

    def total(x: Tensor) -> Tensor:  # [T] this process's sums -> every process's
        return parallel.gather(x.cpu()).view(-1, sde.cfg.steps).sum(0).to(x.device) if parallel else x

    def pad(k: int, have: int) -> None:  # a sharded model's forwards, in step with the ranks that run more chunks
        edge = torch.nonzero(b.tree.parent >= 0).flatten()[:1]
        for _ in range((parallel.chunks[k] if parallel and parallel.chunks else 0) - have):
            _edge_step(policy, sde, b, edge, None)

    out = rg.RatioGuard(
        cfg.ratio_norm,
        cfg.step_reweight,
        sde,
        forward=lambda edges: _edge_step(policy, sde, b, edges, None),
        pad=pad,
        objective=lambda ratio, adv: clip_objective(ratio, adv, cfg.clip_range),
        total=total,
        kl_mask=km.from_config(cfg),
    )
    out.keep_behaviour(chunks)
    return out


def _pad_chunk(policy: Policy, sde: Kernel, b: Batch, ref: Policy | None, kl_form: str) -> None:
    """A forward and backward of zero weight on one edge: a sharded model's collectives stay in step
    with the ranks that have more chunks in this optimizer step."""
    edge = torch.nonzero(b.tree.parent >= 0).flatten()[:1]
    new_lp, kl, _ = _edge_terms(policy, sde, b, edge, ref, kl_form)
    (new_lp.sum() * 0.0).backward()


def parent_chunk_count(parent: Tensor, edges: Tensor, max_batch: int) -> int:
    """How many forward/backward chunks grpo_update runs for these edges."""
    return -(-len(torch.unique(parent[edges])) // max_batch)


def _clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def _all(parts: list[Tensor], parallel: Parallel) -> list[Tensor]:
    """This rank's per-edge values -> every rank's, in rank order (the metrics are order-free)."""
    local = torch.cat(parts) if parts else torch.zeros(0)
    return [parallel.gather(local)]


def _edges_per_tree(b: Batch) -> float:
    """Mean number of trained edges of the batch's trees that have any (the references' transitions per tree)."""
    owners = b.tree.tree[b.trained]
    return len(owners) / max(len(torch.unique(owners)), 1)


def _parent_chunks(parent: Tensor, edges: Tensor, max_batch: int) -> list[Tensor]:
    """Split edges so that each chunk's distinct parents number at most max_batch; no edges, no chunk (a
    rank with nothing to train in a step runs no forward: parent_chunk_count says 0 for it too)."""
    if not len(edges):
        return []
    parents = torch.unique(parent[edges])
    owner = parent[edges]
    return [edges[torch.isin(owner, g)] for g in parents.split(max_batch)]


def _metrics(ratios, losses, norms, kls, evals, first: list[Tensor], cfg: TrainConfig) -> dict[str, float]:
    if not ratios:
        return {"edges": 0, "train_evals": 0}
    r, lo = torch.cat(ratios), torch.cat(losses)
    logr = torch.log(r)
    out = {
        "edges": int(r.numel()),
        "loss": float(lo.mean()),
        "ratio_mean": float(r.mean()),
        "ratio_min": float(r.min()),
        "ratio_max": float(r.max()),
        "ratio_first_dev": float((torch.cat(first) - 1).abs().max()) if first and torch.cat(first).numel() else 0.0,
        # ^ the ratios of the first step, taken before any update of this iteration: 0 on-policy
        "ratio_std": float(r.std()) if r.numel() > 1 else 0.0,
        "clip_frac": float(((r - 1).abs() > cfg.clip_range).float().mean()),
        "clip_frac_high": float((r > 1 + cfg.clip_range).float().mean()),  # above the band: capped when A > 0
        "clip_frac_low": float((r < 1 - cfg.clip_range).float().mean()),  # below it: capped when A < 0
        "approx_kl": float(0.5 * (logr**2).mean()),
        "grad_norm": sum(norms) / len(norms),
        "optimizer_steps": len(norms),
        "train_evals": evals,
    }
    if kls:
        out["kl_ref"] = float(torch.cat(kls).mean())
    return out


@register_update
class GRPOUpdate(Update):
    """The clipped policy gradient on a tree's trained SDE edges (every process's batch planned together)."""

    objective = "grpo"

    def learn(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> tuple[dict[str, Any], Tensor]:
        own = slice(c.starts[ctx.ranks.rank], c.starts[ctx.ranks.rank] + c.tree.num_nodes)
        batch = Batch(c.tree, c.trained[own], c.edge[own], cond)
        par = ctx.ranks.plan(Batch(c.whole, c.trained, c.edge, {}), c.starts, it)
        out = grpo_update(
            ctx.policy,
            ctx.opt,
            ctx.sde,
            batch,
            self.cfg.train,
            ctx.gen,
            max_batch=ctx.max_batch,
            ref=ctx.ref,
            after_step=ctx.after_step,
            parallel=par,
            progress=ctx.progress,
        )
        return out, c.edge[c.trained]
