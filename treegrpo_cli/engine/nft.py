"""DiffusionNFT (Zheng et al., ICLR 2026; methods.md 15): reinforcement on the forward process.

No log-probabilities and no SDE: the data are clean samples x0 of a sampling ("old") policy and their
rewards. For a sample with optimality probability r and a noise level t of the sampler's grid:

    x_t = (1 - t) x0 + t eps                       (fresh eps, the forward process)
    v+  = beta v_theta + (1 - beta) v_old          (the implicit positive policy)
    v-  = (1 + beta) v_old - beta v_theta          (the implicit negative policy)
    x0+- = x_t - t v+-
    w+- = mean |x0+- - x0|                         (adaptive weights, no gradient, at least 1e-5)
    L   = c [r |x0+ - x0|^2 / w+ + (1 - r) |x0- - x0|^2 / w-] / beta     (|.|^2: mean over elements)

with c = adv_clip (the released code's scale, scripts/train_nft_sd3.py) and r = clamp(A / adv_clip / 2 + 0.5,
0, 1) from the advantage A clipped to +-adv_clip. A velocity penalty kl_beta |v_theta - v_ref|^2 to the
initial policy is added (the code's train.beta, 1e-4). Gradients of every trained noise level of every
sample of a step are averaged; after the iteration the old policy trails the trained one:
old <- d old + (1 - d) theta, with d from the step count (`decay_at`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError, TreegrpoError, shown
from .grpo import canonical_key
from .protocols import Conditions, Kernel, Policy, select
from .rollout import mix_seed
from .sde import FlowSDE
from .update import Context, Credited, Update, register_update

ADV_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")
DECAYS = ("hard", "ramp", "delayed-ramp")
# decay -> (steps held at 0, rise per step, ceiling): the released code's return_decay types 0, 1, 2
DECAY_RULES = {"hard": (0, 0.0, 0.0), "ramp": (0, 0.001, 0.5), "delayed-ramp": (75, 0.0075, 0.999)}
MIN_WEIGHT = 1e-5  # floor of the adaptive weights


@dataclass(frozen=True)
class NFTConfig:
    beta: float = 1.0  # how far the implicit policies step from the old one (the code: 1.0; 0.1 for OCR)
    adv_clip: float = 5.0  # advantages clipped to +-adv_clip; also the loss scale (the code's adv_clip_max)
    adv_mode: str = "all"  # "all" | "positive_only" | "negative_only" | "one_only" | "binary" (the code's adv_mode)
    timestep_fraction: float = 0.99  # trained noise levels per sample: int(steps x this) of the sampler's grid
    decay: str = "ramp"  # old policy: "hard" copy (d = 0) | "ramp": d = min(0.001 s, 0.5) | "delayed-ramp": 0 for 75
    # steps, then min(0.0075 (s - 75), 0.999) (the code's return_decay 0, 1 (its default), 2)
    steps: int = 1  # optimizer steps per iteration (the code's gradient_step_per_epoch)

    def validate(self) -> None:
        for name, value, allowed in (("adv_mode", self.adv_mode, ADV_MODES), ("decay", self.decay, DECAYS)):
            if value not in allowed:
                raise ConfigError(f"nft.{name} must be one of {', '.join(allowed)}; got {shown(value)}")
        if not (self.beta > 0 and self.adv_clip > 0):
            raise ConfigError(f"nft.beta and nft.adv_clip must be > 0; got {shown(self.beta)}, {shown(self.adv_clip)}")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(f"nft.timestep_fraction must be in (0, 1]; got {shown(self.timestep_fraction)}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"nft.steps must be a whole number >= 1; got {shown(self.steps)}")

    def trained_levels(self, steps: int) -> int:
        """Noise levels trained per sample: int(steps x timestep_fraction), at least 1 (10 steps: 9)."""
        return max(1, int(steps * self.timestep_fraction))


def optimality(adv: Tensor, cfg: NFTConfig) -> Tensor:
    """[B] r in [0, 1] from advantages [B]: clipped to +-adv_clip, shaped by adv_mode, mapped to A / c / 2 + 0.5."""
    c = cfg.adv_clip
    a = adv.float().clamp(-c, c)
    if cfg.adv_mode == "positive_only":
        a = a.clamp(0, c)
    elif cfg.adv_mode == "negative_only":
        a = a.clamp(-c, 0)
    elif cfg.adv_mode == "one_only":
        a = (a > 0).float()
    elif cfg.adv_mode == "binary":
        a = torch.sign(a)
    return (a / c / 2 + 0.5).clamp(0, 1)


def decay_at(step: int, kind: str) -> float:
    """The old policy's decay after `step` optimizer steps of the run (DECAY_RULES)."""
    hold, rate, ceiling = DECAY_RULES[kind]
    return 0.0 if step < hold else min((step - hold) * rate, ceiling)


