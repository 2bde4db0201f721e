"""Training runs side by side: held-out reward against wall-clock time, denoiser FLOPs or iterations, cost
per iteration, model evaluations per sample and memory, grouped by label (the preset by default) with mean
and spread over seeds.

Groups are what was run: each run's run.json config (model, rewards, every setting but its seed, its name and the
keys that only change how it runs, resumecheck.RESUMABLE). Runs given one --label must have run the same settings,
or compare refuses them naming the keys that differ; runs without --label are grouped by preset name and split
where their settings differ (the label then names the differing keys). A seed repeated in a group is a warning
(its spread is not over seeds). Runs scored by different rewards are not on one axis: refused unless
allow_mixed_rewards.

    OUT/compare.json       every number of the table, the axis, the target and the baseline
    OUT/reward_vs_X.png    held-out reward against the axis (X = time: wall-clock minutes of training;
                           flops: cumulative denoiser TFLOPs, counted; iterations): mean over seeds, min-max
                           band (over the span every seed of the group covers), a ring at every measured point
    OUT/zero_std.png       zero_std_ratio (the share of groups whose rewards all tie) over iterations, one line per
                           run (only when a run logs it)
    OUT/pareto.png         seconds per iteration against final held-out reward, one point per group
    OUT/index.html         one self-contained page: table, both plots, each run's latest sample grid

Time to target (in the axis' unit): the point from which a held-out curve stays at or above the target to its end,
linearly interpolated at its last upward crossing (one noisy evaluation that touches the target and falls back
does not count), for each run and for each group's mean curve over seeds (every seed held at its last
value after its end). Speed-up: the baseline group's mean-curve time over a group's. Its spread, the range
a rerun's speed-up is expected in: the whole computation redone on seeds drawn again with replacement
from both groups (every draw of n of n seeds when there are few, else 4096 fixed random ones; the target
drawn again with the baseline unless --target fixes it), and the 2.5th and 97.5th percentiles of those
speed-ups, 0 standing for a draw that never reaches the target. Where the baseline's mean curve never
reaches the target, a group's that does has a lower bound instead: the end of the baseline's curves over the
group's time. Other spreads over seeds: the sample standard deviation (0 with one run).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TreegrpoError
from ..store.safeio import contained
from ..training import rundir, runlog
from ..training.runlog import EvalRow, MetricsRow
from .compare_groups import RunStats, check_one_reward, group_runs, repeated_seeds, what_was_run

PHASES = ("rollout", "score", "update")
GRID_POINTS = 64  # points of the common grid a group's mean curve is drawn on
AXES = {  # axis -> (unit, what a curve's x is)
    "time": ("wall-clock minutes", "minutes of training (held-out evaluations excluded)"),
    "flops": ("denoiser TFLOPs", "cumulative denoiser FLOPs / 1e12, counted from the model's shapes"),
    "iterations": ("iterations", "completed iterations"),
}
RESAMPLES = 4096  # most seed draws the speed-up interval is taken over
LEVEL = 0.95  # the speed-up interval's coverage


@dataclass
class Stat:
    """Mean and spread over the runs of a group that have the value (n of them)."""

    mean: float | None
    std: float | None
    n: int


@dataclass
class GroupStats:
    label: str
    runs: list[str]
    seeds: list[int]
    final_heldout: Stat
    gain: Stat
    iterations: Stat
    seconds_per_iteration: Stat
    phase_seconds: dict[str, Stat]
    forward_nfe_per_sample: Stat
    backward_nfe_per_sample: Stat
    peak_mib: Stat
    zero_std_ratio: Stat
    images_per_second: Stat
    to_target: Stat  # each seed's, over the runs that reach the target
    reached_target: int
    curve_to_target: float | None = None  # the mean curve over seeds' (what the speed-up uses)
    speedup: float | None = None  # baseline's curve minutes / this group's curve minutes
    speedup_low: float | None = None  # 95% interval over seeds drawn again (0: never reaches it)
    speedup_high: float | None = None
    speedup_reach: float | None = None  # share of those draws that reach the target
    speedup_above: float | None = None  # the baseline never reaches it: its curve's end / this group's time


@dataclass
class Comparison:
    target: float | None
    baseline: str | None
    measure: str  # "reward": held-out reward | "gain": over each run's first
    groups: list[GroupStats]
    runs: list[RunStats]
    files: list[str] = field(default_factory=list)
    axis: str = "time"  # the x of every curve and time to target: a key of AXES
    weights: str = "default"  # the held-out reward of the weights eval/export use (EMA where kept) | "raw": trained
    unit: str = ""  # its unit, for readers of compare.json
    warnings: list[str] = field(default_factory=list)  # one line each (a seed repeated in a group)

    def __post_init__(self) -> None:
        self.unit = self.unit or AXES[self.axis][0]


# --- one run -----------------------------------------------------------------------------------


def _number(v: Any) -> float | None:
    """v as a float when it is a finite number (a missing key, null or NaN: None)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _mean(values: list[Any]) -> float | None:
    xs = [x for x in map(_number, values) if x is not None]
    return sum(xs) / len(xs) if xs else None


