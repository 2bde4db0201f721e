"""docs/results.md, its plots and README's results block, generated from bench/results/ (never typed by hand).

    python bench/results_page.py            # write docs/results.md, docs/results/*.png and README's block
    python bench/results_page.py --check    # exit 1 when docs/results.md or README's block differs from the files

Every table is drawn from a results file that a bench script wrote (the study's tables by bench/study.py's own
functions, from the summaries in study-*.json.gz); every plot is compare's held-out plot redrawn from the numbers
those files keep. tests/bench/test_results_page.py fails when the committed page is not what this script writes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "results.md"
PLOTS = ROOT / "docs" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
README_PLOT = "best-lr-flops-raw.png"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import study  # noqa: E402  (bench/ is not a package)
import study_tables as tables  # noqa: E402

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


class Sources:
    """Reads the results files and remembers which were read (the test holds every file to a reader)."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def json(self, name: str) -> dict:
        self.read.add(name)
        data = (RESULTS / name).read_bytes()
        return json.loads(gzip.decompress(data) if name.endswith(".gz") else data)

    def text(self, name: str) -> str:
        self.read.add(name)
        return (RESULTS / name).read_text()

    def names(self, pattern: str) -> list[str]:
        return sorted(p.name for p in RESULTS.glob(pattern))


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else f"{v:{spec}}"


def pm(stat: dict, spec: str) -> str:
    return tables._pm(stat, spec)


# --- plots ---------------------------------------------------------------------------------------


def comparison(d: dict) -> SimpleNamespace:
    """What compare_page.reward_plot reads of a Comparison, from the dict a results file keeps of it."""
    runs = [SimpleNamespace(label=r["label"], heldout_curve=[tuple(p) for p in r["heldout_curve"]]) for r in d["runs"]]
    groups = [SimpleNamespace(label=g["label"]) for g in d["groups"]]
    return SimpleNamespace(measure=d["measure"], groups=groups, runs=runs, target=d["target"], axis=d["axis"])


def plot(images: dict, name: str, cmp: dict, alt: str) -> str:
    from treegrpo_cli.report.compare import Comparison
    from treegrpo_cli.report.compare_page import reward_plot

    images[name] = reward_plot(cast(Comparison, comparison(cmp)))  # a namespace of what it reads
    return f"![{alt}](results/{name})\n"


# --- the sections --------------------------------------------------------------------------------


