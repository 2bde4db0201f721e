"""SDE windows that advance with the training iteration (methods.md 4, 6.1, 7.1 and 13.7).

A window W = {l, ..., l + w - 1} of consecutive denoising steps is stochastic (SDE, trained);
every other step is a deterministic ODE step. Where the left edge l sits depends on the kind:

    static       the tree config as written (no window is applied at all)
    progressive  MixGRPO: l = start + stride * (iteration // every); once the window would reach
                 max_step it rolls back to `start` (or stays at the last position)
    shifting     TreeGRPO released code: the same arithmetic without roll-back, clamped so the
                 window never contains the last step
    geometric    TreeGRPO paper: l ~ P(i) = (1 - r) r^i / (1 - r^(T - w)) on {0, ..., T - w - 1},
                 drawn from a generator seeded by (seed, iteration) only

`split` decides where the tree branches: "none" keeps tree.split_steps, "first" branches once at
the window's first step (MixGRPO's shared ODE prefix then a fan-out), "all" branches at every
window step (TreeGRPO: k^w leaves).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from .rollout import TreeConfig, mix_seed
from .sde import DECODES

KINDS = ("static", "progressive", "geometric", "shifting")
SPLITS = ("none", "first", "all")
GEOMETRIC_SALT = 0x5C4ED


@dataclass(frozen=True)
class ScheduleConfig:
    kind: str = "static"  # "static" | "progressive" (MixGRPO) | "geometric" (TreeGRPO paper) | "shifting" (code)
    window: int = 4  # w: number of consecutive SDE steps
    start: int = 0  # first window step at iteration 0 (progressive, shifting)
    stride: int = 1  # progressive/shifting: the window moves by this many steps ...
    every: int = 25  # ... every this many iterations (MixGRPO tau = 25; TreeGRPO code tau = 50)
    max_step: int | None = None  # progressive: no window step may reach this index; None = T - 1 (decode "x0") else T
    roll_back: bool = True  # progressive: restart at `start` once the window would pass max_step
    r: float = 0.5  # geometric: ratio of the truncated geometric distribution
    split: str = "none"  # "none" | "first" | "all": where the tree branches relative to the window

    def validate(self, steps: int, decode: str = "x0") -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"schedule.kind must be one of {', '.join(KINDS)}; got {shown(self.kind)}")
        if self.split not in SPLITS:
            raise ConfigError(f"schedule.split must be one of {', '.join(SPLITS)}; got {shown(self.split)}")
        if decode not in DECODES:
            raise ConfigError(f"sampler.decode must be one of {', '.join(DECODES)}; got {shown(decode)}")
        for name, value, low in (
            ("window", self.window, 1),
            ("start", self.start, 0),
            ("stride", self.stride, 0),
            ("every", self.every, 1),
        ):
            if not _is_int(value) or value < low:
                raise ConfigError(f"schedule.{name} must be an integer >= {low}; got {shown(value)}")
        if not isinstance(self.r, (int, float)) or isinstance(self.r, bool) or not 0 < self.r <= 1:
            raise ConfigError(f"schedule.r must be in (0, 1]; got {shown(self.r)}")
        if self.max_step is not None and (not _is_int(self.max_step) or not 1 <= self.max_step <= steps):
            raise ConfigError(f"schedule.max_step must be an integer in 1..{steps} or null; got {shown(self.max_step)}")
        if self.kind == "static":
            if self.split != "none":
                raise ConfigError(
                    f"schedule.split {shown(self.split)} needs a moving window; "
                    "schedule.kind 'static' keeps the tree config as written"
                )
            return
        if self.window > steps:
            raise ConfigError(f"schedule.window {self.window} is longer than the {steps} denoising steps")
        self._validate_fit(steps, decode)

    def _validate_fit(self, steps: int, decode: str) -> None:
        """The window fits at every iteration, and no split lands on the last step under decode 'x0'."""
        w = self.window
        if self.kind == "geometric" and w > steps - 1:
            raise ConfigError(
                f"schedule.window must be <= {steps - 1} for kind 'geometric' "
                f"(the window never contains the last step); got {w}"
            )
        if self.kind == "shifting" and self.start + w > steps - 1:
            raise ConfigError(
                f"schedule.start + schedule.window must be <= {steps - 1} for kind 'shifting' "
                f"(the window never contains the last step); got {self.start + w}"
            )
        if self.kind != "progressive":
            return
        limit = _limit(self, steps, decode)
        if self.start + w > limit:
            raise ConfigError(
                f"schedule.start + schedule.window must be <= {limit} (no window step may reach "
                f"schedule.max_step {limit}); got {self.start + w}"
            )
        last = {"none": -1, "first": limit - w, "all": limit - 1}[self.split]
        if decode == "x0" and last >= steps - 1:
            raise ConfigError(
                f"schedule.split {shown(self.split)} would split at the last step {steps - 1} with "
                f"sampler.decode 'x0'; set schedule.max_step <= {steps - 1}"
            )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _limit(cfg: ScheduleConfig, steps: int, decode: str) -> int:
    """Progressive: the first step index a window may not contain."""
    if cfg.max_step is not None:
        return cfg.max_step
    return steps - 1 if decode == "x0" else steps


def geometric_probs(steps: int, window: int, r: float) -> Tensor:
    """[T - w] float64: P(i) = (1 - r) r^i / (1 - r^(T - w)); uniform when r = 1."""
    n = steps - window
    if n < 1:
        raise ConfigError(f"schedule.window must be <= {steps - 1} for kind 'geometric'; got {window}")
    if not 0 < r <= 1:
        raise ConfigError(f"schedule.r must be in (0, 1]; got {shown(r)}")
    if r == 1:
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    i = torch.arange(n, dtype=torch.float64)
    return (1 - r) * r**i / (1 - r**n)


def window_start(cfg: ScheduleConfig, steps: int, iteration: int, seed: int, decode: str = "x0") -> int:
    """The window's first step at this training iteration."""
    cfg.validate(steps, decode)
    if cfg.kind == "static":
        return cfg.start
    if cfg.kind == "geometric":
        g = torch.Generator().manual_seed(mix_seed(seed, iteration, GEOMETRIC_SALT))
        probs = geometric_probs(steps, cfg.window, cfg.r)
        return int(torch.multinomial(probs, 1, generator=g).item())
    offset = cfg.stride * (max(int(iteration), 0) // cfg.every)
    if cfg.kind == "shifting":
        return min(cfg.start + offset, steps - 1 - cfg.window)
    last = _limit(cfg, steps, decode) - cfg.window  # last valid window start
    if cfg.roll_back:
        return cfg.start + offset % (last - cfg.start + 1)
    return min(cfg.start + offset, last)


def tree_for_iteration(
    tree: TreeConfig, cfg: ScheduleConfig, steps: int, iteration: int, seed: int, decode: str = "x0"
) -> TreeConfig:
    """The tree config of this iteration: SDE steps = the window, split steps per cfg.split."""
    if cfg.kind == "static":
        cfg.validate(steps, decode)
        return tree
    start = window_start(cfg, steps, iteration, seed, decode)
    window = tuple(range(start, start + cfg.window))
    splits = {"none": tree.split_steps, "first": (start,), "all": window}[cfg.split]
    out = dataclasses.replace(tree, sde_steps=window, split_steps=splits)
    out.validate(steps, decode)
    return out