def heldout_curve(
    metrics: list[MetricsRow], evals: list[EvalRow], axis: str = "time", raw: bool = False
) -> list[tuple[float, float]]:
    """(x, reward) of every evaluation, x on the axis (AXES). An evaluation without its own "wall" (or
    "flops_total") takes the value of the metrics row of the iteration before it (or of the latest row
    before that; 0 at iteration 0). raw: the trained weights' reward where a run evaluated an EMA beside them."""

    def reward(e: EvalRow) -> float | None:
        return _number(e.get("raw/reward_mean", e.get("reward_mean")) if raw else e.get("reward_mean"))

    if axis == "iterations":
        return [
            (float(e["iteration"]), y)
            for e in sorted(evals, key=lambda e: e["iteration"])
            if (y := reward(e)) is not None
        ]
    key, scale = ("wall", 60.0) if axis == "time" else ("flops_total", 1e12)
    known = sorted((r["iteration"], v) for r in metrics if (v := _number(r.get(key))) is not None)
    curve = []
    for e in sorted(evals, key=lambda e: e["iteration"]):
        x, y = _number(e.get(key)), reward(e)
        if x is None:
            k = bisect.bisect_right([it for it, _ in known], e["iteration"] - 1)
            x = known[k - 1][1] if k else 0.0
        if y is not None:
            curve.append((x / scale, y))
    return curve


def latest_sample(run: Path) -> Path | None:
    """samples/step-N.png with the largest N, or None."""
    steps = [
        (int(m.group(1)), p) for p in run.glob("samples/step-*.png") if (m := re.fullmatch(r"step-(\d+)\.png", p.name))
    ]
    return contained(run, max(steps)[1], f"run {run}") if steps else None


