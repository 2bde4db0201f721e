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

from ..errors import ConfigError, shown
from .budgets import BudgetConfig, PromptStats
from .dynamic import Inherited, Shape, never, set_but_ignored, tree_evals
from .rollout import TreeConfig, mix_seed
from .sde import SamplerConfig

KINDS = ("static", "progress", "adaptive")
USES = {  # the keys each kind reads, beside kind itself
    "static": (),
    "progress": ("early", "late", "over", "kappa", "min_gap", "tail_guard"),
    "adaptive": ("kappa", "min_gap", "tail_guard", "low_reward", "bounds_decay"),
}
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
            raise ConfigError(f"splits.kind must be one of {', '.join(KINDS)}; got {shown(self.kind)}")
        if self.low_reward not in LOW_REWARD:
            raise ConfigError(f"splits.low_reward must be one of {', '.join(LOW_REWARD)}; got {shown(self.low_reward)}")
        for name, low in (("over", 0), ("min_gap", 1), ("tail_guard", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"splits.{name} must be >= {low}, got {getattr(self, name)}")
        if not (self.kappa >= 0 and math.isfinite(self.kappa)):
            raise ConfigError(f"splits.kappa must be finite and >= 0, got {self.kappa}")
        if not 0 <= self.bounds_decay < 1:
            raise ConfigError(f"splits.bounds_decay must be in [0, 1), got {self.bounds_decay}")
        if self.kind == "static":
            return
        up = upper(self, steps, decode)
        if up < 0:
            raise ConfigError(
                f"splits.tail_guard = {self.tail_guard} with sampler.steps = {steps} leaves no step for a split "
                f"(the last a split may take would be {up})"
            )
        if self.kind == "progress":
            if not self.early or len(self.early) != len(self.late):
                raise ConfigError(
                    f"splits.kind = 'progress' moves split i from splits.early[i] to splits.late[i]: the two must list "
                    f"the same number (>= 1) of steps; got {len(self.early)} and {len(self.late)}"
                )
            for name in ("early", "late"):
                self._check_steps(name, steps, decode, up)
            return
        if not tree_splits:
            raise ConfigError("splits.kind = 'adaptive' moves the tree's split steps: tree.split_steps is empty")
        m, first = len(tree_splits), min(tree_splits)
        if first + (m - 1) * self.min_gap > up:
            raise ConfigError(
                f"{m} split steps {self.min_gap} apart from step {first} do not fit before step {up} "
                f"(steps {steps}, splits.tail_guard {self.tail_guard}); lower splits.min_gap or splits.tail_guard"
            )

    def ignored(self) -> tuple[str, ...]:
        """The keys that take no effect at this splits.kind."""
        return tuple(f.name for f in dataclasses.fields(self) if f.name != "kind" and f.name not in USES[self.kind])

    def warnings(self, inherited: Inherited = never) -> list[str]:
        """Legal values that are almost surely a mistake: keys the user set that this kind ignores, a U-shaped
        jitter."""
        out = set_but_ignored(self, self.ignored(), "splits.kind", inherited)
        if self.kind == "progress" and 0 < self.kappa < 1:
            out.append(
                f"warning: splits.kappa = {self.kappa:g} is a concentration: below 1 the Beta jitter is U-shaped and "
                "throws the splits to the first and last steps allowed (a larger kappa jitters less; TMPO: 6)"
            )
        return out

    def _check_steps(self, name: str, steps: int, decode: str, up: int) -> None:
        """splits.early or splits.late: ascending, at least min_gap apart, within 0..up (progress_steps would
        otherwise move them without a word)."""
        s = list(getattr(self, name))
        head = f"splits.{name} = {s}"
        if any(not 0 <= x < steps for x in s):
            raise ConfigError(f"{head}: steps outside the {steps} denoising steps 0..{steps - 1}")
        if decode == "x0" and steps - 1 in s:
            raise ConfigError(
                f"{head}: a split at the last step {steps - 1} yields identical images when decoding the "
                "x0-prediction; move it earlier or set sampler.decode = 'final'"
            )
        if any(b <= a for a, b in zip(s, s[1:], strict=False)):
            raise ConfigError(f"{head} must be ascending, each step once (split i moves from early[i] to late[i])")
        if max(s) > up:
            raise ConfigError(
                f"{head}: step {max(s)} is after step {up}, the last a split may take (splits.tail_guard = "
                f"{self.tail_guard} of sampler.steps = {steps}); move it earlier or lower splits.tail_guard"
            )
        if any(b - a < self.min_gap for a, b in zip(s, s[1:], strict=False)):
            raise ConfigError(f"{head} has steps closer than splits.min_gap = {self.min_gap}; space them or lower it")


def check_adaptive(
    tree: TreeConfig, schedule_split: str, splits: SplitConfig, budget: BudgetConfig, sampler: SamplerConfig
) -> None:
    """[splits] and [budget] against the tree, the sampler and the [schedule] split they would share."""
    steps, decode = sampler.steps, sampler.decode
    splits.validate(steps, decode, tuple(sorted(tree.split_steps)))
    budget.validate()
    if splits.kind != "static" and schedule_split != "none":
        raise ConfigError(
            f"splits.kind = {shown(splits.kind)} and schedule.split = {shown(schedule_split)} both set the split "
            "steps; keep one"
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
    if budget.replace_after and budget.mode == "off" and splits.kind != "adaptive":
        raise ConfigError(
            f"budget.replace_after = {budget.replace_after} reads the per-prompt estimates that budget.mode = "
            "'spread' keeps; with budget.mode = 'off' no prompt would ever be replaced"
        )
    width = sampled_tree(tree, splits).leaves(steps)
    if budget.mode != "off" and budget.max_width and budget.max_width < width:
        raise ConfigError(f"budget.max_width = {budget.max_width} is below the tree's {width} leaves")
    _check_cap(tree, splits, budget, steps)
    # the lists themselves were checked by splits.validate, and their trees' forwards by _check_cap
    if splits.kind == "progress" and tree.dynamic != "off" and len(splits.early) < 2:
        raise ConfigError(
            f"tree.dynamic = {shown(tree.dynamic)} decides at the split steps after the first: it needs >= 2, and "
            f"splits.early and splits.late list {len(splits.early)}"
        )


def _check_cap(tree: TreeConfig, splits: SplitConfig, budget: BudgetConfig, steps: int) -> None:
    """tree.max_evals holds for every tree the run may sample, not only the tree as written: moving splits and
    per-prompt budgets can sample a larger one (refused here, not at the iteration that first draws it)."""
    if not tree.max_evals or (splits.kind == "static" and budget.mode == "off"):
        return
    width = sampled_tree(tree, splits).leaves(steps)
    wide = budget.bounds(width)[1] if budget.mode != "off" else width
    dense = densest_steps(splits, tuple(sorted(set(tree.split_steps))))
    need = tree_evals(Shape(dense, wide), steps, tree.branch)
    if need > tree.max_evals:
        what = " and ".join(
            ([f"splits.kind = {shown(splits.kind)}"] if splits.kind != "static" else [])
            + (["budget.mode = 'spread'"] if budget.mode != "off" else [])
        )
        raise ConfigError(
            f"tree.max_evals = {tree.max_evals} is below the {need} forwards of the largest tree that {what} may "
            f"sample (splits at {shown(list(dense))}, {wide} leaves); raise it or set 0 (each tree's own)"
        )


def densest_steps(cfg: SplitConfig, tree_splits: tuple[int, ...]) -> tuple[int, ...]:
    """The earliest split steps (the most forwards) this schedule may give a tree: the tree's own (static), each
    split at the earlier of its early and late step (progress), or packed min_gap apart from the lowest step a
    draw may take (progress with jitter: step 0; adaptive: the tree's first split)."""
    if cfg.kind == "static":
        return tree_splits
    if cfg.kind == "progress" and cfg.kappa == 0:
        return tuple(min(a, b) for a, b in zip(cfg.early, cfg.late, strict=True))
    m, lo = (len(cfg.early), 0) if cfg.kind == "progress" else (len(tree_splits), min(tree_splits))
    return tuple(lo + i * cfg.min_gap for i in range(m))


def sampled_tree(tree: TreeConfig, splits: SplitConfig) -> TreeConfig:
    """The tree an iteration samples, as far as its number of splits goes: progress moves its splits to as many as
    splits.early lists."""
    return dataclasses.replace(tree, split_steps=tuple(splits.early)) if splits.kind == "progress" else tree


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
    *,
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
