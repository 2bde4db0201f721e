"""Advantage Weighted Matching (Xue et al., arXiv 2509.25050; methods.md 17): the pretraining flow-matching loss on
the policy's own clean samples, each weighted by its advantage.

For a clean sample x0 of the trained policy (any solver; ODE here), its advantage A and a noise level t of the
sampler's grid:

    x_t = (1 - t) x0 + t eps                      (fresh eps: the forward process)
    l   = mean (v_theta(x_t, t) - (eps - x0))^2   (the flow-matching loss; mean over elements)
    w   = l | t l | t^2 l | t (sqrt(l + e) - sqrt(e)) | t ((l + e)^p - e^p) / p     (awm.weighting; e = 1e-10)
    a   = clip(A, +-adv_clip) adv_max / adv_clip
    L   = a w + kl_beta k(v_theta, v_ref) + anchor_beta k(v_theta, v_anchor)
    k(u, v) = mean (u - v)^2     (kl_weight "elbo": over 2 s_t^2, s_t = 0.7 sqrt(t / (1 - min(t, 0.99))))

The released code (scripts/train_sd3_awm.py) writes the first term -a exp(log p - sg(log p)) with log p = -w: a ratio
of 1 by construction (on-policy, its old log-prob is the current one detached; its clip never acts), whose gradient
is a grad w, the gradient of a w. v_ref is the initial policy (train.kl_beta, the code's train.beta); v_anchor an
EMA of the trained weights (the code's "KL-EMA, mimic TRPO") that trails them after each iteration: anchor <-
d anchor + (1 - d) theta, d = min(anchor_decay, 0.001 s) after s optimizer steps. Each sample trains at `levels`
noise levels, one drawn from each of `levels` equal strata of grid steps (strata). Gradients of every level of every
sample of an optimizer step are averaged.

credit = "path" (new here; docs/methods.md): a level takes the advantage of the edge of the leaf's rollout path
that made the denoising step at that level (path_advantages) instead of the leaf's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError, TreegrpoError, shown
from .nft import LeafSteps, OldPolicy, leaf_conditions, leaf_plan
from .protocols import Conditions, Kernel, Policy, select
from .rollout import mix_seed
from .sde import FlowSDE
from .update import Context, Credited, Update, register_update

WEIGHTINGS = ("uniform", "t", "t2", "huber", "ghuber")
TIME_SAMPLINGS = ("discrete_wo_init", "discrete")
KL_WEIGHTS = ("uniform", "elbo")
ANCHOR_RAMPS = ("linear", "constant")
CREDITS = ("leaf", "path")
EPS = 1e-10  # the code's constant inside huber and ghuber
RAMP = 0.001  # the anchor's decay rises by this per optimizer step ("linear")


@dataclass(frozen=True)
class AWMConfig:
    weighting: str = "ghuber"  # w(l, t) of the flow-matching loss l at level t: "uniform" (l itself, the pretraining
    # loss) | "t" | "t2" | "huber": t (sqrt(l + 1e-10) - 1e-5) | "ghuber": t ((l + 1e-10)^p - 1e-10^p) / p (the code's)
    ghuber_power: float = 0.25  # p of "ghuber"
    adv_clip: float = 5.0  # advantages clipped to +-adv_clip (the code's adv_clip_max) ...
    adv_max: float = 1.0  # ... then scaled by adv_max / adv_clip (the code's advantage_max): +-adv_max at most
    levels: int = 6  # noise levels trained per sample, one drawn from each of `levels` equal strata of grid steps (the
    # code's train_timesteps)
    timestep_fraction: float = 0.9  # the strata end before grid step int(steps x this): 14 steps, 0.9 -> steps 1..11
    time_sampling: str = "discrete_wo_init"  # strata from grid step 1 (the GenEval and OCR configs) | "discrete": from
    # step 0, the pure-noise level (the PickScore config)
    kl_weight: str = "uniform"  # both velocity penalties: "uniform": mean |u - v|^2 | "elbo": over 2 s_t^2,
    # s_t = 0.7 sqrt(t / (1 - min(t, 0.99))) (the code's kl_weight and kl_ema_weight)
    anchor_beta: float = 1.0  # coefficient of mean |v - v_anchor|^2, the anchor an EMA of the trained weights (the
    # code's ema_beta); 0 = no anchor
    anchor_decay: float = 0.3  # the anchor's decay d at most: anchor <- d anchor + (1 - d) theta after each
    # iteration (the code's kl_ema_decay)
    anchor_ramp: str = "linear"  # "linear": d = min(anchor_decay, 0.001 s) after s optimizer steps | "constant":
    # d = anchor_decay (the code's kl_ema_decay_type)
    credit: str = "leaf"  # "leaf": every level takes the sample's advantage (AWM) | "path": a level takes the
    # advantage of the tree edge that made the denoising step at that level (new here, docs/methods.md)
    steps: int = 1  # optimizer steps per iteration (the code: 1, its gradients accumulated over the whole epoch)

    def validate(self) -> None:
        for name, value, allowed in (
            ("weighting", self.weighting, WEIGHTINGS),
            ("time_sampling", self.time_sampling, TIME_SAMPLINGS),
            ("kl_weight", self.kl_weight, KL_WEIGHTS),
            ("anchor_ramp", self.anchor_ramp, ANCHOR_RAMPS),
            ("credit", self.credit, CREDITS),
        ):
            if value not in allowed:
                raise ConfigError(f"awm.{name} must be one of {', '.join(allowed)}; got {shown(value)}")
        for name in ("ghuber_power", "adv_clip", "adv_max"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"awm.{name} must be finite and > 0; got {shown(value)}")
        if not (self.anchor_beta >= 0 and math.isfinite(self.anchor_beta)):
            raise ConfigError(f"awm.anchor_beta must be finite and >= 0 (0 = no anchor); got {shown(self.anchor_beta)}")
        if not 0 <= self.anchor_decay <= 1:
            raise ConfigError(f"awm.anchor_decay must be in [0, 1]; got {shown(self.anchor_decay)}")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(f"awm.timestep_fraction must be in (0, 1]; got {shown(self.timestep_fraction)}")
        for name in ("levels", "steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"awm.{name} must be a whole number >= 1; got {shown(getattr(self, name))}")

    def grid(self, steps: int) -> tuple[int, int]:
        """(first, top): the strata cover grid steps first .. top - 1 of a `steps`-step sampler."""
        first, top = int(self.time_sampling == "discrete_wo_init"), int(steps * self.timestep_fraction)
        if top <= first:
            raise ConfigError(
                f"awm.timestep_fraction = {shown(self.timestep_fraction)} leaves no noise level to train with "
                f"sampler.steps = {steps}: int(steps x fraction) = {top} must be above {first}, the first step "
                f"awm.time_sampling = {shown(self.time_sampling)} trains"
            )
        return first, top


# --- the loss -------------------------------------------------------------------------------------------------


def strata(u: Tensor, first: int, top: int) -> Tensor:
    """[levels] int64 grid steps from uniforms u [levels] in [0, 1): one in each of len(u) equal strata of
    first .. top - 1 (the code's boundaries linspace(first, top, levels + 1) cut to whole steps; a stratum narrower
    than a step gives its start)."""
    bounds = torch.linspace(first, top, len(u) + 1).long()
    lower, upper = bounds[:-1], bounds[1:]
    return lower + (u.float() * (upper - lower)).long()


def scaled_advantage(adv: Tensor, cfg: AWMConfig) -> Tensor:
    """[B] a = clip(A, +-adv_clip) / adv_clip x adv_max from advantages A [B]."""
    c = cfg.adv_clip
    return adv.float().clamp(-c, c) / c * cfg.adv_max


def matching_loss(v: Tensor, x0: Tensor, eps: Tensor, t: Tensor, weighting: str, power: float) -> Tensor:
    """[B] w(l, t) (module docstring): v, x0, eps [B, ...]; t [B]."""
    fm = ((v.float() - (eps.float() - x0.float())) ** 2).flatten(1).mean(1)  # [B] l, the flow-matching loss
    t = t.float()
    if weighting == "uniform":
        return fm
    if weighting == "t":
        return t * fm
    if weighting == "t2":
        return t**2 * fm
    if weighting == "huber":
        return t * (torch.sqrt(fm + EPS) - math.sqrt(EPS))
    return t * ((fm + EPS) ** power - EPS**power) / power


def velocity_gap(v: Tensor, u: Tensor, t: Tensor, kl_weight: str) -> Tensor:
    """[B] mean (v - u)^2 over elements (kl_weight "elbo": over 2 s_t^2, as the module docstring); u: no gradient."""
    k = ((v.float() - u.float().detach()) ** 2).flatten(1).mean(1)
    if kl_weight == "elbo":
        t = t.float()
        k = k / (2 * (0.7 * torch.sqrt(t / (1 - t.clamp(0, 0.99)))) ** 2)
    return k


def awm_loss(
    v: Tensor,
    x0: Tensor,
    eps: Tensor,
    t: Tensor,
    a: Tensor,
    cfg: AWMConfig,
    *,
    kl_beta: float = 0.0,
    v_ref: Tensor | None = None,
    v_anchor: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """[B] AWM loss per row (module docstring) and its two velocity gaps [B] (None where off): v, x0, eps, v_ref,
    v_anchor [B, ...] (the last two without gradient); t [B] noise levels; a [B] advantages (scaled_advantage)."""
    loss = a.float() * matching_loss(v, x0, eps, t, cfg.weighting, cfg.ghuber_power)
    k_ref = velocity_gap(v, v_ref, t, cfg.kl_weight) if v_ref is not None and kl_beta > 0 else None
    k_anchor = velocity_gap(v, v_anchor, t, cfg.kl_weight) if v_anchor is not None and cfg.anchor_beta > 0 else None
    if k_ref is not None:
        loss = loss + kl_beta * k_ref
    if k_anchor is not None:
        loss = loss + cfg.anchor_beta * k_anchor
    return loss, k_ref, k_anchor


def anchor_decay_at(step: int, cfg: AWMConfig) -> float:
    """The anchor's decay after `step` optimizer steps of the run (the code's kl_ema_decay_type)."""
    return cfg.anchor_decay if cfg.anchor_ramp == "constant" else min(cfg.anchor_decay, RAMP * step)


def path_advantages(parent: Tensor, depth: Tensor, edge: Tensor, leaves: Tensor, steps: int) -> Tensor:
    """[L, steps] the advantage edge [N] of the edge of each leaf's path (leaves [L] node ids) that made each
    denoising step: the edge into a node of depth d from a parent of depth d' made steps d' .. d - 1. A step no edge
    made (none in a rollout tree, whose leaves are at depth `steps`) takes the leaf's own edge."""
    out = torch.full((len(leaves), steps), math.nan)
    s = torch.arange(steps)
    node = leaves.clone()
    while bool((parent[node] >= 0).any()):
        live = torch.nonzero(parent[node] >= 0).flatten()
        n = node[live]
        p = parent[n]
        made = (s >= depth[p][:, None]) & (s < depth[n][:, None])  # [l, steps]
        out[live] = torch.where(made, edge[n].float()[:, None], out[live])
        node[live] = p
    return torch.where(out.isnan(), edge[leaves].float()[:, None], out)