def load_run(run: Path, label: str | None = None, axis: str = "time", raw: bool = False) -> RunStats:
    """The numbers of one run folder; refused when it is not a run or has no iterations yet, or when the
    flops axis is asked of a run that did not count them."""
    cfg = rundir.load_config(run)
    metrics = runlog.read_metrics(run)
    if not metrics:
        raise TreegrpoError(f"{run}: no iterations in {runlog.METRICS} yet; nothing to compare")
    if axis == "flops" and not any(_number(r.get("flops_total")) for r in metrics):
        raise TreegrpoError(
            f"{run}: its metrics have no flops_total (a run of an older treegrpo, or a model that "
            "cannot count its FLOPs); compare it with --x time or --x iterations"
        )
    evals = runlog.read_evals(run)
    curve = heldout_curve(metrics, evals, axis, raw)
    peaks = [x for x in (_number(r.get("peak_mib")) for r in metrics) if x is not None]
    sample = latest_sample(run)
    return RunStats(
        folder=str(run),
        label=label or cfg.name,
        preset=cfg.name,
        seed=cfg.seed,
        iterations=len(metrics),
        heldout_curve=curve,
        final_heldout=curve[-1][1] if curve else None,
        gain=curve[-1][1] - curve[0][1] if len(curve) > 1 else None,
        seconds_per_iteration=_mean([r.get("seconds", {}).get("total") for r in metrics]),
        phase_seconds={p: _mean([r.get("seconds", {}).get(p) for r in metrics]) for p in PHASES},
        forward_nfe_per_sample=_mean([r.get("rollout_evals_per_leaf") for r in metrics]),
        backward_nfe_per_sample=_mean([r.get("train_evals_per_leaf") for r in metrics]),
        peak_mib=max(peaks) if peaks else None,
        zero_std_ratio=_mean([r.get("zero_std_ratio") for r in metrics]),
        zero_std_curve=[
            (float(r["iteration"]), y) for r in metrics if (y := _number(r.get("zero_std_ratio"))) is not None
        ],
        model=cfg.model,
        rewards=list(cfg.reward.names),
        images_per_second=_mean([r.get("images_per_second") for r in metrics]),
        sample_grid=str(sample) if sample else None,
        monitors=monitor_curves(evals),
    )


def monitor_curves(evals: list[EvalRow]) -> dict[str, list[tuple[float, float]]]:
    """The guard's drift/ fields of a run's held-out evaluations, each against the iteration."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in evals:
        for k, v in e.items():
            if k.startswith("drift/") and (x := _number(v)) is not None:
                out.setdefault(k[len("drift/") :], []).append((float(e["iteration"]), x))
    return out


def time_to_target(curve: list[tuple[float, float]], target: float) -> float | None:
    """The minute from which the curve stays at or above target to its end, interpolated at its last upward
    crossing (a noisy evaluation that touches the target once and falls back does not count); None if
    the curve ends below the target."""
    if not curve or curve[-1][1] < target:
        return None
    below = [k for k, (_, y) in enumerate(curve) if y < target]
    if not below:
        return curve[0][0]
    (t0, y0), (t1, y1) = curve[below[-1]], curve[below[-1] + 1]
    return t0 + (target - y0) / (y1 - y0) * (t1 - t0)


# --- groups ------------------------------------------------------------------------------------


def stat(values: list[float | None]) -> Stat:
    """Mean and sample standard deviation of the values that are not None (std 0 with one)."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return Stat(None, None, 0)
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return Stat(m, sd, len(xs))


def group_stats(
    label: str, runs: list[RunStats], curve_minutes: float | None, base_minutes: float | None
) -> GroupStats:
    """Mean and spread over a group's runs; the speed-up against base_minutes (the baseline's mean-curve time
    to target) when both it and this group's mean-curve time are known and positive (its interval: see
    speedup_interval)."""
    g = GroupStats(
        label=label,
        runs=[r.folder for r in runs],
        seeds=[r.seed for r in runs],
        final_heldout=stat([r.final_heldout for r in runs]),
        gain=stat([r.gain for r in runs]),
        iterations=stat([r.iterations for r in runs]),
        seconds_per_iteration=stat([r.seconds_per_iteration for r in runs]),
        phase_seconds={p: stat([r.phase_seconds[p] for r in runs]) for p in PHASES},
        forward_nfe_per_sample=stat([r.forward_nfe_per_sample for r in runs]),
        backward_nfe_per_sample=stat([r.backward_nfe_per_sample for r in runs]),
        peak_mib=stat([r.peak_mib for r in runs]),
        zero_std_ratio=stat([r.zero_std_ratio for r in runs]),
        images_per_second=stat([r.images_per_second for r in runs]),
        to_target=stat([r.to_target for r in runs]),
        reached_target=sum(r.to_target is not None for r in runs),
        curve_to_target=curve_minutes,
    )
    if base_minutes and curve_minutes:  # a group at the target before training has no finite ratio
        g.speedup = base_minutes / curve_minutes
    return g


