"""Split steps that move with training (TMPO, arXiv 2605.10983; MAIR-Lab-HUST/TMPO tmpo/sampling/scheduler.py).

Beside the [schedule] section (which moves the SDE window), [splits] moves where the tree branches:

    static    the tree's split steps, as written
    progress  TMPO's progress-aware scheduler: split i sits at early_i + (late_i - early_i) p, p = min(it / over, 1)
              the training progress; with kappa > 0 it is drawn from a Beta of that mean and concentration
              kappa over [0, upper] (TMPO's random jitter), seeded by (seed, iteration); rounded, sorted, at
              least min_gap apart, at most `upper` (the last step tail_guard before the end; never the last step
              under sampler.decode = "x0"). Every prompt of an iteration gets the same steps.
    adaptive  TMPO's adaptive scheduler, per prompt: the prompt's reward level
              alpha = clamp((mean - low) / (high - low), 0.1, 1) from the online estimates (engine/budgets.py:
              the prompt's moving mean reward, the batches' moving lowest and highest), and m fractions drawn from
              Beta(1 + alpha kappa, 1 + (1 - alpha) kappa) (low_reward = "earlier": a low-reward prompt splits
              earlier) or Beta(1 + (1 - alpha) kappa, 1 + alpha kappa) ("later": the released code's formula, in
              which a low-reward prompt splits later), sorted, mapped onto [first split step, upper], spaced and
              bounded as above; seeded by (seed, iteration, prompt id). A prompt never drawn keeps the tree's steps.

Departures from TMPO: its adaptive scheduler reads the batch's mean reward and gives every prompt one schedule;
here each prompt reads its own (the per-prompt variant). Its adaptive scheduler also scales the SDE noise up
for low-reward prompts; here the noise stays the sampler's (the update recomputes each transition's std from
the sampler's settings, so a per-node noise would need a per-node record in the tree format).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from ..errors import ConfigError
from .budgets import BudgetConfig, PromptStats
from .dynamic import Shape, tree_evals
from .rollout import TreeConfig, mix_seed
from .sde import SamplerConfig

KINDS = ("static", "progress", "adaptive")
LOW_REWARD = ("earlier", "later")
SALT = 0x5B117
ALPHA_MIN = 0.1  # TMPO's alpha_min


@dataclass(frozen=True)
class SplitConfig:
    kind: str = "static"  # "static": tree.split_steps | "progress" (TMPO) | "adaptive" (TMPO's, per prompt)
    early: tuple[int, ...] = ()  # progress: the split steps at the start of training
    late: tuple[int, ...] = ()  # progress: ... once the progress reaches 1 (as many as early)
    over: int = 0  # progress: iterations over which the steps move; 0: train.iterations
    kappa: float = 0.0  # progress: Beta jitter concentration (0: none; TMPO's FLUX config: 6); adaptive: how far a
    # prompt's reward level moves its steps (TMPO: 4)
    min_gap: int = 1  # steps at least this far apart
    tail_guard: int = 1  # no split after step steps - 1 - tail_guard (TMPO's tail_guard_steps)
    low_reward: str = "earlier"  # adaptive: a low-reward prompt splits "earlier" | "later" (the released code)
    bounds_decay: float = 0.99  # adaptive: moving average of the batches' lowest and highest reward (TMPO's ema_decay)

    def validate(self, steps: int, decode: str, tree_splits: tuple[int, ...]) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"splits.kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.low_reward not in LOW_REWARD:
            raise ConfigError(f"splits.low_reward must be one of {', '.join(LOW_REWARD)}; got {self.low_reward!r}")
        for name, low in (("over", 0), ("min_gap", 1), ("tail_guard", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"splits.{name} must be >= {low}, got {getattr(self, name)}")
        if not (self.kappa >= 0 and math.isfinite(self.kappa)):
            raise ConfigError(f"splits.kappa must be finite and >= 0, got {self.kappa}")
        if not 0 <= self.bounds_decay < 1:
            raise ConfigError(f"splits.bounds_decay must be in [0, 1), got {self.bounds_decay}")
        if self.kind == "static":
            return
        m = len(self.early) if self.kind == "progress" else len(tree_splits)
        if self.kind == "progress" and (not self.early or len(self.early) != len(self.late)):
            raise ConfigError(
                f"splits.early and splits.late must list the same number (>= 1) of steps; got {len(self.early)} "
                f"and {len(self.late)}"
            )
        if self.kind == "adaptive" and not tree_splits:
            raise ConfigError("splits.kind = 'adaptive' moves the tree's split steps: tree.split_steps is empty")
        up = upper(self, steps, decode)
        first = min((*self.early, *self.late)) if self.kind == "progress" else min(tree_splits)
        if first < 0 or first + (m - 1) * self.min_gap > up:
            raise ConfigError(
                f"{m} split steps {self.min_gap} apart from step {first} do not fit before step {up} "
                f"(steps {steps}, splits.tail_guard {self.tail_guard}); lower splits.min_gap or splits.tail_guard"
            )


def check_adaptive(
    tree: TreeConfig, schedule_split: str, splits: SplitConfig, budget: BudgetConfig, sampler: SamplerConfig
) -> None:
    """[splits] and [budget] against the tree, the sampler and the [schedule] split they would share."""
    steps, decode = sampler.steps, sampler.decode
    splits.validate(steps, decode, tuple(sorted(tree.split_steps)))
    budget.validate()
    if splits.kind != "static" and schedule_split != "none":
        raise ConfigError(
            f"splits.kind = {splits.kind!r} and schedule.split = {schedule_split!r} both set the split steps; keep one"
        )
    if splits.kind == "adaptive" and sampler.solver != "euler":
        raise ConfigError(
            "splits.kind = 'adaptive' gives prompts different split steps: it needs sampler.solver = 'euler'"
        )
    if budget.mode != "off" and not (tree.split_steps or splits.kind == "progress" or schedule_split != "none"):
        raise ConfigError(
            "budget.mode spreads leaves over prompts through the trees' splits; this tree has no split steps "
            "(one leaf per tree): set tree.split_steps"
        )
    width = tree.leaves(steps)
    if budget.mode != "off" and budget.max_width and budget.max_width < width:
        raise ConfigError(f"budget.max_width = {budget.max_width} is below the tree's {width} leaves")
    if splits.kind == "progress":  # every step the splits move between
        for s in (splits.early, splits.late):
            dataclasses.replace(tree, split_steps=tuple(s)).validate(steps, decode)
    _check_cap(tree, splits, budget, steps, decode)


def _check_cap(tree: TreeConfig, splits: SplitConfig, budget: BudgetConfig, steps: int, decode: str) -> None:
    """tree.max_evals against the costliest tree [splits] and [budget] may plan (its earliest split steps, its widest
    budget): a cap it cannot hold would stop the run at the iteration that plans that tree."""
    if not tree.max_evals or (splits.kind == "static" and budget.mode == "off"):
        return
    s, up, gap = tuple(sorted(set(tree.split_steps))), upper(splits, steps, decode), splits.min_gap
    if splits.kind == "progress":  # jittered over [0, upper]; without jitter, never below the early or late step
        pairs = zip(splits.early, splits.late, strict=True)
        low = [0] * len(splits.early) if splits.kappa > 0 else [min(a, b) for a, b in pairs]
        s = _spaced(low, 0, up, gap)
    elif splits.kind == "adaptive":
        s = _spaced([min(s)] * len(s), min(s), up, gap)
    width = budget.bounds(tree.leaves(steps))[1] if budget.mode != "off" else tree.leaves(steps)
    need = tree_evals(Shape(s, width), steps, tree.branch)
    if need > tree.max_evals:
        raise ConfigError(
            f"tree.max_evals = {tree.max_evals} is below the {need} forwards of the costliest tree [splits] and "
            f"[budget] may plan (split steps {list(s)}, {width} leaves); raise it or set 0"
        )


def upper(cfg: SplitConfig, steps: int, decode: str) -> int:
    """The last step a split may take."""
    return min(steps - 1 - cfg.tail_guard, steps - 2 if decode == "x0" else steps - 1)


def _spaced(raw: list[int], lo: int, up: int, gap: int) -> tuple[int, ...]:
    """Sorted, at least gap apart, within [lo, up]: pushed up from the first, then pulled back from the last."""
    s = sorted(min(max(x, lo), up) for x in raw)
    for i in range(1, len(s)):
        s[i] = max(s[i], s[i - 1] + gap)
    for i in range(len(s) - 1, -1, -1):
        s[i] = min(s[i], up - (len(s) - 1 - i) * gap)
    return tuple(s)


def progress_steps(cfg: SplitConfig, steps: int, decode: str, it: int, iterations: int, seed: int) -> tuple[int, ...]:
    """The progress schedule's split steps at iteration `it` (module docstring)."""
    p = min(max(it, 0) / max(cfg.over or iterations, 1), 1.0)
    up = upper(cfg, steps, decode)
    rng = random.Random(mix_seed(seed, it, SALT))
    raw = []
    for a, b in zip(cfg.early, cfg.late, strict=True):
        mu = min(max(a + (b - a) * p, 0.0), float(up))
        if cfg.kappa > 0:
            mb = min(max(mu / max(up, 1), 1e-3), 1 - 1e-3)
            mu = rng.betavariate(mb * cfg.kappa, (1 - mb) * cfg.kappa) * up
        raw.append(int(round(mu)))
    return _spaced(raw, 0, up, cfg.min_gap)


def adaptive_steps(
    cfg: SplitConfig,
    tree_splits: tuple[int, ...],
    steps: int,
    decode: str,
    it: int,
    seed: int,
    prompt_id: int,
    stats: PromptStats | None,
) -> tuple[int, ...]:
    """One prompt's split steps under the adaptive schedule (module docstring)."""
    if stats is None or prompt_id not in stats.mean or stats.low is None or stats.high is None:
        return tree_splits
    span = stats.high - stats.low
    alpha = 0.5 if span < 1e-8 else min(max((stats.mean[prompt_id] - stats.low) / span, ALPHA_MIN), 1.0)
    lo_a, hi_a = 1 + alpha * cfg.kappa, 1 + (1 - alpha) * cfg.kappa
    a, b = (lo_a, hi_a) if cfg.low_reward == "earlier" else (hi_a, lo_a)
    rng = random.Random(mix_seed(seed, it, prompt_id, SALT))
    lo, up = min(tree_splits), upper(cfg, steps, decode)
    frac = sorted(rng.betavariate(a, b) for _ in tree_splits)
    return _spaced([int(f * (up - lo) + lo) for f in frac], lo, up, cfg.min_gap)