def nft_loss(
    v: Tensor, v_old: Tensor, x_t: Tensor, x0: Tensor, t: Tensor, r: Tensor, *, beta: float, scale: float
) -> Tensor:
    """[B] NFT loss per row (module docstring): v, v_old, x_t, x0 [B, ...] (v_old: no gradient); t, r [B]."""
    tb = t.float().view((-1,) + (1,) * (x0.dim() - 1))
    v, v_old, x_t, x0 = v.float(), v_old.float().detach(), x_t.float(), x0.float()
    dims = tuple(range(1, x0.dim()))
    terms = []
    for pred in (beta * v + (1 - beta) * v_old, (1 + beta) * v_old - beta * v):
        err = x_t - tb * pred - x0  # x0+- - x0
        with torch.no_grad():
            w = err.double().abs().mean(dims, keepdim=True).clamp(min=MIN_WEIGHT).float()
        terms.append((err**2 / w).mean(dims))
    return scale * (r * terms[0] + (1 - r) * terms[1]) / beta


class OldPolicy:
    """The sampling policy's weights, one tensor per trainable parameter of the policy (a full copy for full
    fine-tuning, the adapter's tensors for LoRA). `swapped` runs the policy with them in place of its own
    by exchanging the parameters' storage (no copy); `follow` moves them toward the trained weights."""

    def __init__(self, params: list[nn.Parameter]):
        self.tensors = [p.detach().clone() for p in params]

    @contextmanager
    def swapped(self, params: list[nn.Parameter]) -> Iterator[None]:
        with torch.no_grad():
            self._swap(params)
            try:
                yield
            finally:
                self._swap(params)

    def _swap(self, params: list[nn.Parameter]) -> None:
        if len(params) != len(self.tensors):
            raise ValueError(f"the old policy has {len(self.tensors)} tensors for {len(params)} parameters")
        for k, p in enumerate(params):
            p.data, self.tensors[k] = self.tensors[k], p.data

    def follow(self, params: list[nn.Parameter], decay: float) -> None:
        """old <- decay old + (1 - decay) theta."""
        with torch.no_grad():
            for o, p in zip(self.tensors, params, strict=True):
                o.mul_(decay).add_(p.detach().to(o.dtype), alpha=1 - decay)

    def named(self, names: list[str]) -> dict[str, Tensor]:
        """{trainable tensor name: tensor}: a checkpoint's tensor group of these weights."""
        return dict(zip(names, self.tensors, strict=True))

    def restore(self, group: dict[str, Tensor] | None, names: list[str], missing: str) -> None:
        """These weights from a checkpoint's tensor group (None: the error `missing`); updates on leaves run
        unsharded, so the group holds whole tensors."""
        if group is None:
            raise TreegrpoError(missing)
        pairs = zip(names, self.tensors, strict=True)
        self.tensors = [group[k].to(t.device, t.dtype).clone() for k, t in pairs]


