"""Per-prompt leaf budgets across an iteration, from an online estimate of each prompt's reward spread.

A prompt whose groups tie (every leaf the same reward) teaches nothing: its advantages are zero. The
iteration's leaf budget B = prompts x w (w the tree's leaves) is spread over the drawn prompts in proportion
to each prompt's estimated within-group reward spread, so prompts whose last groups tied get fewer leaves;
with budget.replace_after, a prompt whose last groups all tied is replaced by the next prompt of the
iteration's draw, as DAPO's dynamic sampling drops tied groups (for LLMs; there after sampling, here before).

The estimator (PromptStats), per prompt id, over the draws of that prompt:
    spread   root of the exponential moving average of the unbiased (Bessel) variance of its group's leaf
             rewards: s^2 <- decay * s^2 + (1 - decay) * var (the first draw sets s^2 = var). Unbiased whatever
             the group's size: the allocation sets that size, and a population std (expected 0.56 sigma from two
             leaves, 0.98 sigma from 32) would read a prompt given few leaves as less spread, and give it fewer
             again. A draw of one leaf shows no spread and no tie: it leaves the prompt's estimates as they were.
    mean     the moving average (decay) of its group's mean reward (TMPO's adaptive splits read it, engine/splits.py)
    ties     how many of its latest draws in a row tied (reset by a draw that did not)
and over the batches, the moving average of the lowest and highest leaf reward (TMPO's reward bounds).
Its memory: a prompt's draw k draws back weighs (1 - decay) decay^k, so about 1 / (1 - decay) draws
(decay 0.5: the last two); four numbers per prompt ever drawn. It is updated from the whole batch's scores
(the same on every process), saved in every checkpoint (trainer_state.json) and restored on resume, so a
resumed run plans the same iterations as an uninterrupted one.

Allocation: weight_p = max(s_p, floor x mean of the batch's s) (a prompt never drawn takes the mean s of the
prompts that were; none drawn yet: equal weights, i.e. the fixed tree at every prompt), leaves per tree
w_p in [min_width, max_width] proportional to weight_p by water-filling, rounded by largest remainder;
sum_p w_p never exceeds B (it equals B when the bounds allow). It applies to any tree that splits, the flat
baselines included (DanceGRPO: the root's children at step 0); Flow-GRPO's chains have one leaf each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from .dynamic import Inherited, never, set_but_ignored

MODES = ("off", "spread")


@dataclass(frozen=True)
class BudgetConfig:
    mode: str = "off"  # "off" | "spread": an iteration's leaves over its prompts by their estimated reward spread
    decay: float = 0.5  # weight of a prompt's past draws in its estimates (memory about 1 / (1 - decay) draws)
    floor: float = 0.1  # a prompt's weight is at least this times the batch's mean estimate (tied prompts keep some)
    min_width: int = 2  # fewest leaves per tree (two to compare)
    max_width: int = 0  # most leaves per tree; 0: twice the tree's
    replace_after: int = 0  # a prompt whose last this many groups tied is replaced by the draw's next prompt; 0: never

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"budget.mode must be one of {', '.join(MODES)}; got {shown(self.mode)}")
        if not 0 <= self.decay < 1:
            raise ConfigError(f"budget.decay must be in [0, 1), got {self.decay}")
        if not (self.floor >= 0 and math.isfinite(self.floor)):
            raise ConfigError(f"budget.floor must be finite and >= 0, got {self.floor}")
        if self.min_width < 1:
            raise ConfigError(f"budget.min_width must be >= 1, got {self.min_width}")
        if self.max_width and self.max_width < self.min_width:
            raise ConfigError(f"budget.max_width {self.max_width} is below budget.min_width {self.min_width}")
        if self.replace_after < 0:
            raise ConfigError(f"budget.replace_after must be >= 0 (0: never), got {self.replace_after}")

    def ignored(self, adaptive: bool) -> tuple[str, ...]:
        """The keys that take no effect at this budget.mode (adaptive: [splits] reads budget.decay's estimates)."""
        return ("floor", "min_width", "max_width") + (() if adaptive else ("decay",)) if self.mode == "off" else ()

    def warnings(self, width: int, adaptive: bool, inherited: Inherited = never) -> list[str]:
        """Legal values that are almost surely a mistake, for a tree of `width` leaves (adaptive: [splits] reads
        budget.decay's estimates)."""
        if self.mode == "off":
            return set_but_ignored(self, self.ignored(adaptive), "budget.mode", inherited)
        lo, hi = self.bounds(width)
        if (lo >= width or hi <= width) and not self.replace_after:
            return [
                f"warning: budget.mode = 'spread' moves no leaves: between budget.min_width and budget.max_width "
                f"({lo} to {hi} leaves a tree) every prompt keeps the tree's {width}"
            ]
        return []

    def bounds(self, width: int) -> tuple[int, int]:
        """(fewest, most) leaves per tree for a tree of `width` leaves."""
        return min(self.min_width, width), self.max_width or 2 * width


@dataclass
class PromptStats:
    """The online per-prompt estimates (module docstring); keys are prompt ids."""

    decay: float = 0.5
    bounds_decay: float = 0.99
    spread: dict[int, float] = field(default_factory=dict)
    mean: dict[int, float] = field(default_factory=dict)
    ties: dict[int, int] = field(default_factory=dict)
    low: float | None = None  # moving average of the batches' lowest leaf reward
    high: float | None = None  # ... and highest

    def update(self, prompt: Tensor, reward: Tensor, skipped: tuple[int, ...] | list[int] = ()) -> None:
        """One iteration's leaves: prompt ids [L] and total rewards [L]. A prompt skipped by the replacement rule
        rests: its tie count goes down by one (it is drawn again once it has rested as long as it tied)."""
        r, p = reward.detach().double().cpu(), prompt.detach().long().cpu()
        for pid in torch.unique(p).tolist():
            x = r[p == pid]
            if x.numel() < 2:  # one leaf shows no spread and no tie (the allocation's size, not the prompt's)
                continue
            old = self.spread.get(pid)
            var = self._ema(None if old is None else old * old, float(x.var(correction=1)), self.decay)
            self.spread[pid] = math.sqrt(var)
            self.mean[pid] = self._ema(self.mean.get(pid), float(x.mean()), self.decay)
            self.ties[pid] = self.ties.get(pid, 0) + 1 if bool(x.max() == x.min()) else 0
        for pid in skipped:
            self.ties[pid] = max(self.ties.get(pid, 0) - 1, 0)
        if r.numel():
            self.low = self._ema(self.low, float(r.min()), self.bounds_decay)
            self.high = self._ema(self.high, float(r.max()), self.bounds_decay)

    @staticmethod
    def _ema(old: float | None, new: float, decay: float) -> float:
        return new if old is None else decay * old + (1 - decay) * new

    def to_json(self) -> dict[str, Any]:
        keys = list(self.spread)  # in the order the run first drew them: allocate's sums add them in this order
        return {
            "decay": self.decay,
            "bounds_decay": self.bounds_decay,
            "prompts": keys,
            "spread": [self.spread[k] for k in keys],
            "mean": [self.mean[k] for k in keys],
            "ties": [self.ties.get(k, 0) for k in keys],
            "low": self.low,
            "high": self.high,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PromptStats:
        try:
            keys = [int(k) for k in d["prompts"]]
            return cls(
                float(d["decay"]),
                float(d["bounds_decay"]),
                dict(zip(keys, map(float, d["spread"]), strict=True)),
                dict(zip(keys, map(float, d["mean"]), strict=True)),
                dict(zip(keys, map(int, d["ties"]), strict=True)),
                None if d["low"] is None else float(d["low"]),
                None if d["high"] is None else float(d["high"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"prompt statistics in the checkpoint are damaged ({e})") from None


def replace_tied(
    ids: list[int], order: list[int], stats: PromptStats | None, after: int
) -> tuple[list[int], list[int]]:
    """DAPO-style replacement: the drawn ids with every prompt whose last `after` groups tied swapped for the next
    untied prompts of `order` (the iteration's permutation, not already drawn). Returns (ids, skipped ids)."""
    if not after or stats is None:
        return ids, []
    tied = {p for p in ids if stats.ties.get(p, 0) >= after}
    if not tied:
        return ids, []
    spare = iter([p for p in order if p not in set(ids) and stats.ties.get(p, 0) < after])
    out = [p if p not in tied else next(spare, p) for p in ids]
    return out, sorted({p for p, q in zip(ids, out, strict=True) if p != q})


def allocate(cfg: BudgetConfig, stats: PromptStats | None, ids: list[int], width: int) -> list[int]:
    """Leaves per tree of every drawn prompt (module docstring): sum <= len(ids) * width."""
    n, lo_w, hi_w = len(ids), *cfg.bounds(width)
    known = [stats.spread[p] for p in ids if p in stats.spread] if stats else []
    if cfg.mode == "off" or not known or n == 0:
        return [width] * n
    prior = sum(stats.spread.values()) / len(stats.spread) if stats and stats.spread else 0.0
    s = [stats.spread.get(p, prior) if stats else prior for p in ids]
    mean = sum(s) / n
    if mean <= 0:
        return [width] * n
    weight = [max(x, cfg.floor * mean) for x in s]
    return _round(_water_fill(weight, float(n * width), lo_w, hi_w), n * width, lo_w, hi_w)


def _water_fill(weight: list[float], total: float, lo: int, hi: int) -> list[float]:
    """x_p = clamp(c weight_p, lo, hi) with c such that sum x_p = total, where the bounds allow it (the sum is
    monotone in c: bisection)."""

    def filled(c: float) -> list[float]:
        return [min(max(c * w, float(lo)), float(hi)) for w in weight]

    a, b = 0.0, 1.0
    while sum(filled(b)) < total and b < 1e300:
        b *= 2
    for _ in range(200):
        m = (a + b) / 2
        a, b = (m, b) if sum(filled(m)) < total else (a, m)
    return filled(b)


def _round(x: list[float], total: int, lo: int, hi: int) -> list[int]:
    """Integers within [lo, hi] near x, summing to at most total: floors, then largest remainders (ties: first)."""
    out = [min(max(math.floor(v), lo), hi) for v in x]
    order = sorted(range(len(x)), key=lambda i: (-(x[i] - math.floor(x[i])), i))
    for i in order:
        if sum(out) >= total:
            break
        if out[i] < hi:
            out[i] += 1
    while sum(out) > total:  # the lower bounds alone may pass the budget: take from the largest
        i = max(range(len(out)), key=lambda k: (out[k], -k))
        if out[i] <= 1:
            break
        out[i] -= 1
    return out
