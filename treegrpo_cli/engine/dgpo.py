"""DGPO, Direct Group Preference Optimization (Luo, Hu and Tang, ICLR 2026, arXiv 2510.08425; methods.md 18).

DPO between the two halves of a prompt's group instead of between two samples. No log-probabilities and no SDE:
the data are the clean samples x0 of a prompt's group G and their advantages A (centred in the group, so the
positive half, A > 0, and the negative half carry equal weight |A| and the partition function cancels). At a noise
level t and a noise eps shared by the group:

    x_t = (1 - t) x0 + t eps,  target = eps - x0
    d_i = mean (v_theta(x_t) - target)^2 - mean (v_ref(x_t) - target)^2      (mean over elements)
    s_G = beta / |G| sum_{i in G} A_i d_i
    L   = mean over groups of -log sigmoid(-s_G)   ("paper")

v_ref is the frozen initial policy. Its gradient is sigmoid(s_G) beta / |G| sum A_i grad d_i: one weight per group.
The released code (Luo-Yihong/DGPO scripts/train_sd3_dgpo.py, compute_group_dgpo_loss_allreduce) minimises the
surrogate mean_i sg[sigmoid(s_G)] A_i mean (v_theta - target)^2, the paper's gradient / beta ("code"). Its options,
each named here: a PPO-style clip (clip_range: a sample whose ratio exp(d_old - d_theta) against the old policy
leaves 1 +- clip_range on its advantage's side keeps its loss but no gradient), the old policy as v_ref (reference =
"old", TDM-R1's dynamic reference) and a velocity penalty kl_beta |v_theta - v_ref|^2 to the initial policy.

Each iteration trains `levels` noise levels of the sampler's grid at or above t_min (the timestep clip: few-step
samples' low-noise detail is not learnt), drawn once and shared by every sample. The old policy, an EMA of the
trained weights after every optimizer step (old <- d old + (1 - d) theta), samples the rollouts once the run is
past sample_old_after iterations.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, TreegrpoError, shown
from .grpo import canonical_key
from .nft import OldPolicy, leaf_conditions
from .protocols import Conditions, Kernel, Policy, select
from .rollout import mix_seed
from .sde import FlowSDE
from .update import Context, Credited, Update, register_update

LOSSES = ("paper", "code")
REFERENCES = ("initial", "old")


@dataclass(frozen=True)
class DGPOConfig:
    beta: float = 100.0  # the group logit's scale: s_G = beta / |G| sum_G A (d - d_ref) (the code's beta_dpo)
    loss: str = "paper"  # "paper": mean over groups of -log sigmoid(-s_G) | "code": the released surrogate mean of
    # sg[sigmoid(s_G)] A d_theta, whose gradient is the paper's / beta
    t_min: float = 0.6  # trained noise levels: the sampler's grid levels at or above t_min (the paper's timestep clip;
    # the code's trunc_steps = 6: levels 0-6 of a 10-step grid at shift 3)
    levels: int = 4  # noise levels an iteration, drawn from those without repeats and shared by every sample (the
    # code's num_train_timesteps)
    shared_noise: bool = True  # one noise per group and level (the code's use_shared_noise); false: one per sample
    clip_range: float = 0.0  # the code's PPO-style clip of d_theta against the old policy (clip_dsm; its configs
    # 0.01); 0 = off (the paper)
    reference: str = "initial"  # v_ref: "initial" (the frozen start) | "old" (the old policy, the code's use_ema_ref)
    sample_old_after: int = 200  # rollouts sample with the old policy after this many iterations (the code's
    # switch_ema_ref: 200, 500 for GenEval); before, with the trained weights
    old_decay: float = 0.3  # the old policy after each optimizer step: old <- d old + (1 - d) theta, d = old_decay
    old_ramp: float = 0.0  # > 0: d = min(old_ramp s, old_decay) at the run's optimizer step s (from 0; the code: 0.001)
    steps: int = 1  # optimizer steps an iteration, each over whole groups (the code: 1)

    def validate(self) -> None:
        for name, value, allowed in (("loss", self.loss, LOSSES), ("reference", self.reference, REFERENCES)):
            if value not in allowed:
                raise ConfigError(f"dgpo.{name} must be one of {', '.join(allowed)}; got {shown(value)}")
        if not self.beta > 0:
            raise ConfigError(f"dgpo.beta must be > 0; got {shown(self.beta)}")
        for name in ("t_min", "clip_range", "old_decay"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"dgpo.{name} must be in [0, 1); got {shown(getattr(self, name))}")
        if not self.old_ramp >= 0:
            raise ConfigError(f"dgpo.old_ramp must be >= 0; got {shown(self.old_ramp)}")
        if not isinstance(self.shared_noise, bool):
            raise ConfigError(f"dgpo.shared_noise must be true or false; got {shown(self.shared_noise)}")
        for name, least in (("levels", 1), ("steps", 1), ("sample_old_after", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"dgpo.{name} must be a whole number >= {least}; got {shown(value)}")

    def decay_at(self, step: int) -> float:
        """The old policy's decay at the run's optimizer step `step` (0 for the first)."""
        return min(self.old_ramp * step, self.old_decay) if self.old_ramp > 0 else self.old_decay


def trained_levels(sigmas: Tensor, cfg: DGPOConfig) -> Tensor:
    """[K] the grid's noise levels at or above t_min (never the last, 0), at least dgpo.levels of them."""
    grid = sigmas[:-1].double()
    cand = grid[grid >= cfg.t_min]
    if len(cand) < cfg.levels:
        raise ConfigError(
            f"dgpo.levels = {cfg.levels} is more than the {len(cand)} noise levels of the sampler's grid at or above "
            f"dgpo.t_min = {cfg.t_min} (the grid: {', '.join(f'{s:.3f}' for s in grid.tolist())})"
        )
    return cand.float()