@dataclass
class NFTBatch:
    """This process's samples of one iteration: clean latents, conditions and r, and the global plan."""

    x0: Tensor  # [L, C, H, W] the sampling policy's clean samples (what the rewards scored)
    cond: Conditions  # rows [L]
    r: Tensor  # [L] optimality probabilities
    keys: Tensor  # [L] int64: each sample's identity, the same whatever the process layout (its noise seed)
    groups: list[Tensor]  # per optimizer step: this process's sample indices in it
    denominators: list[float]  # per optimizer step: samples in it over every process


@dataclass
class LeafPlan:
    """This process's leaves of one iteration and the global step plan of an update that trains every leaf (NFT,
    AWM): the whole batch's leaves, ordered by their canonical key (tree, position in it: the same in one process
    or several), drawn at random into equal parts, each one optimizer step."""

    ids: Tensor  # [L] this process's leaves as node ids of c.whole, ascending (the rows of c.tree.image_latent)
    keys: Tensor  # [L] int64 their canonical keys, the same whatever the process layout
    groups: list[Tensor]  # per optimizer step: this process's leaf indices (into ids) in it
    denominators: list[float]  # per optimizer step: leaves in it over every process


def leaf_plan(c: Credited, rank: int, gen: torch.Generator, steps: int) -> LeafPlan:
    """The leaves of process `rank` and the plan of `steps` optimizer steps (gen draws the parts)."""
    leaves = c.whole.leaves()  # [L_all] global node ids, ascending
    keys = canonical_key(c.whole)[leaves]
    order = torch.argsort(keys)
    perm = torch.randperm(len(order), generator=gen)
    parts = [keys[order[p]] for p in torch.tensor_split(perm, steps)]
    own = (leaves >= c.starts[rank]) & (leaves < c.starts[rank + 1])
    own_keys = keys[own]  # in the order of c.tree.leaves(): local ids ascending
    groups = [torch.nonzero(torch.isin(own_keys, p)).flatten() for p in parts]
    return LeafPlan(ids=leaves[own], keys=own_keys, groups=groups, denominators=[float(len(p)) for p in parts])


def leaf_conditions(c: Credited, cond: Conditions) -> Conditions:
    """Rows [L] of this process's trees' conditions cond (rows [B]), one per leaf of c.tree."""
    trees = c.tree.tree[c.tree.leaves()]
    return {k: v[trees.to(v.device)] for k, v in cond.items()}


