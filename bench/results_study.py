"""The results page's sections of the FLOP-budget study (bench/study.py): each method at its best rate, the
ablation, NFT, long runs, wall-clock, the video world and the adaptive trees."""

from __future__ import annotations

import study_tables as tables
from results_common import Sources, control_table, fmt, plot, pm, world_rl_table

README_PLOT = "best-lr-flops-raw.png"

# method: (NFE pi_old, NFE pi_theta, s / iteration), the papers' own figures for FLUX at 20 (BranchGRPO's table) or
# 25 (MixGRPO's) steps and SD3.5-M at 10 steps (TreeGRPO; DiffusionNFT's and Flow-GRPO's configs), methods.md
PAPERS = {
    "dance-grpo": ("20", "20", "698"),
    "flow-grpo": ("10", "9", "-"),
    "mix-grpo": ("20", "5", "289"),
    "branch": ("13.68", "13.68", "493"),
    "branch-widpru": ("13.68", "8.625", "314"),
    "branch-deppru": ("13.68", "8.625", "314"),
    "branch-mix": ("13.68", "4.25", "148"),
    "branch-mix-flow": ("-", "-", "-"),
    "tree-grpo": ("7.5", "0.48", "72.0"),
    "treepo": ("-", "-", "-"),
    "nft": ("10", "9", "-"),
    "tree-nft": ("-", "-", "-"),
}


def study_tables(r: dict, rows: bool = True) -> str:
    """bench/study.py's own tables of one plan's results file."""
    md = tables.table(r) if rows else ""
    if "iterations" in r:
        md += tables.cost_table(r) + tables.cost_table(r, raw=True)
    return md


def flop_study(src: Sources, images: dict) -> str:
    best = src.json("study-best-lr.json.gz")
    core, lr = src.json("study-core.json.gz"), src.json("study-lr.json.gz")
    return (
        "## Methods on a FLOP budget\n\n### Each method at its best learning rate\n\n"
        f"`{best['command']}`; {best['tflops_per_run']:g} denoiser TFLOPs a run.\n\n"
        + study_tables(best)
        + "\n"
        + plot(images, "best-lr-flops.png", best["flops"], "held-out gain against denoiser TFLOPs, eval weights")
        + "\n"
        + plot(images, README_PLOT, best["flops-raw"], "held-out gain against denoiser TFLOPs, trained weights")
        + "\n### The learning-rate sweep\n\n"
        + f"`{lr['command']}`\n"
        + tables.sweep_table(lr["runs"])
        + "\n### Every method at the world's rate\n\n"
        + f"`{core['command']}`\n\n"
        + study_tables(core)
        + "\nThe same runs timed to a held-out gain of +0.25 (`--target 0.25`):\n"
        + study_tables(src.json("study-core-target0.25.json.gz"), rows=False)
    )


def ablation(src: Sources, images: dict) -> str:
    r = src.json("study-ablation.json.gz")
    target = src.json("study-ablation-target0.25.json.gz")
    return (
        "## The ablation\n\n"
        f"`{r['command']}`; one factor at a time from `branch` and `branch-mix` (`FACTORS` in `bench/study.py`).\n\n"
        + study_tables(r)
        + tables.factor_table(r["runs"])
        + tables.signal_table(r)
        + "\nThe same runs timed to a held-out gain of +0.25 (`--target 0.25`):\n\n"
        + study_tables(target)
        + "\nThe noise each setting puts on `branch-mix`'s SDE steps (`python bench/noise_scales.py`):\n\n"
        + src.text("noise_scales.md")
    )


def nft(src: Sources, images: dict) -> str:
    vs = src.json("study-nft-vs-flow-grpo.json.gz")
    dance = src.json("study-nft.json.gz")
    names = [n for n in src.names("world_rl-*nft-seed*.json")]
    return (
        "## DiffusionNFT and tree-NFT\n\n"
        f"`{vs['command']}`, timed to Flow-GRPO's final gain:\n\n"
        + study_tables(vs)
        + "\n"
        + plot(images, "nft-flops.png", vs["flops"], "held-out gain against denoiser TFLOPs, eval weights")
        + f"\nTimed to DanceGRPO's final gain (`{dance['command']}`):\n\n"
        + study_tables(dance)
        + "\nEach run evaluated as the main job is (`python bench/world_rl.py --run RUN`):\n\n"
        + world_rl_table(src, names)
    )


def long_runs(src: Sources, images: dict) -> str:
    """The DanceGRPO runs resumed past the plans' budgets: their held-out curves."""
    r = src.json("study-long.json.gz")
    parts = [f"## Past the budget\n\n{r['description']}.\n"]
    for run in r["runs"]:
        cmds = run.get("commands") or [run["command"]]
        rows = "\n".join(
            f"| {e['flops_total'] / 1e12:.1f} | {e['iteration']} | {e['reward_mean']:.3f} "
            f"| {fmt(e['raw/reward_mean'], '.3f')} |"
            for e in run["heldout"]
        )
        parts.append(
            f"\n`{run['work']}`:\n\n" + "".join(f"    {c}\n" for c in cmds) + "\n"
            "| denoiser TFLOPs | iteration | held-out (eval weights) | held-out (trained weights) |\n"
            "|---|---|---|---|\n" + rows + "\n"
        )
    return "".join(parts)