# --- the loss --------------------------------------------------------------------------------------------------


def flow_errors(v: Tensor, target: Tensor) -> Tensor:
    """[B] mean (v - target)^2 over the elements of each row: v, target [B, ...]."""
    return ((v.float() - target.float()) ** 2).flatten(1).mean(1)


def group_logits(d: Tensor, adv: Tensor, group: Tensor, beta: float, groups: int | None = None) -> Tensor:
    """[G] s_G = beta / |G| sum_{i in G} A_i d_i: d, adv [B]; group [B] int64 in 0..G-1."""
    n = int(group.max()) + 1 if groups is None else groups
    sums = torch.zeros(n, dtype=d.dtype, device=d.device).index_add(0, group, adv.to(d.dtype) * d)
    sizes = torch.bincount(group, minlength=n).to(d.dtype).clamp(min=1)
    return beta * sums / sizes


def ppo_clipped(err: Tensor, err_old: Tensor, adv: Tensor, clip_range: float) -> Tensor:
    """[B] bool: the ratio exp(err_old - err) is past 1 + clip_range for A > 0, below 1 - clip_range otherwise."""
    ratio = torch.exp(err_old - err)
    return torch.where(adv > 0, ratio > 1 + clip_range, ratio < 1 - clip_range)


def dgpo_loss(
    v: Tensor,
    v_ref: Tensor,
    target: Tensor,
    adv: Tensor,
    group: Tensor,
    *,
    beta: float,
    loss: str = "paper",
    v_old: Tensor | None = None,
    clip_range: float = 0.0,
) -> Tensor:
    """The DGPO loss of one batch (module docstring), fp32: v, v_ref, target [B, ...] (v_ref without gradient);
    adv [B]; group [B] int64 in 0..G-1; v_old [B, ...] the old policy's velocity for clip_range > 0."""
    err = flow_errors(v, target)  # [B]
    err_ref = flow_errors(v_ref.detach(), target)
    if clip_range > 0:
        if v_old is None:
            raise ValueError("dgpo_loss: clip_range > 0 needs v_old")
        clipped = ppo_clipped(err.detach(), flow_errors(v_old.detach(), target), adv, clip_range)
        err = torch.where(clipped, err.detach(), err)
    s = group_logits(err - err_ref, adv.float(), group, beta)  # [G]
    if loss == "paper":
        return F.softplus(s).mean()  # -log sigmoid(-s)
    return (torch.sigmoid(s.detach())[group] * adv.float() * err).mean()


def velocity_penalty(v: Tensor, v_ref: Tensor) -> Tensor:
    """[B] mean |v - v_ref|^2 over the elements (the code's KL term, train.kl_beta)."""
    return flow_errors(v, v_ref.detach())


# --- one iteration's update --------------------------------------------------------------------------------------


