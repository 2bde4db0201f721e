"""The study's tables (bench/study.py): what they read of a kept run's metrics rows, and the markdown they write.

The learning-rate sweep and its best rates, the ablation's one-factor effects, the speed-ups and their costs, what an
early iteration learns from, and what the adaptive trees did over a whole run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

WORLD_LR = "1e-4"  # the world's default rate: in the lr plan a variant at it keeps its bare label, others get @lrX


def run_metrics(run: Path) -> dict[str, float]:
    """What the tables read of a run's metrics rows: optimizer steps, denoiser TFLOPs and within-group reward std an
    iteration, and the means over its first quarter of iterations that signal_table reports."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    quarter = max(1, len(rows) // 4)
    early = {
        f"early/{k}": sum(x.get(k, 0.0) for x in rows[:quarter]) / quarter
        for k in ("zero_std_ratio", "reward_group_std", "trained_edges")
    }
    spent, saved = sum(x.get("flops", 0) for x in rows), sum(x.get("flops_saved", 0) for x in rows)
    tied = [x["tied_leaf_share"] for x in rows if "tied_leaf_share" in x]  # rows before the key: nan
    adaptive = {  # over the whole run: what savings_table reports (0 where a run has no adaptive trees)
        f"run/{k}": sum(float(x.get(k, 0.0)) for x in rows) / len(rows)
        for k in ("zero_std_ratio", "early_stops", "fallbacks", "replaced", "reward_images", "leaves")
    }
    forward = rollout_forward_flops(rows)
    rollout = [forward * x.get("rollout_evals", 0) for x in rows]
    return {
        **adaptive,
        "run/flops_saved_share": saved / max(spent + saved, 1),
        "run/rollout_share": sum(rollout) / max(spent, 1),
        # what flop_split reads: its own fit of a forward's FLOPs (nan where this run cannot tell), and the sums
        "run/rollout_forward_flops": forward,
        "run/rollout_evals": float(sum(x.get("rollout_evals", 0) for x in rows)),
        "run/flops": float(spent),
        # the rollouts of tied groups (by their leaves), which no update learns from: what a rule that foresaw
        # every tie and skipped its rollout for free could save at most (their edges are already not trained)
        "run/tied_rollout_share": (
            sum(f * x["tied_leaf_share"] for f, x in zip(rollout, rows, strict=True)) / max(spent, 1)
            if len(tied) == len(rows)
            else math.nan
        ),
        "run/tied_leaf_share": sum(tied) / len(tied) if len(tied) == len(rows) else math.nan,
        "optimizer_steps_per_iteration": sum(x.get("optimizer_steps", 0) for x in rows) / len(rows),
        "tflops_per_iteration": rows[-1]["flops_total"] / len(rows) / 1e12,
        "reward_group_std": sum(x.get("reward_group_std", 0.0) for x in rows) / len(rows),
        **early,
    }


def rollout_forward_flops(rows: list[dict]) -> float:
    """FLOPs of one rollout evaluation (a forward of the denoiser's batch row), from a run's metrics rows. A row's
    `flops` is rollout_evals x F + train_evals x T (training/steps.py: iteration_flops) with F and T fixed for a run,
    so least squares over the rows gives F exactly; nan where the rows cannot tell F from T."""
    r = [float(x.get("rollout_evals", 0)) for x in rows]
    t = [float(x.get("train_evals", 0)) for x in rows]
    y = [float(x.get("flops", 0)) for x in rows]
    rr, tt, rt = sum(a * a for a in r), sum(b * b for b in t), sum(a * b for a, b in zip(r, t, strict=True))
    ry, ty = sum(a * c for a, c in zip(r, y, strict=True)), sum(b * c for b, c in zip(t, y, strict=True))
    if tt == 0:  # nothing trained: every FLOP a rollout's
        return ry / rr if rr > 0 else math.nan
    det = rr * tt - rt * rt
    if det <= 1e-9 * rr * tt:  # rollout and training evaluations in one proportion throughout
        return math.nan
    return (ry * tt - ty * rt) / det