def methods_table(result: dict) -> str:
    """bench/methods.py: one row a method, the papers' figures in brackets."""
    cmp = result["compare"]
    raw = {g["label"]: g for g in result.get("compare_raw", {}).get("groups", [])}
    head = (
        "| method | forward NFE / sample (paper) | backward NFE / sample (paper) | s / iteration (paper, GPU) "
        "| iterations | held-out gain | minutes to target (seeds reaching it) | speed-up vs dance-grpo "
        + ("| held-out gain, trained weights | speed-up, trained weights " if raw else "")
        + "| peak MiB |\n|---|---|---|---|---|---|---|---|"
        + ("---|---|" if raw else "")
        + "---|\n"
    )
    rows = []
    for g in cmp["groups"]:
        old, new, sec = PAPERS.get(g["label"], ("-", "-", "-"))
        r = raw.get(g["label"])
        minutes = tables.reached_at(g)
        raw_cells = f"| {pm(r['gain'], '+.3f')} | {tables.speedup_cell(r)} " if r else ""
        rows.append(
            f"| `{g['label']}` | {pm(g['forward_nfe_per_sample'], '.2f')} ({old}) "
            f"| {pm(g['backward_nfe_per_sample'], '.2f')} ({new}) | {pm(g['seconds_per_iteration'], '.2f')} ({sec}) "
            f"| {pm(g['iterations'], '.0f')} | {pm(g['gain'], '+.3f')} "
            f"| {fmt(minutes, '.2f')} ({g['reached_target']}/{len(g['runs'])}) | {tables.speedup_cell(g)} "
            + raw_cells
            + f"| {pm(g['peak_mib'], '.0f')} |"
        )
    m = result["machine"]
    target = f"{cmp['target']:+.3f}" + (f" (trained weights {result['compare_raw']['target']:+.3f})" if raw else "")
    foot = (
        f"\n{len(result['runs'])} runs of {result['minutes_per_run']:g} minutes, seeds "
        f"{', '.join(map(str, result['seeds']))}, one thread a run on {m['cpu'] or m['machine']} ({m['cores']} cores), "
        f"torch {m['torch']}, commit {result['commit']}; target: dance-grpo's mean held-out gain {target}.\n"
    )
    return head + "\n".join(rows) + "\n" + foot


def wall_clock(src: Sources, images: dict) -> str:
    r = src.json("methods.json")
    return (
        "## Every method for the same wall-clock minutes\n\n"
        f"`{r['command']}`\n\n"
        + methods_table(r)
        + "\n"
        + plot(images, "methods-time-raw.png", r["compare_raw"], "held-out gain against minutes, trained weights")
    )


def video(src: Sources, images: dict) -> str:
    r = src.json("study-video.json.gz")
    std: dict[str, list[float]] = tables.per_label(r, "reward_group_std")
    spread = "\n".join(f"| {k} | {min(v):.3f}-{max(v):.3f} |" for k, v in std.items())
    return (
        "## The moving-shapes video world\n\n"
        + world_rl_table(src, ["world_rl-video-default.json"])
        + "\nThe equal-compute control (`python bench/shapes_rl_vs_pretrain.py --model tiny-shapes-video`):\n\n"
        + control_table(src.json("video_rl_vs_pretrain.json"))
        + f"\nThe methods at {r['tflops_per_run']:g} denoiser TFLOPs (`{r['command']}`):\n\n"
        + study_tables(r)
        + "\n"
        + plot(images, "video-flops.png", r["flops"], "held-out gain against denoiser TFLOPs, video world")
        + "\nTimed to a held-out gain of +0.1 (`--target 0.1`):\n\n"
        + study_tables(src.json("study-video-target0.1.json.gz"))
        + "\nWithin-group reward std, mean over each run's iterations (range over seeds):\n\n"
        "| variant | within-group reward std |\n|---|---|\n" + spread + "\n"
    )