@dataclass
class DGPOBatch:
    """This process's samples of one iteration, their groups and noise keys, the iteration's noise levels and the
    global plan of its optimizer steps (whole groups each)."""

    x0: Tensor  # [L, C, H, W] the clean samples (the leaves the rewards scored)
    cond: Conditions  # rows [L]
    adv: Tensor  # [L] their advantages
    group: Tensor  # [L] int64 their group (prompt) as an index 0..G-1 over every process
    keys: Tensor  # [L] int64 noise keys: the group's (shared_noise) or the sample's, with the iteration
    t: Tensor  # [K] the iteration's noise levels, every sample's
    whole_group: Tensor  # [L_all] every process's samples' groups, in rank order
    parts: list[Tensor]  # per optimizer step: [G] bool, the groups in it


@dataclass
class Models:
    """What an update runs: the trained policy and its parameters, the old policy, v_ref's initial policy and the
    velocity penalty's (None where not needed), and the run's context."""

    policy: Policy
    params: list[nn.Parameter]
    old: OldPolicy
    ref: Policy | None  # the initial policy of d_ref (reference = "initial")
    kl_ref: Policy | None  # the initial policy of the velocity penalty (train.kl_beta > 0)
    ctx: Context


def noise_for(keys: Tensor, seed: int, level: int, shape: tuple[int, ...]) -> Tensor:
    """[len(keys), *shape] standard normal noise of each key at the iteration's level index, each from its own seed
    on the host (the same in any process layout)."""
    out = torch.empty((len(keys), *shape))
    for i, k in enumerate(keys.tolist()):
        out[i] = torch.randn(shape, generator=torch.Generator().manual_seed(mix_seed(seed, k, level)))
    return out


def _inputs(b: DGPOBatch, chunk: Tensor, j: int, seed: int, dev: Any) -> tuple[Tensor, Tensor, Tensor, Conditions]:
    """x_t, target = eps - x0 [c, ...], t [c] and the condition rows of a chunk of rows at level j."""
    x0 = b.x0[chunk].to(dev).float()
    eps = noise_for(b.keys[chunk], seed, j, tuple(b.x0.shape[1:])).to(dev)
    t = b.t[j].expand(len(chunk)).to(dev)
    tb = t.view((-1,) + (1,) * (x0.dim() - 1))
    cond = select(b.cond, chunk.to(next(iter(b.cond.values())).device))
    return (1 - tb) * x0 + tb * eps, eps - x0, t, cond


def _measure(m: Models, b: DGPOBatch, rows: Tensor, j: int, cfg: DGPOConfig, seed: int) -> tuple[Tensor, list]:
    """Without gradients, this process's rows of a step at level j: columns [L, 4] (A d, A err, clipped, penalty;
    zero off the rows) and, per chunk, what its backward reuses (the clipped rows, the penalty's v_ref)."""
    dev = m.params[0].device
    cols, keep = torch.zeros(len(b.group), 4), []
    for chunk in torch.split(rows, m.ctx.max_batch):
        x_t, target, t, cond = _inputs(b, chunk, j, seed, dev)
        adv = b.adv[chunk].to(dev)
        with torch.no_grad():
            v = m.policy.velocity(x_t, t, cond)
            v_old = None
            if cfg.clip_range > 0 or cfg.reference == "old":
                with m.old.swapped(m.params):
                    v_old = m.policy.velocity(x_t, t, cond)
            v_ref = v_old if v_old is not None and cfg.reference == "old" else _forward(m.ref, x_t, t, cond)
            v_kl = None if m.kl_ref is None else v_ref if m.kl_ref is m.ref else _forward(m.kl_ref, x_t, t, cond)
        err = flow_errors(v, target)
        clipped = torch.zeros(len(chunk), dtype=torch.bool, device=dev)
        if cfg.clip_range > 0 and v_old is not None:
            clipped = ppo_clipped(err, flow_errors(v_old, target), adv, cfg.clip_range)
        kl = torch.zeros_like(err) if v_kl is None else velocity_penalty(v, v_kl)
        d = err - flow_errors(v_ref, target)
        cols[chunk] = torch.stack([adv * d, adv * err, clipped.float(), kl]).T.cpu()
        keep.append((clipped, v_kl))
    return cols, keep


def _forward(model: Policy | None, x_t: Tensor, t: Tensor, cond: Conditions) -> Tensor:
    if model is None:
        raise TreegrpoError("DGPO's update has no reference policy to forward")
    return model.velocity(x_t, t, cond)