def sample_draws(key: int, seed: int, sigmas: Tensor, levels: int, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """One sample's noise levels [levels] (a random subset of the grid's sigmas but 0, in random order, as the
    code shuffles its timesteps per sample) and its fresh noises [levels, *shape], from the sample's own seed."""
    g = torch.Generator().manual_seed(mix_seed(seed, key, 0x4EF7))
    order = torch.randperm(len(sigmas) - 1, generator=g)[:levels]
    return sigmas[order].float(), torch.randn((levels, *shape), generator=g)


def nft_update(
    policy: Policy,
    old: OldPolicy,
    opt: torch.optim.Optimizer,
    sigmas: Tensor,
    b: NFTBatch,
    cfg: NFTConfig,
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
    """One iteration's NFT update: per optimizer step, every sample of the step at int(T x fraction) noise
    levels, gradients averaged over samples and levels (over every process with `sync`: a gradient sum;
    `gather` concatenates a per-row tensor over the processes, for the metrics; progress("update", samples done,
    samples in all) after each chunk's backward)."""
    params = list(policy.trainable_parameters())
    levels = cfg.trained_levels(len(sigmas) - 1)

    def terms(chunk: Tensor) -> dict[str, Tensor]:
        loss, kl = _chunk_terms(
            policy, old, params, sigmas, b, chunk, cfg=cfg, kl_beta=kl_beta, seed=seed, levels=levels, ref=ref
        )
        return {"loss": loss} if kl is None else {"loss": loss, "kl_ref": kl}

    steps = LeafSteps(opt, params, max_batch, max_grad_norm, sync, after_step, progress, gather)
    return steps.run(b.groups, b.denominators, levels, terms, {"loss": True, "kl_ref": ref is not None and kl_beta > 0})


@dataclass
class LeafSteps:
    """The step loop of an update on leaves (NFT, AWM): per optimizer step (a group of rows), every chunk's
    [rows x levels] loss backpropagated divided by the step's rows x levels, the gradients summed over the
    processes (`sync`), clipped, stepped; then the metrics over every process (`gather` concatenates a per-row
    tensor): each term's mean, the mean gradient norm, the steps and the model evaluations."""

    opt: torch.optim.Optimizer
    params: list[nn.Parameter]
    max_batch: int
    max_grad_norm: float
    sync: Callable[[list[nn.Parameter]], None] | None = None
    after_step: Callable[[], None] | None = None
    progress: Callable[[str, int, int], None] | None = None  # ("update", rows done, rows in all) after each chunk
    gather: Callable[[Tensor], Tensor] | None = None

    def run(
        self,
        groups: list[Tensor],
        denominators: list[float],
        levels: int,
        terms: Callable[[Tensor], dict[str, Tensor]],
        on: dict[str, bool],
    ) -> dict[str, float]:
        """terms(chunk) -> {"loss": [c x levels] with gradients, other terms: [rows] logged}; `on`: the terms
        a metrics row reports (in its order), 0.0 where none were measured."""
        parts: dict[str, list[Tensor]] = {k: [] for k in on}
        norms, evals, rows, done = [], 0, sum(len(g) for g in groups), 0
        for group, denom in zip(groups, denominators, strict=True):
            self.opt.zero_grad(set_to_none=True)
            for chunk in torch.split(group, self.max_batch):
                got = terms(chunk)
                (got["loss"].sum() / (denom * levels)).backward()
                for k, x in got.items():
                    parts[k].append(x.detach().cpu())
                evals += len(chunk) * levels
                done += len(chunk)
                if self.progress:
                    self.progress("update", done, rows)
            if self.sync:
                self.sync(self.params)
            norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)))
            self.opt.step()
            if self.after_step:
                self.after_step()
        every = self.gather or (lambda x: x)
        means = {k: every(torch.cat(parts[k]) if parts[k] else torch.zeros(0)) for k, wanted in on.items() if wanted}
        out = {"loss": float(means["loss"].mean()) if len(means["loss"]) else 0.0}
        out |= {
            "grad_norm": sum(norms) / len(norms),
            "optimizer_steps": float(len(groups)),
            "train_evals": float(every(torch.tensor([evals])).sum()),
        }
        return out | {k: float(x.mean()) if len(x) else 0.0 for k, x in means.items() if k != "loss"}


def _chunk_terms(
    policy: Policy,
    old: OldPolicy,
    params: list[nn.Parameter],
    sigmas: Tensor,
    b: NFTBatch,
    chunk: Tensor,
    *,
    cfg: NFTConfig,
    kl_beta: float,
    seed: int,
    levels: int,
    ref: Policy | None,
) -> tuple[Tensor, Tensor | None]:
    """[chunk x levels] loss rows (levels outer) and the velocity penalties, with gradients to backpropagate.
    The samples (host or device) move to the policy's device; the draws are made on the host."""
    dev = params[0].device
    draws = [sample_draws(int(b.keys[i]), seed, sigmas, levels, tuple(b.x0.shape[1:])) for i in chunk.tolist()]
    rows = chunk.to(next(iter(b.cond.values())).device)
    x0, cond, r = b.x0[chunk].to(dev).float(), select(b.cond, rows), b.r[chunk].to(dev)
    losses, kls = [], []
    for j in range(levels):
        t = torch.stack([d[0][j] for d in draws]).to(dev)  # [c]
        eps = torch.stack([d[1][j] for d in draws]).to(dev, x0.dtype)
        tb = t.view((-1,) + (1,) * (x0.dim() - 1))
        x_t = (1 - tb) * x0 + tb * eps
        with old.swapped(params):
            v_old = policy.velocity(x_t, t, cond)
        v = policy.velocity(x_t, t, cond)
        loss = nft_loss(v, v_old, x_t, x0, t, r, beta=cfg.beta, scale=cfg.adv_clip)
        if ref is not None and kl_beta > 0:
            with torch.no_grad():
                v_ref = ref.velocity(x_t, t, cond)
            kl = ((v.float() - v_ref.float()) ** 2).flatten(1).mean(1)
            loss = loss + kl_beta * kl
            kls.append(kl)
        losses.append(loss)
    return torch.cat(losses), (torch.cat(kls) if kls else None)