def world_rl_table(src: Sources, names: list[str]) -> str:
    """`treegrpo train` runs, each evaluated at two seeds against the base model on the same prompts and noises."""
    head = (
        "| run | commit | minutes | run's own held-out | training reward, first -> last tenth "
        "| eval seed 5: base -> trained (gain) | eval seed 6 |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name in names:
        r = src.json(name)
        for run in r["runs"]:
            sm = run["summary"]
            evals = {e["seed"]: e for e in run["evals"]}
            cells = [
                f"{evals[s]['baseline']:.3f} -> {evals[s]['trained']:.3f} ({evals[s]['gain']:+.3f})"
                if s in evals
                else "-"
                for s in (5, 6)
            ]
            lines.append(
                f"| `{command(run['command'])}` | {r['commit']} | {run['wall_minutes']:.1f} "
                f"| {sm['heldout_before']:.3f} -> {sm['heldout_after']:.3f} "
                f"| {sm['reward_first_tenth']:.3f} -> {sm['reward_last_tenth']:.3f} | {cells[0]} | {cells[1]} |"
            )
    return head + "\n".join(lines) + "\n"


def command(cmd: str) -> str:
    """A run's command without its scratch folder and output flags."""
    words, out, skip = cmd.split(), [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("--run-dir", "--out"):
            skip = True
        elif w != "--json" and not w.startswith("("):
            out.append(w)
    return " ".join(out)


def control_table(r: dict) -> str:
    """bench/shapes_rl_vs_pretrain.py: the RL run against the same minutes of continued pretraining."""
    return (
        f"| policy | held-out reward (n = {r['base']['n']}) | gain |\n|---|---|---|\n"
        f"| shipped weights | {r['base']['mean']:.4f} (SEM {r['base']['sem']:.3f}) | |\n"
        f"| `{command(r['rl_command'])}` ({r['rl_minutes']:.1f} min) | {r['rl']['mean']:.4f} "
        f"(SEM {r['rl']['sem']:.3f}) | {r['rl_gain']:+.3f} |\n"
        f"| the same minutes of continued pretraining ({r['control_minutes']:.1f} min, lr {r['control_lr']:g}) "
        f"| {r['control']['mean']:.4f} (SEM {r['control']['sem']:.3f}) | {r['control_gain']:+.3f} |\n"
    )


def default_job(src: Sources, images: dict) -> str:
    names = [n for n in src.names("world_rl-*.json") if "video" not in n and "nft" not in n]
    image = sorted(names, key=lambda n: ("default" not in n, n))  # the main job first
    return (
        "## The main job and single runs\n\n"
        "`python bench/world_rl.py`: `treegrpo train` as given, then `treegrpo eval --checkpoint RUN --baseline "
        "tiny-shapes --prompts shapes-test --metric shapes --num-images 8 --seed 5|6` (448 paired held-out images a "
        "seed); the run's own held-out curve is 56 prompts x 4 samples. Commit: the code each run was made with.\n\n"
        + world_rl_table(src, image)
        + "\nThe equal-compute control (`python bench/shapes_rl_vs_pretrain.py --rl-run RUN`: the RL run's weights "
        "against as many minutes of continued pretraining, 56 held-out prompts x 8 samples at seed 777):\n\n"
        + control_table(src.json("shapes_rl_vs_pretrain.json"))
    )


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
        minutes = g.get("curve_to_target", g.get("curve_minutes_to_target"))
        raw_cells = f"| {pm(r['gain'], '+.3f')} | {speedup(r)} " if r else ""
        rows.append(
            f"| `{g['label']}` | {pm(g['forward_nfe_per_sample'], '.2f')} ({old}) "
            f"| {pm(g['backward_nfe_per_sample'], '.2f')} ({new}) | {pm(g['seconds_per_iteration'], '.2f')} ({sec}) "
            f"| {pm(g['iterations'], '.0f')} | {pm(g['gain'], '+.3f')} "
            f"| {fmt(minutes, '.2f')} ({g['reached_target']}/{len(g['runs'])}) | {speedup(g)} "
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


def speedup(g: dict) -> str:
    from treegrpo_cli.report.compare_page import speedup_text

    if g["speedup"] is None and g.get("curve_to_target", g.get("curve_minutes_to_target")) is not None:
        return "-"
    return speedup_text(g["speedup"], g.get("speedup_low"), g.get("speedup_high"), none="never")


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
                f"\nThe {world} world's learning-rate sweep (`{r['command']}`):\n" + tables.sweep_table(r["runs"])
            )
        if main in have:
            r = src.json(main)
            parts.append(
                f"\nThe {world} world, {r['tflops_per_run']:g} denoiser TFLOPs a run, timed to "
                f"{r['target_gain']:+.2f} against `{r['baseline']}` (`{r['command']}`):\n\n"
                + study_tables(r)
                + tables.savings_table(r)
                + "\n"
                + plot(images, f"{plan}-flops-raw.png", r["flops-raw"], f"held-out gain against TFLOPs, {world} world")
            )
    if len(parts) == 1:
        parts.append(
            "\nNo runs yet: the plans and their commands are in [benchmarks.md](benchmarks.md#the-plans) "
            "(`--plan adaptive-lr`, `adaptive`, `adaptive-video-lr`, `adaptive-video`).\n"
        )
    return "".join(parts)


def variants_table(r: dict) -> str:
    """bench/gpu_check.py --variants: each speed candidate's steady-state iteration and its speed-up over base."""
    rows = [
        f"| {v['variant']} | {v['status']} | {fmt(v.get('rollout_s'), '.1f')} | {fmt(v.get('train_s'), '.1f')} "
        f"| {fmt(v.get('rollout_speedup'), '.2f')} | {fmt(v.get('train_speedup'), '.2f')} "
        f"| {fmt(v.get('rollout_mfu'), '.0%')} / {fmt(v.get('train_mfu'), '.0%')} |"
        for v in r["variants"]
    ]
    return (
        f"\n`{r['command']}` on {r['device']} at {r['commit'][:7]}:\n\n| variant | status | rollout s | train s "
        "| rollout speed-up | train speed-up | MFU rollout / train |\n|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )


def flux_case(case: dict) -> str:
    if "error" in case:
        return f"| `{case['preset']}` | {case['mode']} | {case['error'].split('.')[0][:80]} |" + " |" * 8
    it = case["iterations"][-1]
    return (
        f"| `{case['preset']}` | {case['mode']} | {it['leaves']} | {it['rollout_evals']} | {it['trained_edges']} "
        f"| {it['rollout_s']:.1f} | {it['train_s']:.1f} | {it['total_s']:.1f} | {it['total_s'] / it['leaves']:.2f} "
        f"| {max(it['rollout_peak_gib'], it['train_peak_gib']):.1f} "
        f"| {fmt(it.get('rollout_mfu'), '.0%')} / {fmt(it.get('train_mfu'), '.0%')} |"
    )


def gpu(src: Sources, images: dict) -> str:
    parts = [
        "## On a GPU\n\n`python bench/flux_iteration.py`: a release-sized denoiser with random bf16 weights, one "
        "prompt an iteration, the last (steady-state) iteration of each case.\n"
    ]
    head = (
        "| preset | mode | leaves | rollout evals | trained edges | rollout s | train s | s / iteration | s / leaf "
        "| peak GiB | MFU rollout / train |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for name in src.names("flux_iteration*.json"):
        r = src.json(name)
        parts.append(
            f"\n`{name}`: {r.get('model', 'flux-dev')} at {r['resolution']} px on {r['device']}, torch {r['torch']}, "
            f"max batch {r['max_batch']}\n\n" + head + "\n".join(flux_case(c) for c in r["results"]) + "\n"
        )
    for name in src.names("gpu_variants-*.json"):
        parts.append(variants_table(src.json(name)))
    parts.append("\n`python bench/paper_costs.py`:\n\n" + src.text("paper_costs.md"))
    return "".join(parts)


def world(src: Sources, images: dict) -> str:
    """bench/world_base.py on the shipped weights (and on their bit-for-bit rerun), bench/grad_coherence.py."""
    lines = []
    for name in ("world_base-d6.json", "world_base-rerun-d6.json"):
        r = src.json(name)
        for key, what in (("own", "own captions"), ("clean", "own captions, clean colours"), ("test", "test prompts")):
            s = r[key]
            cf, rp = s["colour_following"], s["relation_parts"]
            lines.append(
                f"| `{name}` | {what} | {s['all']['mean']:.3f} | {s['single']['mean']:.3f} | {s['count']['mean']:.3f} "
                f"| {s['relation']['mean']:.3f} | {fmt(cf['noisy'], '.2f')}, {fmt(cf['clean'], '.2f')} "
                f"| {fmt(rp['both_drawn'], '.2f')}, {fmt(rp['placed_given_both'], '.2f')} |"
            )
    g = src.json("grad_coherence-tree-grpo-shapes.json")
    coh = "\n".join(
        f"| {b['depths'][0]}-{b['depths'][1]} | {b['mean_pairwise_cos']:+.3f} | {b['halves_cos']:+.3f} |"
        for b in g["buckets"]
    )
    base = src.json("world_base-d6.json")
    return (
        "## The embedded world\n\n`python bench/world_base.py` (ODE samples, 4 a prompt, seed "
        f"{base['seed']}, strict `shapes` reward; order sensitivity {base['order_sensitivity']:.2f}):\n\n"
        "| file | prompts | all | single | count | relation | asked colour drawn: orange/purple, others "
        "| relations: both drawn, placed |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n"
        f"\n`python bench/grad_coherence.py --preset {g['preset']}` ({g['batches']} batches): cosine between the "
        "GRPO gradients of independent batches, by window step\n\n"
        "| steps | mean pairwise cosine | cosine of halves |\n|---|---|---|\n" + coh + "\n"
    )


def engine(src: Sources, images: dict) -> str:
    ro = src.json("rollout.json")
    cases = "\n".join(
        f"| `{k}` | {c['evals_per_prompt']} | {c['max_batch']} | {c['median_s']:.3f} | {c['s_per_leaf'] * 1e3:.2f} |"
        for k, c in ro["cases"].items()
    )
    sc = src.json("scoring.json")
    scoring = "\n".join(f"| {k} | {v * 1e3:.2f} |" for k, v in sc["seconds"].items())
    st = src.json("startup.json")
    startup = "\n".join(f"| `{k}` | {v:.3f} |" for k, v in st["median_seconds"].items())
    ov = src.json("remote_overlap.json")
    overlap = "\n".join(
        f"| {reward} | {mode} ({c['chunks']} chunks) | {c['rollout_s']:.2f} | {c['score_s']:.2f} "
        f"| {c['score_hidden_s']:.2f} | {c['total_s']:.2f} |"
        for reward in ("shapes", "shapes+10ms-per-image")
        for mode, c in ((m, ov[reward][m]) for m in ("plain", "overlapped"))
    )
    sn = src.json("split_noise_effect.json")
    split = "\n".join(
        f"| {k} | {d['mean']:+.4f} | {d['se']:.4f} | {d['t']:+.2f} |" for k, d in sn["differences"].items()
    )
    return (
        f"## The engine\n\n`python bench/rollout.py` (`pixel` model, {ro['cpu']['processor']}, "
        f"{ro['threads']} threads):\n\n| case | evals / prompt | max batch | median s | ms / leaf |\n"
        f"|---|---|---|---|---|\n{cases}\n\n`python bench/scoring.py`:\n\n| what | ms |\n|---|---|\n{scoring}\n"
        f"\n`python bench/startup.py` (median of {st['repeat']}):\n\n| command | s |\n|---|---|\n{startup}\n"
        f"\n`python bench/remote_overlap.py` (a `tree-grpo` iteration, seconds; {ov['machine']['cpu']}):\n\n"
        "| reward | scoring | rollout | scoring not hidden | scoring hidden | iteration |\n"
        f"|---|---|---|---|---|---|\n{overlap}\n"
        f"\n`python bench/split_noise_effect.py` ({sn['prompts']} prompts, {sn['leaves_per_prompt']} leaves each): "
        "leaf statistics of split-noise rules against flat groups\n\n"
        f"| rule / statistic | mean difference | standard error | t |\n|---|---|---|---|\n{split}\n"
    )


def reruns(src: Sources, images: dict) -> str:
    rows = []
    for name in ("study-core-rerun.json", "study-core-rerun-rerun.json"):
        r = src.json(name)
        rows.append(f"| `{name}` | {r['label']} | {r['seed']} | {r['rows']} | {'yes' if r['equal_rows'] else 'no'} |")
    return (
        "## Reruns\n\n`python bench/study.py --rerun LABEL --seeds S`: a kept run again in a fresh folder, its metrics "
        "rows against the first run's (timings aside).\n\n| file | variant | seed | rows | rows equal |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


SECTIONS = (default_job, flop_study, ablation, nft, long_runs, wall_clock, video, adaptive, gpu, world, engine, reruns)


def page() -> tuple[str, dict, set[str]]:
    """docs/results.md's text, its plots by file name, and the results files it read."""
    src = Sources()
    images: dict[str, Any] = {}  # file name -> plot
    body = []
    for section in SECTIONS:
        body.append(section(src, images))
    toc = "\n".join(f"- [{b.splitlines()[0][3:]}](#{anchor(b.splitlines()[0][3:])})" for b in body)
    head = (
        "# Results\n\nGenerated by `python bench/results_page.py` from the files in `bench/results/`: do not edit "
        "by hand. What each benchmark does and what its numbers say: [benchmarks.md](benchmarks.md). Mean ± std "
        "over seeds; a speed-up's brackets are its 95% interval with the seeds drawn again (never: draws that do "
        "not reach the target).\n\n" + toc + "\n"
    )
    return head + "".join("\n" + b for b in body), images, src.read


def anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c == "-")


def readme_block() -> str:
    """README's results table and plot: each method at its best rate on the FLOP budget."""
    r = Sources().json("study-best-lr.json.gz")
    raw = {g["label"]: g for g in r["flops-raw"]["groups"]}
    rows = "\n".join(
        f"| `{g['label']}` | {len(g['runs'])} | {pm(g['gain'], '+.3f')} | {pm(raw[g['label']]['gain'], '+.3f')} "
        f"| {tables._speedup(g)} | {tables._speedup(raw[g['label']])} |"
        for g in r["flops"]["groups"]
    )
    seeds = sorted({s for g in r["flops"]["groups"] for s in g["seeds"]})
    return (
        f"\nThe embedded world, each method at its best learning rate for {r['tflops_per_run']:g} denoiser TFLOPs, "
        f"seeds {seeds[0]}-{seeds[-1]} (`{r['command']}`): held-out gain of the weights `eval` uses and of the trained "
        "ones, and how much sooner than DanceGRPO each reaches DanceGRPO's final gain on the FLOP axis (95% interval "
        f"in brackets; never: does not get there and stay). `{study.BEST_BRANCH}` is the `branch-mix-flow` preset; "
        "a label's `@lr` names its learning rate and `/...` what it changes from its preset "
        "([docs/benchmarks.md](docs/benchmarks.md#the-plans)).\n\n"
        "| variant | seeds | held-out gain | gain, trained weights | speed-up, FLOPs | speed-up, trained weights |\n"
        "|---|---|---|---|---|---|\n" + rows + "\n\n"
        f"![held-out gain of the trained weights against denoiser TFLOPs](docs/results/{README_PLOT})\n"
    )


def splice(text: str, block: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} markers")
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + block + text[stop:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page or README's block is not current")
    args = ap.parse_args()
    text, images, _ = page()
    readme = README.read_text()
    new_readme = splice(readme, readme_block())
    if args.check:
        current = PAGE.exists() and PAGE.read_text() == text and new_readme == readme
        sys.exit(0 if current and all((PLOTS / n).exists() for n in images) else 1)
    from treegrpo_cli.plots import save_png

    PLOTS.mkdir(parents=True, exist_ok=True)
    for name, image in images.items():
        save_png(image, PLOTS / name)
    PAGE.write_text(text)
    README.write_text(new_readme)


if __name__ == "__main__":
    main()