def _weights(whole: Tensor, b: DGPOBatch, part: Tensor, rows: Tensor, cfg: DGPOConfig) -> tuple[Tensor, float]:
    """Each row's gradient weight [rows] (a group's sigmoid(s_G) times the form's scale, the step's denominator
    divided out) and the step's objective at this level, from every process's columns `whole` [L_all, 4]."""
    n = len(part)
    s = group_logits(whole[:, 0].double(), torch.ones(len(whole)), b.whole_group, cfg.beta, groups=n)  # [G]
    sizes = torch.bincount(b.whole_group, minlength=n).double()
    sig = torch.sigmoid(s)
    groups, samples = max(float(part.sum()), 1.0), max(float(sizes[part].sum()), 1.0)  # an empty step: no rows
    g = b.group[rows]
    if cfg.loss == "paper":
        w = sig[g] * cfg.beta / sizes[g] * b.adv[rows].double() / groups
        value = float(F.softplus(s[part]).sum()) / groups
    else:
        w = sig[g] * b.adv[rows].double() / samples
        value = float((sig[b.whole_group] * whole[:, 1].double()).sum()) / samples
    return w.float(), value


def _learn_level(m: Models, b: DGPOBatch, part: Tensor, j: int, cfg: DGPOConfig, **kw: Any) -> dict[str, float]:
    """One level of one optimizer step: the rows' weights from every process, then their gradients accumulated."""
    rows = torch.nonzero(part[b.group]).flatten()
    cols, keep = _measure(m, b, rows, j, cfg, kw["seed"])
    whole = m.ctx.ranks.gather(cols)  # [L_all, 4]
    w, value = _weights(whole, b, part, rows, cfg)
    samples = float(part[b.whole_group].sum())
    denom = samples * len(b.t)
    dev = m.params[0].device
    chunks = zip(torch.split(rows, m.ctx.max_batch), torch.split(w, m.ctx.max_batch), keep, strict=True)
    for chunk, wc, (clipped, v_kl) in chunks:
        x_t, target, t, cond = _inputs(b, chunk, j, kw["seed"], dev)
        v = m.policy.velocity(x_t, t, cond)
        err = flow_errors(v, target)
        loss = (wc.to(dev) * torch.where(clipped, err.detach(), err)).sum() / len(b.t)
        if v_kl is not None:
            loss = loss + kw["kl_beta"] * velocity_penalty(v, v_kl).sum() / denom
        loss.backward()
        kw["done"][0] += len(chunk)
        if m.ctx.progress:
            m.ctx.progress("update", kw["done"][0], kw["total"])
    kl = float(whole[:, 3].sum()) / max(samples, 1.0)
    return {"loss": value + kw["kl_beta"] * kl, "kl_ref": kl, "clip_frac": float(whole[:, 2].sum()) / max(samples, 1)}


def dgpo_update(m: Models, b: DGPOBatch, cfg: DGPOConfig, *, kl_beta: float, max_grad_norm: float, seed: int) -> dict:
    """One iteration's DGPO update: per optimizer step (its whole groups), every level's weights and gradients,
    summed over the processes, clipped, one step; the old policy trails after each (module docstring)."""
    ctx, stats, norms = m.ctx, [], []
    done, total = [0], len(b.group) * len(b.t)
    for part in b.parts:
        ctx.opt.zero_grad(set_to_none=True)
        for j in range(len(b.t)) if part.any() else ():  # more steps than groups: an empty step
            stats.append(_learn_level(m, b, part, j, cfg, seed=seed, kl_beta=kl_beta, done=done, total=total))
        ctx.ranks.sum_gradients(m.params)
        norms.append(float(torch.nn.utils.clip_grad_norm_(m.params, max_grad_norm)))
        ctx.opt.step()
        ctx.after_step()
        m.old.follow(m.params, cfg.decay_at(ctx.optimizer_steps() - 1))
    out = {
        "loss": sum(s["loss"] for s in stats) / max(len(stats), 1),
        "grad_norm": sum(norms) / len(norms),
        "optimizer_steps": float(len(b.parts)),
        "train_evals": float(len(b.whole_group) * len(b.t)),
    }
    if kl_beta > 0:
        out["kl_ref"] = sum(s["kl_ref"] for s in stats) / max(len(stats), 1)
    if cfg.clip_range > 0:
        out["clip_frac"] = sum(s["clip_frac"] for s in stats) / max(len(stats), 1)
    return out


