"""GRPO-Guard's regulated clipping (Wang et al., CVPR 2026, arXiv 2510.22319; methods.md 19): the importance
ratio of an SDE edge normalised per denoising step (RatioNorm), and a per-step weight of the edge's loss
(gradient reweighting). `train.ratio_norm` and `train.step_reweight` switch them on in engine/grpo.py. RatioGuard
also carries Flow-DPPO's KL mask (engine/kl_mask.py, `train.trust = "kl-mask"`), which needs the same behaviour means.

An SDE edge is one Gaussian step x' ~ N(mu, s^2 I), s the step's std (g sqrt(-dsigma)). The behaviour policy drew
x' = mu_old + s eps; the trained policy moved the mean by delta = mu - mu_old. With log-probs reduced by the
mean over the D latent elements (sampler.log_prob_reduction = "mean"):

    log r  = l - l_old = mean(eps delta) / s - mean(delta^2) / (2 s^2)

Its expectation over eps is minus the shift term mean(delta^2) / (2 s^2) < 0 and its spread grows as s shrinks:
the ratio sits below 1, the more so at the low-noise steps, and the clip band [1 - eps, 1 + eps] stops bounding
the positive-advantage edges. RatioNorm adds the shift back and multiplies by s:

    log r^ = (l - l_old + shift / (2 s^2)) s,   shift = mean(delta^2)       ("paper": per edge)
           = mean(eps delta)                                                   (centred on 0, no 1/s)

"code" (the released flow_grpo script) uses one shift for every edge of a step: the mean of the edges' shifts
over the step's trained edges of the optimizer step (its micro-batch), with the gradient flowing through that
mean (`code_bias`). Gradient reweighting multiplies an edge's clipped loss by 1 / (sigma_t - sigma_t+1), the
inverse step size: d log r^ / d v = eps (d mu / d v) / D and d mu / d v is proportional to the step size.

Shapes: E edges, P parents, T denoising steps, latents [P, C, H, W]. Arithmetic in fp32, sums over edges in fp64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

RATIO_NORMS = ("none", "paper", "code")
STEP_REWEIGHTS = ("none", "dt")

Total = Callable[[Tensor], Tensor]  # [T] this process's sums -> every process's (one process: itself)


def mean_shift(mean: Tensor, old_mean: Tensor, reduction: str = "mean") -> Tensor:
    """[P] the squared distance of the new means from the behaviour means, reduced over the latent elements
    as the log-probs are ("mean" or "sum"): RatioNorm's shift term (with the gradient of `mean`)."""
    d2 = ((mean.float() - old_mean.float()) ** 2).flatten(1)
    return d2.mean(1) if reduction == "mean" else d2.sum(1)


def normalized_log_ratio(new_lp: Tensor, old_lp: Tensor, shift: Tensor, std: Tensor) -> Tensor:
    """[E] RatioNorm's log-ratio (l - l_old + shift / (2 s^2)) s from the log-probs [E], the shift [E] and the
    step's std s [E]."""
    s = std.float()
    return (new_lp.float() - old_lp.float() + shift.float() / (2 * s**2)) * s


def step_weight(sigmas: Tensor, step: Tensor) -> Tensor:
    """[E] gradient reweighting's 1 / (sigma_t - sigma_t+1) of each edge's step t [E], on the grid sigmas [T+1]."""
    s = sigmas.double().cpu()
    i = step.long().cpu()
    return (1.0 / (s[i] - s[i + 1])).float().to(step.device)


def step_totals(values: Tensor, step: Tensor, steps: int, total: Total | None = None) -> Tensor:
    """[T] the sum of values [E] over the edges of each step [E], over every process when `total` sums them."""
    out = torch.zeros(steps, dtype=torch.float64, device=values.device)
    out.index_add_(0, step.to(values.device).long(), values.detach().double())
    return total(out) if total is not None else out


def code_bias(
    shift: Tensor,
    step: Tensor,
    std: Tensor,
    log_ratio: Tensor,
    weight: Tensor,
    slope: Callable[[Tensor], Tensor],
    steps: int,
    total: Total | None = None,
) -> tuple[Tensor, Tensor]:
    """The "code" shift of every step and the coefficient that carries its gradient, from one optimizer step's
    trained edges (every chunk's, this process's; `total` adds the other processes'):

        B_t = mean over the step's edges of shift_e,   c_t = (1 / n_t) sum_e w_e l'(r_e) r_e / (2 s_e)

    shift, std, log_ratio (l - l_old), weight [E] without gradient; slope(r) [E] = d loss_e / d r_e of the clipped
    loss. An edge's loss with B_t held fixed plus c_t shift_e (with its gradient) then has the gradient of the
    loss through the mean. Returns (B [T], c [T]) float32."""
    n = step_totals(torch.ones_like(shift), step, steps, total).clamp(min=1)
    bias = (step_totals(shift, step, steps, total) / n).float()
    ratio = torch.exp(normalized_log_ratio(log_ratio, torch.zeros_like(log_ratio), bias[step], std))
    g = slope(ratio) * ratio * weight / (2 * std.float())
    coef = (step_totals(g, step, steps, total) / n).float()
    return bias, coef


def objective_slope(objective: Callable[[Tensor], Tensor], ratio: Tensor) -> Tensor:
    """[E] d objective(r)_e / d r_e at the ratios [E] (an elementwise loss), as autograd takes it through a clip."""
    r = ratio.detach().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(objective(r).sum(), r)
    return g


Bias = tuple[Tensor, Tensor]  # ratio_norm = "code": [T] each step's shared shift B_t and its gradient's coefficient c_t


