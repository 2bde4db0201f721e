"""The [guard] section: what a run watches for reward hacking at each held-out evaluation, and what it does when a
rule fires (training/guard.py measures and judges; the rules are read here).

Every rule is a drift from the base model, measured once at iteration 0 on the same prompts and noises:

    gold_drop        a gold reward (one the run does not train on) below its base mean by more than gold_drop of
                     the base's spread over images, while the trained held-out reward is above its base mean
    stat_sigmas      an image statistic (rewards/monitors.py STATS) whose mean moved by more than stat_sigmas of the
                     base's spread over images, either way
    diversity_share  the mean distance between a prompt's samples below diversity_share of the base's
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, shown

ACTIONS = ("warn", "stop")
FEATURES = ("pixels", "efficientnet", "clip")
GUARD_EXIT = 3  # the exit status of a run the guard stopped (after its checkpoint)


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True  # watch the held-out evaluations (monitors in eval.jsonl, the rules below); they measure
    # only what the held-out evaluation draws (train.eval_samples > 0, its cadence: train.eval_every, ...)
    rewards: tuple[str, ...] = ()  # gold rewards: scored on the held-out images, never trained on (--monitor)
    stats: bool = True  # image statistics that need no weights: dark and bright fractions, colour entropy,
    # saturation, high-frequency energy, JPEG size
    diversity: bool = True  # mean distance between a prompt's samples (within) and between prompts' means (across)
    features: str = "pixels"  # diversity's feature space: "pixels" (16 x 16 pooled) | "efficientnet" (the
    # diversity extra) | "clip" (open_clip weights, `treegrpo diversity --help`)
    gold_drop: float = 0.5  # rule: a gold reward this many base spreads below its base while the trained reward
    # rose (0 = off)
    stat_sigmas: float = 3.0  # rule: an image statistic this many base spreads from its base, either way (0 = off)
    diversity_share: float = 0.5  # rule: within-prompt diversity below this share of the base's (0 = off)
    action: str = "warn"  # a fired rule: "warn" (a line, the iteration lines flagged) | "stop" (a checkpoint, then
    # exit status 3 with the reason in one line; `train --resume` goes on)
    best: str = "auto"  # keep RUN/best/step-N, the checkpoint of the best held-out evaluation by this monitor:
    # "reward" (the trained reward), a gold reward's name, "auto" (the first gold reward, else none) or "" (none)

    def validate(self, trained: tuple[str, ...] = ()) -> None:
        if self.action not in ACTIONS:
            raise ConfigError(f"guard.action must be one of {', '.join(ACTIONS)}; got {shown(self.action)}")
        if self.features not in FEATURES:
            raise ConfigError(f"guard.features must be one of {', '.join(FEATURES)}; got {shown(self.features)}")
        for name in ("gold_drop", "stat_sigmas", "diversity_share"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value >= 0 and value == value and value != float("inf")):
                raise ConfigError(f"guard.{name} must be a finite number >= 0 (0 = off), got {shown(value)}")
        if self.diversity_share >= 1:
            raise ConfigError(
                f"guard.diversity_share must be below 1 (a share of the base's), got {self.diversity_share}"
            )
        twice = sorted({n for n in self.rewards if self.rewards.count(n) > 1})
        if twice:
            raise ConfigError(f"guard.rewards names {shown(twice[0])} twice")
        both = [n for n in self.rewards if n in trained]
        if both:
            raise ConfigError(
                f"guard.rewards: the run trains on {', '.join(map(shown, both))}; a gold reward watches what the "
                "training does not see: name a reward outside reward.names (--monitor)"
            )
        if self.best not in ("", "auto", "reward", *self.rewards):
            names = ", ".join(("reward", "auto", *self.rewards))
            raise ConfigError(f'guard.best must be one of {names} or ""; got {shown(self.best)}')

    def best_monitor(self) -> str:
        """The monitor RUN/best follows: "reward", a gold reward's name, or "" (none)."""
        if self.best == "auto":
            return self.rewards[0] if self.rewards else ""
        return self.best
