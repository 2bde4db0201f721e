"""The Gaussian KLs of an SDE edge: Flow-GRPO's KL to a reference policy, and Flow-DPPO's asymmetric KL mask (Ping,
Zhou et al., arXiv 2606.11025; methods.md 20), which replaces the ratio clip when train.trust = "kl-mask".

An SDE edge is one Gaussian step x' ~ N(mu, s^2 I) over D latent elements, s the step's std (g sqrt(-dsigma)). The
behaviour policy (the weights that sampled the tree) and the trained one share s, so their KL is exact:

    KL_e = |mu - mu_old|^2 / (2 s^2)         "sum" over the D elements (the paper's Eq. 14)
         = mean(|mu - mu_old|^2) / (2 s^2)    "mean" (the released UniRL code): the paper's / D

An edge with ratio r = exp(l - l_old) and advantage A is dropped (its loss and gradient zeroed) when both hold:

    KL_e >= delta   and   (r > 1 and A > 0  or  r < 1 and A < 0)

i.e. its KL is past the threshold and the update still moves it away from the behaviour policy; a corrective move
(r < 1 with A > 0, r > 1 with A < 0) and every edge under the threshold keep the unclipped loss -A r.

Shapes: E edges, P parents, means [P, C, H, W] (any trailing shape). Arithmetic in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, shown

TRUSTS = ("clip", "kl-mask")
REDUCTIONS = ("sum", "mean")
RECIPE_DELTA = 1e-5  # the released recipe's threshold, of the KL per latent element (its "mean" reduction)
OFF = ("none", "clip")  # the values of train.ratio_norm, train.step_reweight and train.trust that change nothing


def kl_to_reference(mean: Tensor, ref_mean: Tensor, std: Tensor, dsigma: Tensor, form: str = "paper") -> Tensor:
    """[P] Flow-GRPO's KL of a transition to the reference policy's: the mean over latent elements of
    (mean - ref_mean)^2 / (2 var). "paper": var = std^2, the transition's variance g^2 (-dsigma);
    "code" (flow_grpo's released train_sd3.py): var = g^2 = std^2 / (-dsigma), without the step factor,
    so its value is (-dsigma) times the paper's (methods.md 1.3)."""
    var = std.float() ** 2
    if form == "code":
        var = var / (-dsigma.float())
    return ((mean.float() - ref_mean.float()) ** 2).flatten(1).mean(1) / (2 * var)


def gaussian_kl(mean: Tensor, old_mean: Tensor, std: Tensor, reduction: str = "sum") -> Tensor:
    """[P] KL between N(old_mean, s^2 I) and N(mean, s^2 I) from the means [P, ...] and the std s [P]: the squared
    distance of the means reduced over the latent elements ("sum": the exact KL; "mean": / D) over 2 s^2."""
    d2 = ((mean.float() - old_mean.float()) ** 2).flatten(1)
    d2 = d2.sum(1) if reduction == "sum" else d2.mean(1)
    return d2 / (2 * std.float() ** 2)


def drop_mask(kl: Tensor, ratio: Tensor, adv: Tensor, threshold: float) -> Tensor:
    """[E] bool: the edges past the KL threshold whose update moves them further from the behaviour policy, from the
    KL [E], the ratio [E] and the advantage [E]."""
    away = ((ratio > 1) & (adv > 0)) | ((ratio < 1) & (adv < 0))
    return (kl >= threshold) & away


def masked_objective(ratio: Tensor, adv: Tensor, drop: Tensor) -> Tensor:
    """[E] the unclipped loss -A r, 0 (no gradient, even from an overflowing ratio) where drop [E] is set."""
    loss = -adv * ratio
    return torch.where(drop, torch.zeros((), dtype=loss.dtype, device=loss.device), loss)


@dataclass(frozen=True)
class KLMask:
    """Flow-DPPO's trust region in one GRPO update: the loss of a chunk's edges and which of them it dropped."""

    threshold: float  # 0: the released recipe's RECIPE_DELTA per latent element, in the reduction's units
    reduction: str

    def delta(self, elements: int) -> float:
        """The threshold the KL of a latent of `elements` elements is held to."""
        if self.threshold:
            return self.threshold
        return RECIPE_DELTA * (elements if self.reduction == "sum" else 1)

    def objective(
        self, ratio: Tensor, adv: Tensor, mean: Tensor, old_mean: Tensor, std: Tensor, slot: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The masked loss [E] and the drop mask [E] of edges with ratios and advantages [E], from their parents' new
        means [P, ...] (the mask takes no gradient), behaviour means [P, ...] and std [P]; slot [E]: each parent."""
        kl = gaussian_kl(mean.detach(), old_mean, std, self.reduction)[slot]
        drop = drop_mask(kl.to(ratio.device), ratio.detach(), adv, self.delta(mean[0].numel()))
        return masked_objective(ratio, adv, drop), drop


def from_config(cfg: Any) -> KLMask | None:
    """The mask of a TrainConfig with train.trust = "kl-mask"; None with "clip"."""
    return KLMask(float(cfg.kl_mask_threshold), cfg.kl_mask_reduction) if cfg.trust == "kl-mask" else None


def validate(cfg: Any) -> None:
    """train.trust, train.kl_mask_threshold and train.kl_mask_reduction of a TrainConfig, one line per error."""
    if cfg.trust not in TRUSTS:
        raise ConfigError(f"train.trust must be one of {', '.join(TRUSTS)}; got {shown(cfg.trust)}")
    if cfg.kl_mask_reduction not in REDUCTIONS:
        raise ConfigError(
            f"train.kl_mask_reduction must be one of {', '.join(REDUCTIONS)}; got {shown(cfg.kl_mask_reduction)}"
        )
    t = cfg.kl_mask_threshold
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < math.inf:
        raise ConfigError(
            f"train.kl_mask_threshold must be a number >= 0 (0: the released recipe's 1e-5 per element); got {shown(t)}"
        )
    if cfg.trust == "kl-mask" and cfg.ratio_norm == "code":
        raise ConfigError('train.trust = "kl-mask" does not combine with train.ratio_norm = "code" (use "paper")')


def warnings(cfg: Any, defaults: Any) -> list[str]:
    """The mask's settings given while train.trust = "clip" ignores them, one line."""
    keys = [f"train.{k}" for k in ("kl_mask_threshold", "kl_mask_reduction") if getattr(cfg, k) != getattr(defaults, k)]
    if keys and cfg.trust == "clip":
        return [f'warning: {", ".join(keys)} set, but train.trust = "clip" ignores it']
    return []