def sweep_gains(rows: list[dict]) -> dict[str, dict[str, tuple[float, float | None]]]:
    """variant -> rate -> final held-out gain (eval weights, trained weights or None) of the lr plan's runs."""
    gains: dict[str, dict[str, tuple[float, float | None]]] = {}
    for r in rows:
        base, _, lr = r["label"].partition("@lr")
        first, last = r["heldout"][0], r["heldout"][-1]
        raw = last.get("raw/reward_mean")
        raw_gain = None if raw is None else raw - (first.get("raw/reward_mean") or first["reward_mean"])
        gains.setdefault(base, {})[lr or WORLD_LR] = (last["reward_mean"] - first["reward_mean"], raw_gain)
    return gains


def best_rates(rows: list[dict], trained: bool = False) -> dict[str, str]:
    """variant -> the rate whose run ends with the best gain: of the eval weights, or with trained=True of the
    trained weights where the run scored them (the adaptive plans, whose tables read the trained weights)."""

    def gain(g: tuple[float, float | None]) -> float:
        return g[1] if trained and g[1] is not None else g[0]

    return {base: max(g, key=lambda k: gain(g[k])) for base, g in sweep_gains(rows).items()}


def sweep_table(rows: list[dict], trained: bool = False) -> str:
    """The learning-rate sweep per variant: each rate's final held-out gain (eval weights; the trained weights'
    in brackets where they differ) and the best rate, which the tables should use: by the eval weights' gain, or
    with trained=True by the trained weights' (best_rates)."""
    gains, best = sweep_gains(rows), best_rates(rows, trained)
    lrs = sorted({lr for g in gains.values() for lr in g}, key=float)
    head = "| variant | " + " | ".join(f"lr {lr}" for lr in lrs) + " | best |\n|---|" + "---|" * (len(lrs) + 1) + "\n"

    def cell(g: tuple[float, float | None] | None) -> str:
        if g is None:
            return "-"
        return f"{g[0]:+.3f}" + ("" if g[1] is None or abs(g[1] - g[0]) < 5e-4 else f" ({g[1]:+.3f})")

    lines = [
        f"| {base} | " + " | ".join(cell(g.get(lr)) for lr in lrs) + f" | {best[base]} |" for base, g in gains.items()
    ]
    seeds = sorted({r["seed"] for r in rows})
    by = "the trained weights'" if trained else "the eval weights'"
    return (
        f"\nLearning-rate sweep (seed {', '.join(map(str, seeds))}): final held-out gain with the weights eval uses "
        f"(the trained weights' in brackets where they differ); best: the rate with {by} best gain.\n\n"
        + head
        + "\n".join(lines)
        + "\n"
    )