# --- the speed-up's spread: seeds drawn again ------------------------------------------------------


def seed_draws(n_base: int, n_group: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Pairs of draws with replacement (baseline seeds, group seeds): all of them when there are at most
    RESAMPLES (3 and 3 seeds: 27 x 27), else RESAMPLES fixed random ones (the same every time)."""
    if (n_base**n_base) * (n_group**n_group) <= RESAMPLES:
        return list(
            itertools.product(
                itertools.product(range(n_base), repeat=n_base), itertools.product(range(n_group), repeat=n_group)
            )
        )
    rng = random.Random(0)
    return [
        (tuple(rng.randrange(n_base) for _ in range(n_base)), tuple(rng.randrange(n_group) for _ in range(n_group)))
        for _ in range(RESAMPLES)
    ]


def speedup_interval(
    base: list[list[tuple[float, float]]], group: list[list[tuple[float, float]]], target: float | None
) -> tuple[float, float, float] | None:
    """(low, high, share reaching the target) of the speed-up over seed draws, both groups drawn again; the
    target is the drawn baseline's mean final value unless given. A draw in which the group never reaches the
    target counts as 0; one in which the baseline never does, or either is there at the start, has no ratio.
    None when no draw has one."""
    ratios, bases, groups = [], {}, {}  # each distinct draw's mean curve (and target) computed once
    for bi, gi in seed_draws(len(base), len(group)):
        if bi not in bases:
            aim = target if target is not None else sum(base[i][-1][1] for i in bi) / len(bi)
            bases[bi] = aim, time_to_target(mean_curve([base[i] for i in bi]), aim)
        aim, t_base = bases[bi]
        if not t_base:
            continue
        if gi not in groups:
            groups[gi] = mean_curve([group[i] for i in gi])
        t = time_to_target(groups[gi], aim)
        if t != 0:
            ratios.append(0.0 if t is None else t_base / t)
    if not ratios:
        return None
    ratios.sort()
    tail = (1 - LEVEL) / 2 * (len(ratios) - 1)
    return ratios[math.floor(tail)], ratios[math.ceil(len(ratios) - 1 - tail)], sum(r > 0 for r in ratios) / len(ratios)


def interp(x: float, curve: list[tuple[float, float]]) -> float:
    """The curve at x, linear between points, held constant outside them."""
    xs = [t for t, _ in curve]
    k = bisect.bisect_right(xs, x)
    if k == 0:
        return curve[0][1]
    if k == len(curve):
        return curve[-1][1]
    (t0, y0), (t1, y1) = curve[k - 1], curve[k]
    return y0 if t1 == t0 else y0 + (x - t0) / (t1 - t0) * (y1 - y0)


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The mean of piecewise-linear curves at every one of their points, each held at its last value after
    its end (a run that stopped a little earlier keeps its final reward)."""
    times = sorted({t for c in curves for t, _ in c})
    return [(t, sum(interp(t, c) for c in curves) / len(curves)) for t in times]


def _labels(folders: list[Path], labels: list[str] | None) -> list[str | None]:
    if labels is not None and len(labels) != len(folders):
        raise TreegrpoError(
            f"--label was given {len(labels)} times for {len(folders)} runs; give one per run, in order"
        )
    if labels is not None and not all(lab.strip() for lab in labels):
        raise TreegrpoError("--label must not be empty")
    seen = set()
    for f in folders:
        if f.resolve() in seen:
            raise TreegrpoError(f"{f} is given twice")
        seen.add(f.resolve())
    return list(labels) if labels is not None else [None] * len(folders)


def compare_runs(
    folders: list[Path],
    labels: list[str] | None = None,
    target: float | None = None,
    baseline: str | None = None,
    gain: bool = False,
    axis: str = "time",
    raw: bool = False,
    allow_mixed_rewards: bool = False,
) -> Comparison:
    """Load the runs, group them by label, and time each to the target (default: the baseline group's
    mean final held-out reward). gain=True measures every curve and the target from each run's first
    held-out evaluation (methods whose samplers start the base model at different rewards). raw=True reads
    the trained weights' held-out reward where a run evaluated its EMA (the default) beside them. Groups: see
    group_runs; runs scored by different rewards are refused unless allow_mixed_rewards."""
    if not folders:
        raise TreegrpoError("give at least one run folder")
    if axis not in AXES:
        raise TreegrpoError(f"--x must be one of {', '.join(AXES)}; got {axis!r}")
    runs = [
        load_run(Path(f), lab, axis, raw)
        for f, lab in zip(folders, _labels([Path(f) for f in folders], labels), strict=True)
    ]
    groups = group_runs(runs, [what_was_run(rundir.load_config(Path(f))) for f in folders], labels is not None)
    if not allow_mixed_rewards:
        check_one_reward(runs)
    if baseline is not None and baseline not in groups:
        raise TreegrpoError(f"--baseline {baseline!r} is none of the runs' labels ({', '.join(groups)})")
    derived = None  # the target as the baseline's mean, when it is that
    if target is None and baseline is not None:
        target = derived = stat([r.gain if gain else r.final_heldout for r in groups[baseline]]).mean
        if target is None:
            raise TreegrpoError(f"the baseline {baseline!r} has no held-out evaluations (eval.jsonl); give --target")
    if target is not None and not math.isfinite(target):
        raise TreegrpoError(f"--target must be a finite number, got {target}")
    curves = {id(r): measured(r, gain) for r in runs}
    for r in runs:
        r.to_target = time_to_target(curves[id(r)], target) if target is not None else None
    by_curve = {k: _curve_time([curves[id(r)] for r in v], target) for k, v in groups.items()}
    base = by_curve[baseline] if baseline is not None else None
    stats = [group_stats(k, v, by_curve[k], base) for k, v in groups.items()]
    if base and baseline is not None:  # (a base curve time implies a baseline)
        given = target if derived is None else None
        base_curves = [curves[id(r)] for r in groups[baseline] if curves[id(r)]]
        for g in stats:
            own = [curves[id(r)] for r in groups[g.label] if curves[id(r)]]
            if g.label != baseline and own and (spread := speedup_interval(base_curves, own, given)):
                g.speedup_low, g.speedup_high, g.speedup_reach = spread
    elif baseline is not None and base is None and target is not None:
        lower_bounds(stats, baseline, [curves[id(r)] for r in groups[baseline]])
    return Comparison(
        target,
        baseline,
        "gain" if gain else "reward",
        stats,
        runs,
        axis=axis,
        weights="raw" if raw else "default",
        warnings=repeated_seeds(groups),
    )


def lower_bounds(stats: list[GroupStats], baseline: str, base_curves: list[list[tuple[float, float]]]) -> None:
    """speedup_above of every group but the baseline, whose mean curve never reaches the target."""
    for g in stats:
        if g.label != baseline:
            g.speedup_above = speedup_above(base_curves, g.curve_to_target)


def speedup_above(base_curves: list[list[tuple[float, float]]], t: float | None) -> float | None:
    """A baseline whose mean curve never reaches the target would reach it, if ever, after its curves' end: a
    group that reaches it at t > 0 is more than end / t times faster (None: it does not, or no curve)."""
    end = max((c[-1][0] for c in base_curves if c), default=0.0)
    return end / t if t and end > 0 else None


def measured(r: RunStats, gain: bool) -> list[tuple[float, float]]:
    """A run's held-out curve, or its gain over its first evaluation."""
    return [(t, y - r.heldout_curve[0][1]) for t, y in r.heldout_curve] if gain else r.heldout_curve


def _curve_time(curves: list[list[tuple[float, float]]], target: float | None) -> float | None:
    curves = [c for c in curves if c]
    return time_to_target(mean_curve(curves), target) if curves and target is not None else None


def to_dict(cmp: Comparison) -> dict[str, Any]:
    return dataclasses.asdict(cmp)