@register_update
class NFTUpdate(Update):
    """DiffusionNFT on every leaf's advantage; it owns the old (sampling) policy, which rollouts sample with and
    which trails the trained one after each iteration (checkpoint tensors `old-*.safetensors`)."""

    objective = "nft"
    extra_forwards = 1  # the old policy's forward beside each trained one

    def __init__(self, cfg: Any, policy: Policy, sde: Kernel):
        super().__init__(cfg, policy, sde)
        if not isinstance(sde, FlowSDE):
            raise TreegrpoError(
                f"train.objective = nft trains a flow-matching model's velocity; {policy.name} samples "
                "with its own kernel (an epsilon-prediction model): use a GRPO preset"
            )
        self.old = OldPolicy(list(policy.trainable_parameters()))

    def sampling(self, params: list[nn.Parameter]) -> Any:
        return self.old.swapped(params)

    def learn(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> tuple[dict[str, Any], Tensor]:
        train = self.cfg.train
        out = nft_update(
            ctx.policy,
            self.old,
            ctx.opt,
            ctx.sde.sigmas,
            self.batch(c, cond, it, ctx),
            self.cfg.nft,
            kl_beta=train.kl_beta,
            max_grad_norm=train.max_grad_norm,
            seed=mix_seed(self.cfg.seed, 0x4EF7),
            max_batch=ctx.max_batch,
            ref=ctx.ref,
            after_step=ctx.after_step,
            sync=ctx.ranks.sum_gradients,
            gather=ctx.ranks.gather,
            progress=ctx.progress,
        )
        return out, c.leaf[c.whole.is_leaf()]  # NFT trains every leaf, on its advantage

    def batch(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> NFTBatch:
        """This process's leaves (rows of c.tree.image_latent) with their r (from c.leaf: every leaf's advantage,
        NaN elsewhere) and seeds, and the global step plan (leaf_plan, nft.steps parts)."""
        plan = leaf_plan(c, ctx.ranks.rank, ctx.gen, self.cfg.nft.steps)
        latent = c.tree.image_latent
        return NFTBatch(
            x0=latent.float(),
            cond=leaf_conditions(c, cond),
            r=optimality(c.leaf[plan.ids], self.cfg.nft).to(latent.device),
            keys=plan.keys * 1_000_003 + it,  # a sample's noise seed: its key and the iteration (drawn anew)
            groups=plan.groups,
            denominators=plan.denominators,
        )

    def follow(self, params: list[nn.Parameter], ctx: Context) -> dict[str, Any]:
        decay = decay_at(ctx.optimizer_steps(), self.cfg.nft.decay)
        self.old.follow(params, decay)
        return {"old_decay": decay}

    def state(self, names: list[str]) -> dict[str, dict[str, Tensor]]:
        return {"old": self.old.named(names)}

    def load(self, groups: dict[str, dict[str, Tensor]], names: list[str], step: int) -> None:
        self.old.restore(
            groups.get("old"), names, f"checkpoint step-{step} holds no NFT sampling policy (old-*.safetensors)"
        )