def factor_table(rows: list[dict]) -> str:
    """The ablation's effects: each one-factor variant (label BASE/FACTOR) against its base, paired by seed (the
    same prompts an iteration and the same noises where the factor leaves them): the final held-out gain of each
    (eval weights), the mean and range of the per-seed differences, and on how many seeds the factor helps."""
    gain = {(r["label"], r["seed"]): r["heldout"][-1]["reward_mean"] - r["heldout"][0]["reward_mean"] for r in rows}
    lines = []
    for label in dict.fromkeys(r["label"] for r in rows):
        base, sep, factor = label.partition("/")
        seeds = sorted(s for lab, s in gain if lab == label and (base, s) in gain)
        if not sep or not seeds:
            continue
        d = [gain[label, s] - gain[base, s] for s in seeds]
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        lines.append(
            f"| {base} | {factor} | {len(seeds)} | {mean([gain[base, s] for s in seeds]):+.3f} "
            f"| {mean([gain[label, s] for s in seeds]):+.3f} | {mean(d):+.3f} | {min(d):+.3f} to {max(d):+.3f} "
            f"| {sum(x > 0 for x in d)} of {len(d)} |"
        )
    head = (
        "\nOne factor at a time: final held-out gain (eval weights) against the base's, paired by seed.\n\n"
        "| base | factor | seeds | base gain | variant gain | difference | per-seed differences | seeds better |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(lines) + "\n"


def _pm(stat: dict, fmt: str = "+.3f") -> str:
    if stat["mean"] is None:
        return "-"
    return f"{stat['mean']:{fmt}}" + (f" ± {stat['std']:{fmt.lstrip('+')}}" if stat["n"] > 1 else "")


def fill_bounds(cmp: dict) -> None:
    """compare's lower bound (speedup_above) for a comparison saved before compare gave it: where the baseline's
    mean curve never reaches the target, from the baseline runs' held-out curves."""
    from treegrpo_cli.report.compare import speedup_above

    base = next((g for g in cmp["groups"] if g["label"] == cmp["baseline"]), None)
    if base is None or cmp.get("target") is None or reached_at(base) is not None:
        return
    curves = [[tuple(p) for p in r["heldout_curve"]] for r in cmp["runs"] if r["label"] == cmp["baseline"]]
    for g in cmp["groups"]:
        if g is not base and "speedup_above" not in g:
            g["speedup_above"] = speedup_above(curves, reached_at(g))


def reached_at(g: dict) -> float | None:
    """A group's mean-curve time to the target (older results files name it curve_minutes_to_target)."""
    return g.get("curve_to_target", g.get("curve_minutes_to_target"))


def speedup_cell(g: dict) -> str:
    """A group's speed-up and its interval, or why it has none (compare_page.speedup_cell; 'never': no reach)."""
    from treegrpo_cli.report.compare_page import speedup_cell as cell

    return cell(
        g["speedup"], g.get("speedup_low"), g.get("speedup_high"), reached_at(g), "never", g.get("speedup_above")
    )


def per_label(result: dict, key: str) -> dict[str, list[float]]:
    """label -> run_metrics(run)[key] for each of its runs: from the run's summary, or its metrics rows where the
    summary predates run_metrics."""
    out: dict[str, list[float]] = {}
    for r in result["runs"]:
        metrics = r.get("metrics") or {}
        if key not in metrics:  # kept before run_metrics had the key
            metrics = run_metrics(Path(r["run_dir"]))
        out.setdefault(r["label"], []).append(metrics[key])
    return out


def table(result: dict) -> str:
    """The study's table in markdown: per variant, the held-out gain at the budget and the speed-up to
    baseline's target (dance-grpo's unless --baseline) on both axes, with the default (EMA) and the trained (raw)
    weights."""
    head = (
        "| variant | runs | gain (eval weights) | gain (trained weights) | speed-up, FLOPs | speed-up, FLOPs, raw "
        "| speed-up, wall-clock | speed-up, wall-clock, raw | optimizer steps / iteration | s / iteration "
        "| TFLOPs to target | seeds at target |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    steps = per_label(result, "optimizer_steps_per_iteration")
    lines = []
    for g in result["flops"]["groups"]:
        by = {
            k: next(x for x in result[k]["groups"] if x["label"] == g["label"])
            for k in ("flops-raw", "time", "time-raw")
        }
        st = steps[g["label"]]
        lines.append(
            f"| {g['label']} | {len(g['runs'])} | {_pm(g['gain'])} | {_pm(by['flops-raw']['gain'])} "
            f"| {speedup_cell(g)} "
            f"| {speedup_cell(by['flops-raw'])} | {speedup_cell(by['time'])} | {speedup_cell(by['time-raw'])} "
            f"| {sum(st) / len(st):.1f} | {_pm(g['seconds_per_iteration'], '.1f')} "
            f"| {tflops_cell(g['curve_to_target'])} | {g['reached_target']} of {len(g['runs'])} |"
        )
    targets = ", ".join(
        f"{k}: {result[k]['target']:+.3f}" for k in ("flops", "flops-raw") if result[k]["target"] is not None
    )
    base = result.get("baseline", "dance-grpo")
    whose = f"{base}'s mean final gain" if result.get("target_gain") is None else "given with --target"
    return head + "\n".join(lines) + f"\n\nTargets ({whose}): {targets}.\n"


def cost_table(result: dict, raw: bool = False) -> str:
    """Where the FLOP speed-up comes from: TFLOPs an iteration x iterations to the target (raw: of the trained
    weights). The papers' 4.7x and 2.4x are ratios of seconds per iteration; a time-to-target ratio is that cost
    ratio times the ratio of iterations each method needs, which is the part a cost measurement does not see."""
    per_iter = per_label(result, "tflops_per_iteration")
    cost = {k: sum(v) / len(v) for k, v in per_iter.items()}
    base = result.get("baseline", "dance-grpo")
    suffix = "-raw" if raw else ""
    its = {g["label"]: g for g in result["iterations" + suffix]["groups"]}
    target = result["flops" + suffix]["target"]
    lines = [
        f"\nCost and iterations to the target ({'trained' if raw else 'eval'} weights, gain {target:+.3f}):\n",
        f"| variant | TFLOPs / iteration | cost ratio to {base} | iterations to target | speed-up, iterations "
        "| TFLOPs to target | speed-up, FLOPs |\n|---|---|---|---|---|---|---|",
    ]
    for g in result["flops" + suffix]["groups"]:
        it, c = its[g["label"]], cost[g["label"]]
        n = "never" if it["curve_to_target"] is None else f"{it['curve_to_target']:.0f}"
        lines.append(
            f"| {g['label']} | {c:.3f} | {cost[base] / c:.2f}x | {n} | {speedup_cell(it)} "
            f"| {tflops_cell(g['curve_to_target'])} | {speedup_cell(g)} |"
        )
    return "\n".join(lines) + "\n"


def signal_table(result: dict) -> str:
    """What an iteration gives the update to learn from, over each run's first quarter of iterations (before the
    reward saturates): the share of prompt groups whose rewards all tie (no advantage), the within-group reward
    std, and the edges trained. Wider noise or more SDE steps show here first."""
    stats = {k: per_label(result, f"early/{k}") for k in ("zero_std_ratio", "reward_group_std", "trained_edges")}
    lines = [
        "\nWhat an iteration learns from, first quarter of each run's iterations (mean over seeds):\n",
        "| variant | tied groups | within-group reward std | trained edges / iteration |\n|---|---|---|---|",
    ]
    for label, tied in stats["zero_std_ratio"].items():
        std, edges = stats["reward_group_std"][label], stats["trained_edges"][label]
        lines.append(
            f"| {label} | {sum(tied) / len(tied):.2f} | {sum(std) / len(std):.3f} | {sum(edges) / len(edges):.0f} |"
        )
    return "\n".join(lines) + "\n"


def savings_table(result: dict) -> str:
    """What the adaptive trees did over each whole run (mean over seeds): tied groups and within-group reward std
    over all iterations, early stops and fallbacks an iteration, the share of the run's denoiser FLOPs the stops
    saved against the same trees undisturbed, prompts replaced an iteration, and images scored an iteration per leaf
    trained on (above 1: the reward judged x0-predictions too; those calls are not on the denoiser FLOP axis).
    Tied groups are counted as groups and by their leaves (per-prompt budgets make groups of unequal size). The
    last column bounds what any rule against ties can give: the share of the run's FLOPs spent on tied groups'
    rollouts, and the speed-up an iteration would have if they cost nothing (the same learning per iteration)."""
    keys = ("run/zero_std_ratio", "reward_group_std", "run/early_stops", "run/fallbacks", "run/flops_saved_share")
    more = ("run/replaced", "run/reward_images", "run/leaves", "run/tied_leaf_share", "run/tied_rollout_share")
    stats = {k: per_label(result, k) for k in (*keys, *more)}
    avg = {k: {label: sum(v) / len(v) for label, v in by.items()} for k, by in stats.items()}
    lines = [
        "\nOver whole runs (mean over seeds): ties, spread, and what the adaptive trees did an iteration:\n",
        "| variant | tied groups | leaves in tied groups | within-group reward std | early stops | fallbacks "
        "| FLOPs saved by stops | prompts replaced | images scored per leaf | FLOPs in tied rollouts (if free) |\n"
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, tied in avg["run/zero_std_ratio"].items():
        scored = avg["run/reward_images"][label] / max(avg["run/leaves"][label], 1)
        share, waste = avg["run/tied_leaf_share"][label], avg["run/tied_rollout_share"][label]
        lines.append(
            f"| {label} | {tied:.2f} | {'n/a' if math.isnan(share) else f'{share:.2f}'} "
            f"| {avg['reward_group_std'][label]:.3f} | {avg['run/early_stops'][label]:.1f} "
            f"| {avg['run/fallbacks'][label]:.1f} | {100 * avg['run/flops_saved_share'][label]:.1f}% "
            f"| {avg['run/replaced'][label]:.2f} | {scored:.2f} "
            f"| {'n/a' if math.isnan(waste) else f'{100 * waste:.0f}% ({1 / (1 - waste):.2f}x)'} |"
        )
    return "\n".join(lines) + "\n"


def plan_forward_flops(result: dict, tol: float = 1e-3) -> float:
    """FLOPs of one rollout evaluation, for every run of a plan (one model, one batch row): the median of the
    runs' own fits (run_metrics' rollout_forward_flops). A run whose rollout and training evaluations keep one
    proportion cannot fit it alone; a run that skips tied groups' training can. nan where no run fits, or where the
    fits disagree by more than `tol` (not one model)."""
    fits = sorted(f for fs in per_label(result, "run/rollout_forward_flops").values() for f in fs if f == f)
    if not fits or fits[-1] - fits[0] > tol * abs(fits[0]):
        return math.nan
    return fits[len(fits) // 2]


def flop_split_table(result: dict) -> str:
    """Where each variant's denoiser FLOPs go (mean over seeds): the rollout's forwards and the update's forwards
    and backwards. The rollout share bounds what any saving in sampling can give, trees' shared prefixes
    included: an iteration at most 1 / (1 - rollout share) times cheaper, at the same learning per iteration."""
    forward = plan_forward_flops(result)
    if forward != forward:
        return "\nNo run of the plan fits a rollout forward's FLOPs: no FLOP split.\n"
    evals, spent = per_label(result, "run/rollout_evals"), per_label(result, "run/flops")
    cost = per_label(result, "tflops_per_iteration")
    lines = [
        f"\nWhere the FLOPs go (mean over seeds; a rollout forward: {forward / 1e6:.2f} MFLOPs):\n",
        "| variant | TFLOPs / iteration | rollout share | update share | iteration speed-up if rollouts cost nothing |"
        "\n|---|---|---|---|---|",
    ]
    for label, runs in evals.items():
        share = sum(forward * e / s for e, s in zip(runs, spent[label], strict=True)) / len(runs)
        lines.append(
            f"| {label} | {sum(cost[label]) / len(cost[label]):.3f} | {100 * share:.0f}% | {100 * (1 - share):.0f}% "
            f"| {1 / (1 - share):.2f}x |"
        )
    return "\n".join(lines) + "\n"


def tflops_cell(value: float | None) -> str:
    """The mean curve's denoiser TFLOPs to the target (eval weights), or never."""
    return "never" if value is None else f"{value:.1f}"


def tied_curves(result: dict, points: int = 21, window: int = 5) -> dict[str, tuple[list[float], list[float]]]:
    """label -> (TFLOPs, share of tied groups): each run's zero_std_ratio by iteration, a moving mean over `window`
    iterations, placed at the iteration's end on the FLOP axis (iterations x the run's mean TFLOPs an iteration),
    then the mean over the label's seeds on `points` evenly spaced TFLOPs up to where its shortest run ends."""
    from treegrpo_cli.report.compare_page import mean_band

    per_iteration = {(r["label"], r["seed"]): r["metrics"]["tflops_per_iteration"] for r in result["runs"]}
    curves: dict[str, list[list[tuple[float, float]]]] = {}
    for run in result["flops-raw"]["runs"]:
        ys = [y for _, y in run["zero_std_curve"]]
        if not ys:
            continue
        tpi = per_iteration[(run["label"], run["seed"])]
        smooth = [sum(w) / len(w) for w in (ys[max(0, i - window + 1) : i + 1] for i in range(len(ys)))]
        curve = [(tpi * (it + 1), y) for (it, _), y in zip(run["zero_std_curve"], smooth, strict=True)]
        curves.setdefault(run["label"], []).append(curve)
    out = {}
    for label, cs in curves.items():
        end = min(c[-1][0] for c in cs)
        grid = [end * i / (points - 1) for i in range(points)]
        out[label] = (grid, mean_band(cs, grid)[1])
    return out
