"""Reward hacking watched at each held-out evaluation ([guard], config/guard.py): monitors measured on the held-out
images, their drift from the base model, the rules judged on them, and the monitor the best checkpoint follows.

    Watch        collects one evaluation's monitors chunk by chunk (the images the held-out reward scores)
    monitor/...  eval.jsonl fields: image statistics (rewards/monitors.py STATS), gold rewards (monitor/gold/NAME)
                 and diversity (monitor/diversity/within, /across); a statistic's or gold reward's spread over the
                 images beside it (NAME/std)
    drift/...    the same against the run's first evaluation (iteration 0, the base model, the same prompts and
                 noises): a statistic or gold reward in base spreads, (mean - base mean) / base std; diversity
                 as a share of the base's; the trained reward as drift/reward, in base spreads
    judge        the rules that fire on an evaluation: [(rule, reason)], e.g. ("stat:jpeg_kb", "jpeg_kb ...")

Nothing here changes what the run learns: the monitors look at images the held-out evaluation draws anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..config.guard import GuardConfig
from ..rewards.base import Reward
from ..rewards.monitors import STATS, diversity, image_stats, pixel_features, standardised
from .sampling import Chunk, score

MONITOR, DRIFT = "monitor/", "drift/"
GOLD = MONITOR + "gold/"
WITHIN, ACROSS = MONITOR + "diversity/within", MONITOR + "diversity/across"
Features = Callable[[Tensor], Tensor]  # images [B, 3, (F,) H, W] float in [0, 1] -> [B, D]


class Watch:
    """One held-out evaluation's monitors: see() each chunk of its images, then row()."""

    def __init__(self, cfg: GuardConfig, gold: Mapping[str, Reward], features: Features | None = None):
        self.cfg, self.gold = cfg, dict(gold)
        self.features = features or pixel_features
        self.values: dict[str, list[Tensor]] = {}  # {monitor: [[b] per chunk]}
        self.feats: list[Tensor] = []  # [[b, D] per chunk]
        self.ids: list[int] = []  # prompt id of every image seen

    def see(self, chunk: Chunk) -> None:
        found: dict[str, Tensor] = {}
        if self.cfg.stats:
            found.update(image_stats(chunk.images))
        found.update({f"gold/{n}": v for n, v in score(self.gold, chunk).items()})
        for k, v in found.items():
            self.values.setdefault(k, []).append(v.float().cpu())
        if self.cfg.diversity:
            self.feats.append(self.features(chunk.images).float().cpu())
            self.ids += [int(k["prompt_id"]) for k in chunk.keys]

    def row(self) -> dict[str, float]:
        """monitor/NAME and monitor/NAME/std of every statistic and gold reward, and diversity; undefined values
        (diversity of one sample a prompt) left out."""
        out: dict[str, float] = {}
        for k, parts in self.values.items():
            v = torch.cat(parts).double()
            out[MONITOR + k] = float(v.mean())
            out[f"{MONITOR}{k}/std"] = float(v.std(correction=0))
        if self.feats:
            d = diversity(torch.cat(self.feats), self.ids)
            out.update({WITHIN: d["within"], ACROSS: d["across"]})
        return {k: v for k, v in out.items() if math.isfinite(v)}


def monitored(row: Mapping[str, Any]) -> list[str]:
    """The statistics and gold rewards an evaluation row holds (their names after monitor/)."""
    return [k[len(MONITOR) :] for k in row if k.startswith(MONITOR) and f"{k}/std" in row]


def drift_fields(row: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, float]:
    """drift/... of an evaluation row against the base's (the run's first evaluation)."""
    out: dict[str, float] = {}
    for k in monitored(row):
        mean, std = base.get(MONITOR + k), base.get(f"{MONITOR}{k}/std")
        if mean is not None and std is not None:
            out[DRIFT + k] = standardised(row[MONITOR + k] - mean, std, mean)
    for key in (WITHIN, ACROSS):
        if key in row and base.get(key, 0) > 0:
            out[DRIFT + key[len(MONITOR) :]] = row[key] / base[key]
    reward_std = _reward_std(base)
    if reward_std is not None:
        out[DRIFT + "reward"] = standardised(row["reward_mean"] - base["reward_mean"], reward_std, base["reward_mean"])
    return out


def _reward_std(row: Mapping[str, Any]) -> float | None:
    """The spread over images of the trained reward: its sem x sqrt(images)."""
    n = row.get("prompts", 0) * row.get("samples", 0)
    sem = row.get("reward_sem")
    return None if not n or sem is None else float(sem) * math.sqrt(n)


def judge(cfg: GuardConfig, row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The rules an evaluation row (with its drift/ fields) fires: [(rule, reason)] in a fixed order."""
    fired: list[tuple[str, str]] = []
    rose = row.get(DRIFT + "reward", 0.0) > 0
    for k in monitored(row):
        d = row.get(DRIFT + k)
        if d is None:
            continue
        if k.startswith("gold/") and cfg.gold_drop and rose and d < -cfg.gold_drop:
            name = k[len("gold/") :]
            why = f"gold reward {name} {-d:.2f} base spreads below the base ({_was(row, k)}) while the trained one rose"
            fired.append((f"gold:{name}", why))
        elif k in STATS and cfg.stat_sigmas and abs(d) > cfg.stat_sigmas:
            way = "above" if d > 0 else "below"
            fired.append((f"stat:{k}", f"{k} {abs(d):.2g} base spreads {way} the base ({_was(row, k)})"))
    share = row.get(DRIFT + "diversity/within")
    if cfg.diversity_share and share is not None and share < cfg.diversity_share:
        fired.append(("diversity", f"within-prompt diversity at {share:.0%} of the base's"))
    return fired


def _was(row: Mapping[str, Any], k: str) -> str:
    return f"{row[MONITOR + k]:.4g} now"


def best_value(row: Mapping[str, Any], monitor: str) -> float | None:
    """The value the best checkpoint follows in an evaluation row: the trained reward or a gold reward."""
    if monitor == "reward":
        return row.get("reward_mean")
    return row.get(GOLD + monitor)


def is_best(row: Mapping[str, Any], earlier: list[Mapping[str, Any]], monitor: str) -> bool:
    """Is `row` better by `monitor` than every earlier evaluation (strictly: the first of equals stays)?"""
    value = best_value(row, monitor)
    if not monitor or value is None:
        return False
    before = [v for r in earlier if (v := best_value(r, monitor)) is not None]
    return not before or value > max(before)
