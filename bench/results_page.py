"""docs/results.md, its plots and README's results block, generated from bench/results/ (never typed by hand).

    python bench/results_page.py            # write docs/results.md, docs/results/*.png and README's block
    python bench/results_page.py --check    # exit 1 when docs/results.md or README's block differs from the files

Every table is drawn from a results file that a bench script wrote (the study's tables by bench/study.py's own
functions, from the summaries in study-*.json.gz); every plot is compare's held-out plot redrawn from the numbers
those files keep. tests/bench/test_results_page.py fails when the committed page is not what this script writes.
The study's sections are in results_study.py, what the sections share in results_common.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"
PLOTS = ROOT / "docs" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import study  # noqa: E402  (bench/ is not a package)
import study_tables as tables  # noqa: E402
from results_common import Sources, control_table, fmt, pm, world_rl_table  # noqa: E402
from results_study import (  # noqa: E402
    README_PLOT,
    ablation,
    adaptive,
    flop_study,
    long_runs,
    methods_2026,
    nft,
    video,
    wall_clock,
)

# --- the sections --------------------------------------------------------------------------------


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


def hacking(src: Sources, images: dict) -> str:
    """The reward-hacking demonstration and what the guard's monitors cost."""
    import monitor_cost
    import reward_hacking

    return (
        "## Reward hacking and the guard\n\n`python bench/reward_hacking.py`: the world's model trained on "
        "`jpeg-compressibility` with `shapes` as the gold reward (`--monitor shapes`) and the default guard, a "
        "held-out evaluation every few iterations; `stop` ends at the first fired rule; the healthy runs must fire "
        "none "
        "([rewards.md](rewards.md#reward-hacking)).\n\n"
        + reward_hacking.markdown(src.json("reward_hacking.json"))
        + "\n`python bench/monitor_cost.py`: what the monitors cost, in CPU seconds.\n\n"
        + monitor_cost.table(src.json("monitor_cost.json"))
    )


SECTIONS = (
    default_job, flop_study, ablation, nft, long_runs, wall_clock, video, adaptive, methods_2026, gpu, world, engine,
    hacking, reruns,
)  # fmt: skip


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
        'not reach the target); "> 1.32x" is a lower bound, where the baseline does not reach the target within its '
        "runs.\n\n" + toc + "\n"
    )
    return head + "".join("\n" + b for b in body), images, src.read


def anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c == "-")


def readme_block() -> str:
    """README's results table and plot: each method at its best rate on the FLOP budget."""
    src = Sources()
    r = src.json("study-best-lr.json.gz")
    raw = {g["label"]: g for g in r["flops-raw"]["groups"]}
    rows = "\n".join(
        f"| `{g['label']}` | {len(g['runs'])} | {pm(g['gain'], '+.3f')} | {pm(raw[g['label']]['gain'], '+.3f')} "
        f"| {tables.speedup_cell(g)} | {tables.speedup_cell(raw[g['label']])} |"
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
        + methods_2026_block(src)
    )


def is_tree(preset: str, sets: list[str]) -> bool:
    """A recipe samples trees when its resolved config splits somewhere (shared prefixes), flat otherwise."""
    from treegrpo_cli.config.layers import load_config

    return bool(load_config(preset=preset, sets=sets).tree.split_steps)


def methods_2026_block(src: Sources) -> str:
    """README's lines on the 2026 methods' study, where its results file exists: every recipe's TFLOPs to the
    target (trained weights), fastest first, and which method and which tree recipe get there first."""
    if "study-methods-2026.json.gz" not in src.names("study-methods-2026*.json.gz"):
        return ""
    r = src.json("study-methods-2026.json.gz")
    tree = {label: is_tree(v["preset"], v["sets"]) for label, v in r["plan"].items()}
    groups = sorted(r["flops-raw"]["groups"], key=lambda g: (g["curve_to_target"] is None, g["curve_to_target"]))
    rows = "\n".join(
        f"| `{g['label']}` | {'tree' if tree[g['label']] else 'flat'} | {len(g['runs'])} | {pm(g['gain'], '+.3f')} "
        f"| {tables.tflops_cell(g['curve_to_target'])} | {tables.speedup_cell(g)} |"
        for g in groups
    )
    reached = [g for g in groups if g["curve_to_target"] is not None]
    best = {kind: next((g["label"] for g in reached if tree[g["label"]] == kind), None) for kind in (True, False)}
    named = "no recipe gets there"
    if reached:
        first = reached[0]["label"]
        other = best[not tree[first]]
        named = f"the fastest method is the {'tree recipe' if tree[first] else 'flat method'} `{first}`, " + (
            f"the fastest {'flat method' if tree[first] else 'tree recipe'} `{other}`"
            if other
            else f"and no {'flat method' if tree[first] else 'tree recipe'} gets there"
        )
    vs = f"study-methods-2026-vs-{best[False]}.json.gz"
    if best[True] and vs in src.names("study-methods-2026-vs-*.json.gz"):  # the goal: the best tree over best flat
        g = next(g for g in src.json(vs)["flops-raw"]["groups"] if g["label"] == best[True])
        named += f"; `{best[True]}`'s speed-up over `{best[False]}`: {tables.speedup_cell(g)}"
    return (
        "\nThe 2026 methods, each at its swept rate (`@lr`: a tree recipe and its flat method each at the other's "
        f"rate, the controls), {r['tflops_per_run']:g} denoiser TFLOPs, seeds "
        f"{min(r['seeds'])}-{max(r['seeds'])} (`{r['command']}`), timed to a held-out gain of "
        f"{r['target_gain']:+.2f} with the trained weights against `{r['baseline']}`: {named} "
        "([docs/results.md](docs/results.md#the-2026-methods)).\n\n"
        f"| variant | sampling | seeds | gain, trained weights | TFLOPs to {r['target_gain']:+.2f} "
        f"| speed-up over `{r['baseline']}` |\n|---|---|---|---|---|---|\n" + rows + "\n"
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