# --- the update -----------------------------------------------------------------------------------------------


@dataclass
class AWMBatch:
    """This process's samples of one iteration: clean latents, conditions, advantages, and the global plan."""

    x0: Tensor  # [L, C, H, W] the clean samples (what the rewards scored)
    cond: Conditions  # rows [L]
    adv: Tensor  # [L, T] each sample's advantage at each denoising step (credit "leaf": its own at every step)
    keys: Tensor  # [L] int64: each sample's identity, the same whatever the process layout (its noise seed)
    groups: list[Tensor]  # per optimizer step: this process's sample indices in it
    denominators: list[float]  # per optimizer step: samples in it over every process


def awm_draws(key: int, seed: int, levels: int, span: tuple[int, int], shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """One sample's grid steps [levels] (strata of span = (first, top)) and fresh noises [levels, *shape], from the
    sample's own seed."""
    g = torch.Generator().manual_seed(mix_seed(seed, key, 0xA3D1))
    return strata(torch.rand(levels, generator=g), *span), torch.randn((levels, *shape), generator=g)


def awm_update(
    policy: Policy,
    anchor: OldPolicy | None,
    opt: torch.optim.Optimizer,
    sigmas: Tensor,
    b: AWMBatch,
    cfg: AWMConfig,
    *,
    kl_beta: float,
    max_grad_norm: float,
    seed: int,
    max_batch: int = 64,
    ref: Policy | None = None,
    after_step: Callable[[], None] | None = None,
    sync: Callable[[list[nn.Parameter]], None] | None = None,
    gather: Callable[[Tensor], Tensor] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, float]:
    """One iteration's AWM update: per optimizer step, every sample of the step at awm.levels noise levels, gradients
    averaged over samples and levels (over every process with `sync`: a gradient sum; `gather` concatenates a per-row
    tensor over the processes, for the metrics; progress("update", samples done, samples in all))."""
    params = list(policy.trainable_parameters())

    def terms(chunk: Tensor) -> dict[str, Tensor]:
        return _chunk_terms(policy, anchor, params, sigmas, b, chunk, cfg=cfg, kl_beta=kl_beta, seed=seed, ref=ref)

    on = {"loss": True, "kl_ref": ref is not None and kl_beta > 0, "kl_anchor": anchor is not None}
    steps = LeafSteps(opt, params, max_batch, max_grad_norm, sync, after_step, progress, gather)
    return steps.run(b.groups, b.denominators, cfg.levels, terms, on)


def _chunk_terms(
    policy: Policy,
    anchor: OldPolicy | None,
    params: list[nn.Parameter],
    sigmas: Tensor,
    b: AWMBatch,
    chunk: Tensor,
    *,
    cfg: AWMConfig,
    kl_beta: float,
    seed: int,
    ref: Policy | None,
) -> dict[str, Tensor]:
    """[chunk x levels] loss rows (levels outer), with gradients, and the velocity gaps that are on. The samples
    (host or device) move to the policy's device; the draws are made on the host."""
    dev = params[0].device
    span = cfg.grid(len(sigmas) - 1)
    draws = [awm_draws(int(b.keys[i]), seed, cfg.levels, span, tuple(b.x0.shape[1:])) for i in chunk.tolist()]
    x0, cond = b.x0[chunk].to(dev).float(), select(b.cond, chunk.to(next(iter(b.cond.values())).device))
    adv = b.adv[chunk.to(b.adv.device)].cpu()  # [c, T]
    out: dict[str, list[Tensor]] = {"loss": [], "kl_ref": [], "kl_anchor": []}
    for j in range(cfg.levels):
        step = torch.stack([d[0][j] for d in draws])  # [c] grid steps
        t = sigmas[step].float().to(dev)  # [c]
        eps = torch.stack([d[1][j] for d in draws]).to(dev, x0.dtype)
        tb = t.view((-1,) + (1,) * (x0.dim() - 1))
        x_t = (1 - tb) * x0 + tb * eps
        a = scaled_advantage(adv[torch.arange(len(step)), step], cfg).to(dev)
        with torch.no_grad():
            v_ref = ref.velocity(x_t, t, cond) if ref is not None and kl_beta > 0 else None
        v_anchor = None
        if anchor is not None:
            with anchor.swapped(params):  # no gradient inside; before the trained forward, as NFT's old one
                v_anchor = policy.velocity(x_t, t, cond)
        v = policy.velocity(x_t, t, cond)
        loss, k_ref, k_anchor = awm_loss(v, x0, eps, t, a, cfg, kl_beta=kl_beta, v_ref=v_ref, v_anchor=v_anchor)
        for k, x in (("loss", loss), ("kl_ref", k_ref), ("kl_anchor", k_anchor)):
            if x is not None:
                out[k].append(x)
    return {k: torch.cat(v) for k, v in out.items() if v}


@register_update
class AWMUpdate(Update):
    """Advantage Weighted Matching on every leaf; on-policy (rollouts sample with the trained weights). It owns the
    anchor (awm.anchor_beta > 0), which trails the trained weights after each iteration (checkpoint tensors
    `anchor-*.safetensors`)."""

    objective = "awm"

    def __init__(self, cfg: Any, policy: Policy, sde: Kernel):
        super().__init__(cfg, policy, sde)
        if not isinstance(sde, FlowSDE):
            raise TreegrpoError(
                f"train.objective = awm trains a flow-matching model's velocity; {policy.name} samples "
                "with its own kernel (an epsilon-prediction model): use a GRPO preset"
            )
        params = list(policy.trainable_parameters())
        self.anchor = OldPolicy(params) if cfg.awm.anchor_beta > 0 else None
        self.extra_forwards = int(self.anchor is not None)  # the anchor's forward beside each trained one

    def learn(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> tuple[dict[str, Any], Tensor]:
        train, awm = self.cfg.train, self.cfg.awm
        out = awm_update(
            ctx.policy,
            self.anchor,
            ctx.opt,
            ctx.sde.sigmas,
            self.batch(c, cond, it, ctx),
            awm,
            kl_beta=train.kl_beta,
            max_grad_norm=train.max_grad_norm,
            seed=mix_seed(self.cfg.seed, 0xA3D1),
            max_batch=ctx.max_batch,
            ref=ctx.ref,
            after_step=ctx.after_step,
            sync=ctx.ranks.sum_gradients,
            gather=ctx.ranks.gather,
            progress=ctx.progress,
        )
        if awm.credit == "path":  # every edge of the trees lends its advantage to the levels of its steps
            return out, c.edge[c.whole.parent >= 0]
        return out, c.leaf[c.whole.is_leaf()]

    def batch(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> AWMBatch:
        """This process's leaves (rows of c.tree.image_latent), their advantages at each step (awm.credit) and seeds,
        and the global step plan (nft.leaf_plan, awm.steps parts)."""
        plan = leaf_plan(c, ctx.ranks.rank, ctx.gen, self.cfg.awm.steps)
        steps = len(ctx.sde.sigmas) - 1
        if self.cfg.awm.credit == "path":
            w = c.whole
            adv = path_advantages(w.parent, w.depth, c.edge, plan.ids, steps)
        else:
            adv = c.leaf[plan.ids].float()[:, None].expand(len(plan.ids), steps)
        return AWMBatch(
            x0=c.tree.image_latent.float(),
            cond=leaf_conditions(c, cond),
            adv=adv,
            keys=plan.keys * 1_000_003 + it,  # a sample's noise seed: its key and the iteration (drawn anew)
            groups=plan.groups,
            denominators=plan.denominators,
        )

    def follow(self, params: list[nn.Parameter], ctx: Context) -> dict[str, Any]:
        if self.anchor is None:
            return {}
        decay = anchor_decay_at(ctx.optimizer_steps(), self.cfg.awm)
        self.anchor.follow(params, decay)
        return {"anchor_decay": decay}

    def state(self, names: list[str]) -> dict[str, dict[str, Tensor]]:
        return {"anchor": self.anchor.named(names)} if self.anchor is not None else {}

    def load(self, groups: dict[str, dict[str, Tensor]], names: list[str], step: int) -> None:
        if self.anchor is not None:
            missing = f"checkpoint step-{step} holds no AWM anchor (anchor-*.safetensors)"
            self.anchor.restore(groups.get("anchor"), names, missing)
