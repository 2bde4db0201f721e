"""`treegrpo compare`'s groups: what each run ran (its run.json settings), runs grouped by label and by those
settings, runs of different rewards refused, a seed repeated in a group warned about (see compare.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..errors import ConfigError
from ..training import resumecheck

# Config keys that do not say what a run learned: its seed (a group's runs differ in it), its name and
# description, and the keys a resume may change (how long and how it runs: resumecheck.RESUMABLE).
NOT_WHAT_WAS_RUN = {"seed", "name", "description"} | resumecheck.RESUMABLE
FIRST_KEYS = ("model", "reward.names", "reward.weights")  # named first when settings differ


@dataclass
class RunStats:
    """One run as `treegrpo compare` reads it (compare.load_run) and groups it (group_runs)."""

    folder: str
    label: str
    preset: str
    seed: int
    iterations: int
    heldout_curve: list[tuple[float, float]]  # (x on the comparison's axis, held-out reward)
    final_heldout: float | None
    gain: float | None  # final held-out minus the first
    seconds_per_iteration: float | None
    phase_seconds: dict[str, float | None]
    forward_nfe_per_sample: float | None  # mean rollout_evals_per_leaf
    backward_nfe_per_sample: float | None  # mean train_evals_per_leaf
    peak_mib: float | None
    zero_std_ratio: float | None = None  # mean over iterations: the share of groups whose rewards all tie
    zero_std_curve: list[tuple[float, float]] = field(default_factory=list)  # (iteration, zero_std_ratio)
    model: str = ""
    rewards: list[str] = field(default_factory=list)
    images_per_second: float | None = None  # mean over iterations
    to_target: float | None = None  # None: never reaches the target (or no target)
    sample_grid: str | None = None  # the latest samples/step-N.png
    monitors: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # drift/KEY: (iteration, value)


def what_was_run(cfg: Config) -> dict[str, Any]:
    """The run's settings as flat keys ("train.lr"), values as JSON text, without NOT_WHAT_WAS_RUN and the keys its
    switches leave without effect (Config.ignored: tree.stop_tol with tree.dynamic off)."""
    flat, skip = resumecheck.flat_keys(cfg.to_dict()), NOT_WHAT_WAS_RUN | cfg.ignored()
    return {k: json.dumps(v, sort_keys=True) for k, v in flat.items() if k not in skip}


def differing(settings: list[dict[str, Any]]) -> list[str]:
    """The keys whose values are not the same in all the settings: model and rewards first, then by name."""
    keys = {k for s in settings for k in s if len({t.get(k) for t in settings}) > 1}
    return sorted(keys, key=lambda k: (FIRST_KEYS.index(k) if k in FIRST_KEYS else len(FIRST_KEYS), k))


def _short(value: str | None, most: int = 32) -> str:
    text = "(unset)" if value is None else value
    return text if len(text) <= most else text[: most - 3] + "..."


def _plain(value: str | None) -> str | None:
    """A JSON string's text without its quotes; other values as they are."""
    return json.loads(value) if value is not None and value.startswith('"') else value


def group_runs(runs: list[RunStats], settings: list[dict[str, Any]], labelled: bool) -> dict[str, list[RunStats]]:
    """The runs by label. Given labels (labelled): runs of one label must have run the same settings, else
    refused naming the keys that differ. Default labels (preset names): runs of one preset whose settings differ
    are split, each part labelled with the preset and its values of the differing keys."""
    by_label: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        by_label.setdefault(r.label, []).append(i)
    for label, idx in list(by_label.items()):
        keys = differing([settings[i] for i in idx])
        if keys and labelled:
            raise ConfigError(
                f"the runs labelled {label!r} did not run the same thing: {_diff(runs, settings, idx, keys)}; "
                "give each setting its own --label"
            )
        if keys:
            _split(runs, settings, idx, keys)
    groups: dict[str, list[RunStats]] = {}
    for r in runs:
        groups.setdefault(r.label, []).append(r)
    return groups


def _split(runs: list[RunStats], settings: list[dict[str, Any]], idx: list[int], keys: list[str]) -> None:
    """Label each run of idx with its values of the first three differing keys; settings that agree on those
    but differ further get a number (#2, #3, ...) so that no two settings share a label."""
    parts: dict[tuple, list[int]] = {}
    for i in idx:
        parts.setdefault(tuple(settings[i].get(k) for k in keys), []).append(i)
    shown, taken = keys[:3], dict[str, int]()
    for members in parts.values():
        first = settings[members[0]]
        label = f"{runs[members[0]].label} (" + ", ".join(f"{k}={_short(_plain(first.get(k)), 24)}" for k in shown)
        label += ", ...)" if len(keys) > len(shown) else ")"
        taken[label] = taken.get(label, 0) + 1
        label += f" #{taken[label]}" if taken[label] > 1 else ""
        for i in members:
            runs[i].label = label


def _diff(runs: list[RunStats], settings: list[dict[str, Any]], idx: list[int], keys: list[str]) -> str:
    """'model "tiny-shapes" in a, "pixel-tiny" in b; reward.names ...' for the first three keys."""
    parts = []
    for k in keys[:3]:
        a = idx[0]
        b = next(i for i in idx if settings[i].get(k) != settings[a].get(k))
        parts.append(
            f"{k} {_short(settings[a].get(k))} in {runs[a].folder}, {_short(settings[b].get(k))} in {runs[b].folder}"
        )
    more = f"; and {len(keys) - 3} more setting{'s' * (len(keys) > 4)}" if len(keys) > 3 else ""
    return "; ".join(parts) + more


def check_one_reward(runs: list[RunStats]) -> None:
    """Held-out rewards of different reward models are not on one scale: refused."""
    by_reward: dict[str, list[str]] = {}
    for r in runs:
        by_reward.setdefault("+".join(r.rewards), []).append(r.folder)
    if len(by_reward) > 1:
        named = "; ".join(f"{k or '(none)'}: {', '.join(v)}" for k, v in by_reward.items())
        raise ConfigError(
            f"the runs are scored by different rewards ({named}), which are not on one scale; compare runs of one "
            "reward, or pass --allow-mixed-rewards to draw them on one axis anyway"
        )


def repeated_seeds(groups: dict[str, list[RunStats]]) -> list[str]:
    """A warning for each seed that more than one run of a group has (its spread is then not over seeds)."""
    out = []
    for label, runs in groups.items():
        seeds = [r.seed for r in runs]
        for seed in sorted({s for s in seeds if seeds.count(s) > 1}):
            folders = ", ".join(r.folder for r in runs if r.seed == seed)
            out.append(
                f"warning: group {label!r} has seed {seed} in {seeds.count(seed)} runs ({folders}); "
                "its mean and spread are over repeated seeds, not independent ones"
            )
    return out