def adaptive(src: Sources, images: dict) -> str:
    """The adaptive plans (bench/study.py --plan adaptive[-video][-lr]), those whose results files exist."""
    parts, have = ["## Adaptive trees\n"], set(src.names("study-adaptive*.json.gz"))
    for world, plan in (("image", "adaptive"), ("video", "adaptive-video")):
        sweep, main = f"study-{plan}-lr.json.gz", f"study-{plan}.json.gz"
        if sweep in have:
            r = src.json(sweep)
            parts.append(
                f"\nThe {world} world's learning-rate sweep (`{r['command']}`):\n"
                + tables.sweep_table(r["runs"], trained=True)
            )
        if main in have:
            r = src.json(main)
            parts.append(
                f"\nThe {world} world, {r['tflops_per_run']:g} denoiser TFLOPs a run, timed to "
                f"{r['target_gain']:+.2f} against `{r['baseline']}` (`{r['command']}`):\n\n"
                + study_tables(r)
                + tables.savings_table(r)
                + "\n"
                + gain_plots(images, plan, r, world)
                + tied_plots(images, plan, r, world)
            )
        parts += [against(src.json(n)) for n in sorted(have) if n.startswith(f"study-{plan}-vs-")]
    ties = sorted(src.names("tie_prediction*.md"), key=lambda n: (n != "tie_prediction.md", n))  # the study's first
    if ties:
        parts.append(
            "\nCan a split foresee a tie? Each heuristic of the dynamic rollout read at every split of the fixed trees "
            "against what their leaves then scored (`bench/tie_prediction.py`):\n\n"
            + "\n".join(src.text(n) for n in ties)
        )
    if len(parts) == 1:
        parts.append(
            "\nNo runs yet: the plans and their commands are in [benchmarks.md](benchmarks.md#the-plans) "
            "(`--plan adaptive-lr`, `adaptive`, `adaptive-video-lr`, `adaptive-video`).\n"
        )
    return "".join(parts)


def methods_2026(src: Sources, images: dict) -> str:
    """The methods users pick in 2026 (bench/study.py --plan methods-2026[-lr]), those whose results files exist."""
    parts, have = ["## The 2026 methods\n"], set(src.names("study-methods-2026*.json.gz"))
    if "study-methods-2026-lr.json.gz" in have:
        r = src.json("study-methods-2026-lr.json.gz")
        parts.append(
            f"\nAWM, DGPO and GRPO-Guard, flat and on trees: the learning-rate sweep (`{r['command']}`, "
            f"{r['tflops_per_run']:g} denoiser TFLOPs a run):\n" + tables.sweep_table(r["runs"], trained=True)
        )
    if "study-methods-2026.json.gz" in have:
        r = src.json("study-methods-2026.json.gz")
        parts.append(
            f"\nEach at its swept rate, {r['tflops_per_run']:g} denoiser TFLOPs a run, timed to "
            f"{r['target_gain']:+.2f} against `{r['baseline']}` (`{r['command']}`):\n\n"
            + study_tables(r)
            + tables.signal_table(r)
            + tables.flop_split_table(r)
            + "\n"
            + plot(
                images, "methods-2026-flops-raw.png", r["flops-raw"], "held-out gain (trained weights) against TFLOPs"
            )
        )
    parts += [against(src.json(n)) for n in sorted(have) if n.startswith("study-methods-2026-vs-")]
    if len(parts) == 1:
        parts.append("\nNo runs yet: `--plan methods-2026-lr`, then `--plan methods-2026` (bench/study.py).\n")
    return "".join(parts)


def against(r: dict) -> str:
    """A plan's runs timed against another of its labels (--baseline): the speed-up table only, the rest is the
    plan's own."""
    return f"\nThe same runs timed against `{r['baseline']}` (`{r['command']}`):\n\n" + tables.table(r)


def chart_groups(labels: list[str], baseline: str) -> tuple[tuple[str, str, list[str]], ...]:
    """The two charts of an adaptive plan: the per-prompt budgets beside the runs they add to (the baseline, each
    budget variant's root, and those at a variant's rate: the controls), and the rules inside the tree with every
    run that is not a budget."""
    budgets = [x for x in labels if "budget" in x]
    roots = {baseline, *(x.split("/")[0] for x in budgets)}
    roots |= {x for x in labels if x.split("@lr")[0] in roots}
    first = sorted(labels, key=lambda x: x != baseline)  # the baseline first, so it keeps its colour
    return (
        ("budgets", "per-prompt budgets", [x for x in first if x in roots or x in budgets]),
        ("rules", "rules inside the tree", [x for x in first if x not in budgets]),
    )


def gain_plots(images: dict, plan: str, r: dict, world: str) -> str:
    """Held-out gain against TFLOPs (trained weights), in chart_groups' two charts."""
    md = ""
    for key, what, shown in chart_groups([g["label"] for g in r["flops-raw"]["groups"]], r["baseline"]):
        alt = f"held-out gain (trained weights) against TFLOPs: {what}, {world} world"
        md += plot(images, f"{plan}-flops-raw-{key}.png", r["flops-raw"], alt, shown)
    return md


def tied_plots(images: dict, plan: str, r: dict, world: str) -> str:
    """Tied groups over training, each variant's mean over seeds, in chart_groups' two charts."""
    from treegrpo_cli.plots import line_chart

    curves = tables.tied_curves(r)
    md = "\nTied groups (zero_std_ratio) over training, mean over seeds of a 5-iteration moving mean:\n\n"
    for key, what, shown in chart_groups(list(curves), r["baseline"]):
        name = f"{plan}-tied-{key}.png"
        title = f"tied groups over training: {what}, {world} world"
        series = {label: curves[label] for label in shown}
        images[name] = line_chart(series, title, "denoiser TFLOPs", "zero_std_ratio", (760, 460), y_span=(0.0, 1.0))
        md += f"![{title}](results/{name})\n"
    return md