@register_update
class DGPOUpdate(Update):
    """DGPO on every leaf's advantage, a prompt's leaves one group. It owns the old policy (an EMA of the trained
    weights after every optimizer step; rollouts sample with it past dgpo.sample_old_after iterations; checkpoint
    tensors `old-*.safetensors`) and, without train.kl_beta, its own frozen initial policy for v_ref."""

    objective = "dgpo"

    def __init__(self, cfg: Any, policy: Policy, sde: Kernel):
        super().__init__(cfg, policy, sde)
        if not isinstance(sde, FlowSDE):
            raise TreegrpoError(
                f"train.objective = dgpo trains a flow-matching model's velocity; {policy.name} samples "
                "with its own kernel (an epsilon-prediction model): use a GRPO preset"
            )
        d: DGPOConfig = cfg.dgpo
        self.grid = trained_levels(sde.sigmas, d)  # [K'] the levels an iteration draws from
        self.old = OldPolicy(list(policy.trainable_parameters()))
        self.own_ref = policy.reference() if d.reference == "initial" and cfg.train.kl_beta <= 0 else None
        # the trained policy's forward without gradients, the initial policy's (the run's KL reference counts it
        # when train.kl_beta > 0) and the old policy's (clip or reference = "old")
        self.extra_forwards = 1 + int(self.own_ref is not None) + int(d.clip_range > 0 or d.reference == "old")
        self.done = 0  # iterations learned: the rollouts sample with the old policy once past sample_old_after

    def sampling(self, params: list[nn.Parameter]) -> AbstractContextManager[None]:
        return self.old.swapped(params) if self.done > self.cfg.dgpo.sample_old_after else nullcontext()

    def learn(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> tuple[dict[str, Any], Tensor]:
        d, train = self.cfg.dgpo, self.cfg.train
        kl_ref = ctx.ref if train.kl_beta > 0 else None
        ref = (kl_ref if kl_ref is not None else self.own_ref) if d.reference == "initial" else None
        params = list(ctx.policy.trainable_parameters())
        m = Models(ctx.policy, params, self.old, ref, kl_ref, ctx)
        b = self.batch(c, cond, it, ctx)
        out = dgpo_update(
            m, b, d, kl_beta=train.kl_beta, max_grad_norm=train.max_grad_norm, seed=mix_seed(self.cfg.seed, 0xD690)
        )
        self.done = it + 1
        return out, c.leaf[c.whole.is_leaf()]  # DGPO trains every leaf, on its advantage

    def batch(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> DGPOBatch:
        """This process's leaves (rows of c.tree.image_latent) with their advantages (c.leaf), groups (prompts,
        over every process) and noise keys; the iteration's levels (from the run's seed) and the global plan:
        the groups drawn at random into dgpo.steps parts, each one optimizer step."""
        d, rank = self.cfg.dgpo, ctx.ranks.rank
        leaves = c.whole.leaves()  # [L_all] global node ids, ascending
        prompts = c.whole.group()[leaves]
        _, group = torch.unique(prompts, return_inverse=True)  # [L_all] the same in any process layout
        n = int(group.max()) + 1 if len(group) else 0
        own = (leaves >= c.starts[rank]) & (leaves < c.starts[rank + 1])  # in the order of c.tree.leaves()
        keys = prompts if d.shared_noise else canonical_key(c.whole)[leaves]
        perm = torch.randperm(n, generator=ctx.gen)
        draw = torch.Generator().manual_seed(mix_seed(self.cfg.seed, 0xD691, it))
        return DGPOBatch(
            x0=c.tree.image_latent.float(),
            cond=leaf_conditions(c, cond),
            adv=c.leaf[leaves[own]].float(),
            group=group[own],
            keys=keys[own] * 1_000_003 + it,  # drawn anew each iteration
            t=self.grid[torch.randperm(len(self.grid), generator=draw)[: d.levels]],
            whole_group=group,
            parts=[torch.isin(torch.arange(n), p) for p in torch.tensor_split(perm, d.steps)],
        )

    def follow(self, params: list[nn.Parameter], ctx: Context) -> dict[str, Any]:
        """The old policy followed after every optimizer step (dgpo_update); its last decay."""
        return {"old_decay": self.cfg.dgpo.decay_at(max(ctx.optimizer_steps() - 1, 0))}

    def state(self, names: list[str]) -> dict[str, dict[str, Tensor]]:
        return {"old": self.old.named(names)}

    def load(self, groups: dict[str, dict[str, Tensor]], names: list[str], step: int) -> None:
        self.old.restore(
            groups.get("old"), names, f"checkpoint step-{step} holds no DGPO old policy (old-*.safetensors)"
        )
        self.done = step