@dataclass
class RatioGuard:
    """GRPO-Guard inside one GRPO update (engine/grpo.py grpo_update): it keeps the behaviour means of the parents
    trained after the first optimizer step, gives each optimizer step's "code" shifts and each chunk's loss."""

    ratio_norm: str
    step_reweight: str
    kernel: Any  # the update's Kernel: sigmas, cfg.steps, cfg.log_prob_reduction
    forward: Callable[[Tensor], Any]  # edge ids -> grpo.EdgeTerms of their chunk (called here without gradient)
    pad: Callable[[int, int], None]  # (optimizer step k, chunks run) -> a sharded model's padding forwards
    objective: Callable[[Tensor, Tensor], Tensor]  # (ratios [E], advantages [E]) -> the clipped loss [E]
    total: Total | None = None  # [T] this process's sums -> every process's
    kl_mask: Any = None  # train.trust = "kl-mask": a kl_mask.KLMask, whose masked loss replaces `objective`
    behaviour: list[list[Tensor]] = field(default_factory=list)  # per optimizer step, per chunk: means [P, ...]
    dropped: list[Tensor] = field(default_factory=list)  # kl_mask: each chunk's dropped edges [E] float, on the CPU

    def keep_behaviour(self, chunks: list[list[Tensor]]) -> None:
        """Before the first optimizer step, every later step's chunks' parents' means under the weights that sampled
        the trees (the first step's are its own forward's: the weights have not moved)."""
        self.behaviour = [[] for _ in chunks]
        if self.ratio_norm == "none" and self.kl_mask is None:
            return
        with torch.no_grad():
            for k in range(1, len(chunks)):
                self.behaviour[k] = [self.forward(c).mean.cpu() for c in chunks[k]]
                self.pad(k, len(chunks[k]))

    def step_bias(self, k: int, chunks: list[Tensor], log_prob: Tensor, advantage: Tensor) -> Bias | None:
        """ratio_norm = "code": optimizer step k's (B_t, c_t) over every process's edges (`code_bias`), from forwards
        without gradient at the current weights; None otherwise and for the first step (its shifts are all 0)."""
        if self.ratio_norm != "code" or k == 0:
            return None
        cols = []
        with torch.no_grad():
            for j, chunk in enumerate(chunks):
                e = self.forward(chunk)
                adv = advantage[chunk].to(e.new_lp.device)
                shift, step, weight = self._terms(e, k, j)
                cols.append((shift, step, e.std[e.slot], e.new_lp - log_prob[chunk].to(adv.device), weight, adv))
            self.pad(k, len(chunks))
        shift, step, std, diff, weight, adv = (
            [torch.cat(c) for c in zip(*cols, strict=True)] if cols else [torch.zeros(0)] * 6
        )

        def slope(r: Tensor) -> Tensor:
            return objective_slope(lambda x: self.objective(x, adv), r)

        return code_bias(shift, step.long(), std, diff, weight, slope, self.kernel.cfg.steps, self.total)

    def loss(
        self, e: Any, k: int, j: int, old_lp: Tensor, adv: Tensor, bias: Bias | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Chunk j of optimizer step k (e: its grpo.EdgeTerms): the loss [E], the ratio the clip saw [E] and, with
        "code", the term [E] that carries the gradient through the step's shared shift (not part of the loss)."""
        shift, step, weight = self._terms(e, k, j)
        log_ratio, carry = e.new_lp - old_lp, None
        if self.ratio_norm != "none":  # "code"'s first step has no bias: its shifts are all 0, as the edges' own
            used = shift if bias is None else bias[0][step]
            log_ratio = normalized_log_ratio(e.new_lp, old_lp, used, e.std[e.slot])
            carry = None if bias is None else bias[1][step] * shift
        ratio = torch.exp(log_ratio)
        if self.kl_mask is None:
            return self.objective(ratio, adv) * weight, ratio, carry
        loss, drop = self.kl_mask.objective(ratio, adv, e.mean, self._prior(e, k, j), e.std, e.slot)
        self.dropped.append(drop.float().cpu())
        return loss * weight, ratio, carry

    def mask_metrics(self, gather: Callable[[Tensor], Tensor] | None = None) -> dict[str, float]:
        """kl_mask: the share of the update's edges it dropped (`kl_mask_frac`), over every process when `gather`
        concatenates their [E] tensors; nothing without the mask."""
        if self.kl_mask is None:
            return {}
        drop = torch.cat(self.dropped) if self.dropped else torch.zeros(0)
        drop = gather(drop) if gather is not None else drop
        return {"kl_mask_frac": float(drop.mean()) if drop.numel() else 0.0}

    def _terms(self, e: Any, k: int, j: int) -> tuple[Tensor, Tensor, Tensor]:
        """Each edge's shift [E] (with the gradient of the new mean; 0 when ratio_norm is "none"), step [E] and
        gradient reweighting's factor [E]."""
        step = e.step[e.slot].to(e.new_lp.device)
        weight = step_weight(self.kernel.sigmas, step) if self.step_reweight == "dt" else torch.ones_like(e.new_lp)
        if self.ratio_norm == "none":
            return torch.zeros_like(e.new_lp), step, weight
        return mean_shift(e.mean, self._prior(e, k, j), self.kernel.cfg.log_prob_reduction)[e.slot], step, weight

    def _prior(self, e: Any, k: int, j: int) -> Tensor:
        """[P] the behaviour means of chunk j of optimizer step k: kept before the first step, or the first step's
        own forward's (its weights sampled the trees)."""
        return self.behaviour[k][j].to(e.mean.device) if k else e.mean.detach()
