"""The BranchGRPO study: methods and ablations on the embedded world for the same denoiser-FLOP budget.

    python bench/study.py                                  # the core plan: 6 variants x seeds 0 1 2, 40 TFLOPs each
    python bench/study.py --plan best-lr --seeds 0 1 2 3 4 # the core variants at their best rates, and branch-mix-flow
    python bench/study.py --plan ablation --seeds 0 1 2    # one factor at a time from branch and branch-mix
                                                           # (the runs both plans share are run once), DanceGRPO
                                                           # with the noise factor, the Mix's combinations
    python bench/study.py --plan nft --seeds 0 1 2         # DiffusionNFT and tree-NFT against flow-grpo, dance-grpo
    python bench/study.py --plan nft --seeds 0 1 2 --report-only --baseline flow-grpo   # timed to flow-grpo's gain
    python bench/study.py --plan video --work runs/study-video --tflops 24   # the moving-shapes video world
    python bench/study.py --plan video --work runs/study-video --report-only --target 0.1   # time to a fixed gain
    python bench/study.py --plan lr --seeds 100            # the learning-rate sweep, on a seed no table uses;
                                                           # its table names each variant's best rate
    python bench/study.py --report-only                    # the tables again, from the runs on disk
    python bench/study.py --plan ablation --labels X       # trains X only; the table is still the whole plan's
    python bench/study.py --plan adaptive --seeds 0 1 2 3 4 # adaptive trees against branch-mix-flow, after the
                                                           # sweep --plan adaptive-lr --seeds 100 (adaptive-video)
    python bench/study.py --plan methods-2026-lr --seeds 100 --work runs/study-methods-2026 --tflops 10
    python bench/study.py --plan methods-2026 --seeds 0 1 2 3 4 --work runs/study-methods-2026 --tflops 10 \
        --eval-every 1                                     # AWM, DGPO, GRPO-Guard (flat and trees) against
                                                           # nft and branch-mix-flow, each at its swept rate
    python bench/study.py --rerun dance-grpo --seeds 0     # one run again in a fresh folder: its metrics rows
                                                           # must equal the first one's (timings aside) on
                                                           # the same CPU (another instruction set moves the
                                                           # last bits); writes bench/results/WORK-rerun.json

Each run is `treegrpo train --preset P --seed S` with the world's defaults (16 prompts of shapes-train an
iteration, lr 1e-4), the variant's `--set`s, one CPU thread, and `train.max_tflops` as the budget: it stops
after the iteration that reaches the budget in cumulative denoiser FLOPs (counted from the model's shapes
and the evaluations run, models/flops.py), so the same seed gives the same run whatever the machine's load.
Held-out evaluations (56 test prompts x 4 ODE samples, the same noises every time) every eighth of the budget,
of the weights `eval` and `export` use (the EMA where a preset keeps one; the trained ones as `raw/`).

Each finished run's run.json, metrics.jsonl, eval.jsonl and summary are kept in runs/study-runs/WORK/ (not
committed), which is what --report-only reads, and what a rerun skips; the summary carries what the tables read of
the metrics rows (`run_metrics`) and the sha256 and size of each kept file, so the committed results hold no raw rows.

Then `treegrpo compare` over the runs, with dance-grpo as the baseline (target: its mean final held-out gain
over each run's first evaluation), on the FLOP axis and on wall-clock, each with the weights `eval` uses
(dance-grpo's EMA) and with the trained weights (`-raw`): bench/results/study-PLAN.json.gz (every run's summary
and compare's numbers) and study-PLAN.md (the tables); the compare pages and plots under WORK/compare-study-PLAN-*/.
`python bench/results_page.py` draws docs/results.md and its plots from the .json.gz files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods import commit, machine, train_command  # noqa: E402  (bench/ is not a package)
from study_tables import (  # noqa: E402
    WORLD_LR,
    best_rates,
    cost_table,
    factor_table,
    flop_split_table,
    run_metrics,
    savings_table,
    signal_table,
    sweep_table,
    table,
)

TREEGRPO = [sys.executable, "-m", "treegrpo_cli"]
RESULTS = Path("bench/results")
# what `compare` reads of a run, kept under runs/study-runs/ (beside the scratch run folders, which a lost or cleaned
# one would cost its minutes again); checkpoints and sample grids are not kept. Ignored by git: the committed
# summaries carry what the tables read of them, and their hashes.
RUNS = Path("runs/study-runs")
KEPT = ("run.json", "metrics.jsonl", "eval.jsonl", "summary.json")
PAPER_SCHEDULE = ('train.loss_norm="mean"', "pruning.train_last=false", "train.minibatches=1")

# label -> (preset, --set values). The presets carry the released codes' update schedules (presets/*.toml).
CORE: dict[str, tuple[str, tuple[str, ...]]] = {
    "dance-grpo": ("dance-grpo", ()),
    "branch": ("branch", ()),
    "branch-mix": ("branch-mix", ()),
    "branch-mix/one-step-mean": ("branch-mix", PAPER_SCHEDULE),
    "tree-grpo": ("tree-grpo", ()),
    "tree-grpo/one-step-mean": ("tree-grpo", PAPER_SCHEDULE),
}
# each variant's rate in the best-lr and ablation plans: the best final held-out gain (eval weights) of the sweep
# at seed 100 (--plan lr, bench/results/study-lr.md); tests/bench/test_study.py holds this to the sweep's kept runs
BEST_LR = {
    "dance-grpo": WORLD_LR,
    "branch": "3e-5",
    "branch-mix": WORLD_LR,
    "branch-mix/one-step-mean": WORLD_LR,
    "tree-grpo": "3e-5",
    "tree-grpo/one-step-mean": "3e-5",
    "branch/one-step-mean": WORLD_LR,  # swept on its own (SWEPT_ONLY): one step where branch's code takes ~16
}


def at_best(label: str) -> str:
    """The variant's label at its best rate: bare at the world's rate, else with @lrX as in the lr plan."""
    return label if BEST_LR[label] == WORLD_LR else f"{label}@lr{BEST_LR[label]}"


def lr_set(label: str) -> tuple[str, ...]:
    return () if BEST_LR[label] == WORLD_LR else (f"train.lr={BEST_LR[label]}",)


# the ablation's factors: each one --set list changed from the base preset (methods.md gives each one's source)
FACTORS: dict[str, tuple[str, ...]] = {
    "one-step-mean": PAPER_SCHEDULE,
    "flow-noise": ('sampler.noise="flow"', "sampler.eta=0.7"),
    "independent-splits": ("tree.branch_s=inf",),
    "scaled-splits": ('tree.branch_noise="scaled"',),
    "path-weighted": ("advantage.beta=1.0",),
    "late-splits": ("tree.split_steps=[9,12,15,18]",),
    "leaf-zscore": ('advantage.estimator="flat"',),  # each leaf's group z-score, meaned onto its path
}
WINDOW_0_9 = ("tree.sde_steps=[0,1,2,3,4,5,6,7,8,9]",)
COMBINABLE = {**FACTORS, "window-0-9": WINDOW_0_9}  # what a FACTOR+FACTOR label may join


# swept for their rate, not in the core table: DiffusionNFT, and branch with one step of the mean (the ablation's
# schedule factor from branch, whose code takes ~16 optimizer steps an iteration: one step at branch's rate is also
# a 16x smaller update, so the schedule gets its own rate, as branch-mix/one-step-mean has in CORE)
SWEPT_ONLY: dict[str, tuple[str, tuple[str, ...]]] = {
    "nft": ("nft", ()),
    "branch/one-step-mean": ("branch", PAPER_SCHEDULE),
}

PLANS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "core": CORE,
    "nft": {  # DiffusionNFT against the flat GRPO baselines, and on the leaves of a tree
        "dance-grpo": ("dance-grpo", ()),
        "flow-grpo": ("flow-grpo", ()),
        "nft": ("nft", ()),
        "tree-nft": ("tree-nft", ()),
    },
    # the learning rate of each method and schedule: 3 values around the world's 1e-4, on a seed the tables do not
    # use (python bench/study.py --plan lr --seeds 100); the best per variant is the one the tables should use. 1e-5
    # (BranchGRPO's and DanceGRPO's released rate) extends the sweep where the best sits at 3e-5: run it with --labels
    "lr": {
        (label if lr == WORLD_LR else f"{label}@lr{lr}"): (preset, (*sets, f"train.lr={lr}"))
        for label, (preset, sets) in {**CORE, **SWEPT_ONLY}.items()
        for lr in ("1e-5", "3e-5", WORLD_LR, "3e-4")
    },
    # the core variants each at the best rate of the sweep (BEST_LR): the table the README leads with
    "best-lr": {at_best(label): (preset, (*sets, *lr_set(label))) for label, (preset, sets) in CORE.items()},
    "ablation": {  # from branch and branch-mix at their best rates, one factor at a time
        "dance-grpo": ("dance-grpo", ()),
        # the control: does the flat baseline gain from Flow-GRPO's wider noise what the trees gain?
        "dance-grpo/flow-noise": ("dance-grpo", FACTORS["flow-noise"]),
        at_best("branch"): ("branch", lr_set("branch")),
        at_best("branch-mix"): ("branch-mix", lr_set("branch-mix")),
        **{
            f"{at_best(base)}/{name}": (base, (*sets, *lr_set(base)))
            for base in ("branch", "branch-mix")
            for name, sets in FACTORS.items()
        },
        # the schedule factor again at its own swept rate where that differs from its base's (branch: one step of
        # the mean at branch's 3e-5 is also a 16x smaller update than the code's ~16 steps at that rate)
        **{
            at_best(f"{base}/one-step-mean"): (base, (*PAPER_SCHEDULE, *lr_set(f"{base}/one-step-mean")))
            for base in ("branch", "branch-mix")
            if BEST_LR[f"{base}/one-step-mean"] != BEST_LR[base]
        },
        # the Mix window: SDE on steps 0-3 and the splits (branch-mix) against 0-9, and against branch (all SDE)
        f"{at_best('branch-mix')}/window-0-9": ("branch-mix", (*WINDOW_0_9, *lr_set("branch-mix"))),
        # then the best combination: the factors that helped the Mix, together (FACTOR+FACTOR)
        **{
            f"{at_best('branch-mix')}/{'+'.join(names)}": (
                "branch-mix",
                (*(s for name in names for s in COMBINABLE[name]), *lr_set("branch-mix")),
            )
            for names in (("flow-noise", "window-0-9"), ("flow-noise", "scaled-splits", "window-0-9"))
        },
    },
    # the moving-shapes video world, each method with the video model's own defaults (10 steps,
    # motion-train prompts, the motion-shapes reward): python bench/study.py --plan video --work runs/study-video
    # --tflops 24
    "video": {  # tree-grpo-mean: the video model's default preset
        label: (label, ('model="tiny-shapes-video"',))
        for label in ("dance-grpo", "branch-mix", "tree-grpo", "tree-grpo-mean")
    },
}
# the study's best BranchGRPO recipe (presets/branch-mix-flow.toml) in the README's table beside the core variants:
# the ablation's variant itself, so the two plans share its runs; at branch-mix's rate (not swept on its own)
BEST_BRANCH = f"{at_best('branch-mix')}/flow-noise+window-0-9"
PLANS["best-lr"][BEST_BRANCH] = PLANS["ablation"][BEST_BRANCH]

# Adaptive trees (docs/methods.md, "Adaptive trees"): TreePO's dynamic rollout, per-prompt budgets and TMPO's moving
# split steps, one factor at a time from branch-mix-flow (and from tree-grpo on the video world), the flat baseline
# with per-prompt budgets, then combinations. Each variant trains at its best rate of the 3-value sweep at seed 100
# (--plan adaptive-lr / adaptive-video-lr), read from that sweep's results; the labels stay bare (the rate is a --set).
# On the image world 10 TFLOPs a run: branch-mix-flow reaches +0.25 (trained weights) in about half of that (dance-grpo
# needs about 15; study-best-lr, study-core-target0.25), and the study times runs to +0.25. On the video world 12:
# tree-grpo reaches +0.10 in about 6.5 (study-video-target0.1).
#   python bench/study.py --plan adaptive-lr --seeds 100 --work runs/study-adaptive --tflops 10
#   python bench/study.py --plan adaptive --seeds 0 1 2 3 4 --work runs/study-adaptive --tflops 10 --eval-every 1
#       (vs branch-mix-flow, timed to +0.25 with a held-out evaluation every TFLOP)
#   python bench/study.py --plan adaptive-video-lr --seeds 100 --work runs/study-adaptive-video --tflops 12
#   python bench/study.py --plan adaptive-video --seeds 0 1 2 3 4 --work runs/study-adaptive-video --tflops 12 \
#       --eval-every 1
ADAPTIVE_FACTORS: dict[str, tuple[str, ...]] = {
    "dynamic-reward": ('tree.dynamic="reward"',),  # TreePO: predicted ties stop, hand their budget over, fall back
    "dynamic-distance": ('tree.dynamic="distance"', "tree.stop_tol=0.4"),  # the same from x0 distances, no reward call
    "early-stop": ('tree.dynamic="reward"', "tree.transfer=false"),  # stops keep the forwards they would have spent
    "budget": ('budget.mode="spread"',),  # leaves over prompts by their estimated reward spread
    "budget-replace": ('budget.mode="spread"', "budget.replace_after=2"),  # and tied prompts replaced (DAPO)
    # TMPO: dense early splits spreading out over the first 35 iterations (a 10-TFLOP run stops near 42), jittered
    "splits-progress": (
        'splits.kind="progress"',
        "splits.early=[0,1,2,3]",
        "splits.late=[0,3,6,9]",
        "splits.over=35",
        "splits.kappa=6.0",
    ),
    "splits-adaptive": ('splits.kind="adaptive"', "splits.kappa=4.0"),  # per prompt: low reward splits earlier
}
ADAPTIVE_RATES = ("3e-5", WORLD_LR, "3e-4")
# TreePO's "repetitive branch" stop on treepo's low-noise tree: siblings whose x0-predictions lie within a tenth of
# their RMS (at 0.2 nearly every split-3 pair of the embedded world counts as one)
TREEPO_DYNAMIC = ('tree.dynamic="distance"', "tree.stop_tol=0.1")


def adaptive_variants(video: bool) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The adaptive study's variants without their rates: baselines, one factor at a time, combinations."""
    world = ('model="tiny-shapes-video"',) if video else ()
    out = {
        "branch-mix-flow": ("branch-mix-flow", world),
        "tree-grpo": ("tree-grpo", world),
        "dance-grpo": ("dance-grpo", world),
        "dance-grpo/budget": ("dance-grpo", (*world, *ADAPTIVE_FACTORS["budget"])),
    }
    out |= {f"branch-mix-flow/{k}": ("branch-mix-flow", (*world, *v)) for k, v in ADAPTIVE_FACTORS.items()}
    combos = [("budget", "dynamic-reward"), ("budget", "splits-progress")]
    if not video:  # TreePO's sub-group advantages alone (the fixed tree), and with its dynamic rollout (the preset)
        fixed = ('tree.dynamic="off"', "tree.stop_tol=0")  # stop_tol is unused when off: the default keeps one config
        out |= {"treepo": ("treepo", fixed), "treepo/dynamic": ("treepo", TREEPO_DYNAMIC)}
    if video:  # tree-grpo leads the video world; its window schedule owns the split steps (no [splits] there)
        out |= {f"tree-grpo/{k}": ("tree-grpo", (*world, *ADAPTIVE_FACTORS[k])) for k in ("dynamic-reward", "budget")}
        combos = [("budget", "dynamic-reward")]
    for names in combos:
        out[f"branch-mix-flow/{'+'.join(names)}"] = (
            "branch-mix-flow",
            (*world, *(x for n in names for x in ADAPTIVE_FACTORS[n])),
        )
    return out


FIXED_RATES = {"tree-grpo": "3e-5"}  # image world: tree-grpo at its swept rate (BEST_LR); dance-grpo at the world's


def adaptive_plan(video: bool) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every variant at its best rate of the sweep (the trained weights' final gain), once the sweep's results are
    in bench/results; before that, at the world's rate (main() says so). A variant whose rate is not its baseline's
    brings the baseline at its rate as a control (label BASE@lrRATE)."""
    sweep = RESULTS / f"study-adaptive{'-video' if video else ''}-lr.json.gz"
    best: dict[str, str] = {}
    if sweep.exists():
        best = best_rates(json.loads(gzip.decompress(sweep.read_bytes()))["runs"], trained=True)
    fixed = {} if video else FIXED_RATES
    variants = adaptive_variants(video)
    rate = {label: best.get(label, fixed.get(label, WORLD_LR)) for label in variants}
    plan = {label: (preset, (*sets, f"train.lr={rate[label]}")) for label, (preset, sets) in variants.items()}
    # a control: a baseline at the rate one of its variants runs at where the sweep chose another for the baseline,
    # so that a variant's gain on its baseline is not the rate's
    for label in variants:
        root = label.split("/")[0]
        if "/" in label and root in variants and rate[label] != rate[root]:
            preset, sets = variants[root]
            plan.setdefault(f"{root}@lr{rate[label]}", (preset, (*sets, f"train.lr={rate[label]}")))
    return plan


for _video, _name in ((False, "adaptive"), (True, "adaptive-video")):
    PLANS[f"{_name}-lr"] = {  # the sweep: every variant but the fixed-rate baselines, 3 rates
        f"{label}@lr{lr}": (preset, (*sets, f"train.lr={lr}"))
        for label, (preset, sets) in adaptive_variants(_video).items()
        if _video or label not in FIXED_RATES and label != "dance-grpo"
        for lr in ADAPTIVE_RATES
    }
# each adaptive plan's baseline and target gain (trained weights), in bench/results/study-adaptive[-video].{json.gz,md}
PLAN_DEFAULTS = {"adaptive": ("branch-mix-flow", 0.25), "adaptive-video": ("tree-grpo", 0.10)}
# the adaptive sweeps hold no bare label: their reports time against the baseline at the world's rate
SWEEP_BASELINES = {"adaptive-lr": f"branch-mix-flow@lr{WORLD_LR}", "adaptive-video-lr": f"tree-grpo@lr{WORLD_LR}"}


def plan_defaults(plan: str) -> tuple[str, float | None]:
    """A plan's baseline and target gain (None: the baseline's final gain) when --baseline / --target are not given."""
    return PLAN_DEFAULTS.get(plan) or (SWEEP_BASELINES.get(plan, "dance-grpo"), None)


def train_args(preset: str, sets: tuple[str, ...], seed: int, run: Path, tflops: float, every: float) -> list[str]:
    budget = [f"train.max_tflops={tflops}", f"train.eval_every_tflops={every}"]
    # a label without @lr trains at the world's rate, whatever rate a preset's [for_model.tiny-shapes] names
    lr = [] if any(s.startswith("train.lr=") for s in sets) else [f"train.lr={WORLD_LR}"]
    return train_command(preset, seed, run, budget + lr + list(sets))


def folder(label: str, seed: int) -> str:
    return f"{label.replace('/', '--')}-seed{seed}"


def kept(work: Path, label: str, seed: int) -> Path:
    return RUNS / work.name / folder(label, seed)


def keep(row: dict, work: Path) -> dict:
    """Copy what compare reads of a finished run into runs/study-runs/; the row then points there, and carries
    run_metrics and each kept file's sha256 and size (the committed summaries hold no raw rows)."""
    src, dst = Path(row["run_dir"]), kept(work, row["label"], row["seed"])
    if src.resolve() != dst.resolve():
        dst.mkdir(parents=True, exist_ok=True)
        files = {name: (src / name).read_bytes() for name in KEPT[:-1]}
        raw = {name: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)} for name, b in files.items()}
        row = dict(row, run_dir=str(dst), metrics=run_metrics(src), raw_files=raw)
        for name, b in files.items():
            (dst / name).write_bytes(b)
        (dst / "summary.json").write_text(json.dumps(row, indent=1) + "\n")
    return row


class Job(NamedTuple):
    """One run of a plan: run_one's first arguments."""

    label: str
    preset: str
    sets: tuple[str, ...]
    seed: int


def run_one(
    label: str, preset: str, sets: tuple[str, ...], seed: int, work: Path, tflops: tuple[float, float], log
) -> dict:
    """tflops: (the run's budget, TFLOPs between held-out evaluations)."""
    run = work / folder(label, seed)
    for done in (kept(work, label, seed) / "summary.json", run / "summary.json"):
        if done.exists():
            row = json.loads(done.read_text())
            if row.get("preset", preset) != preset or row.get("sets", list(sets)) != list(sets):
                raise RuntimeError(
                    f"{done.parent} was trained as {row.get('preset')} {row.get('sets')}, not as "
                    f"{preset} {list(sets)}: remove it (and its work folder) to train it again"
                )
            return keep(row, work)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    out = subprocess.run(
        TREEGRPO + train_args(preset, sets, seed, run, *tflops), env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"{label} seed {seed} failed: {out.stderr.strip().splitlines()[-1:]}")
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    row = {
        "label": label,
        "preset": preset,
        "sets": list(sets),
        "seed": seed,
        "run_dir": str(run),
        "commit": commit(),
        "process_minutes": (time.perf_counter() - t0) / 60,
        "loadavg_1m": os.getloadavg()[0],
        "summary": json.loads(out.stdout),
        "heldout": [
            {k: e.get(k) for k in ("iteration", "wall", "flops_total", "reward_mean", "raw/reward_mean", "weights")}
            for e in evals
        ],
    }
    done.write_text(json.dumps(row, indent=1) + "\n")
    sm = row["summary"]
    log(
        f"{label} seed {seed}: {sm['iterations']} iterations, held-out gain {sm.get('heldout_gain', float('nan')):+.3f}"
    )
    return keep(row, work)


def report(rows: list[dict], work: Path, args: argparse.Namespace) -> dict:
    from treegrpo_cli.report.compare import compare_runs, to_dict
    from treegrpo_cli.report.compare_page import write_report

    own_base, own_target = plan_defaults(args.plan)
    name = f"study-{args.plan}" + ("" if args.baseline == own_base else f"-vs-{args.baseline}")
    name += "" if args.target is None or args.target == own_target else f"-target{args.target:g}"
    folders, labels = [Path(r["run_dir"]) for r in rows], [r["label"] for r in rows]
    # a run kept before run_metrics had a key: read again from its raw rows, where they are here
    rows = [
        dict(r, metrics=run_metrics(f)) if (f / "metrics.jsonl").exists() else r
        for r, f in zip(rows, folders, strict=True)
    ]
    result = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": commit(),
        "machine": machine(),
        "tflops_per_run": args.tflops,
        "eval_every_tflops": args.eval_every,
        "baseline": args.baseline,
        "target_gain": args.target,
        "seeds": args.seeds,
        "plan": {k: {"preset": p, "sets": list(s)} for k, (p, s) in PLANS[args.plan].items()},
        "command": " ".join(["python bench/study.py", *(a for a in sys.argv[1:] if a != "--report-only")]),
        "runs": rows,
    }
    for axis in ("flops", "time", "iterations"):
        for raw in (False, True):  # the weights eval/export use (dance-grpo's EMA), and the trained ones
            key = axis + ("-raw" if raw else "")
            cmp = compare_runs(
                folders, labels, target=args.target, baseline=args.baseline, gain=True, axis=axis, raw=raw
            )
            write_report(cmp, work / f"compare-{name}-{key}")
            result[key] = to_dict(cmp)
    text = json.dumps(result, indent=1) + "\n"
    (RESULTS / f"{name}.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))  # mtime 0: same bytes again
    md = table(result) + cost_table(result) + cost_table(result, raw=True)
    md += sweep_table(rows) if args.plan == "lr" else ""
    md += sweep_table(rows, trained=True) if args.plan in SWEEP_BASELINES else ""
    md += factor_table(rows) + signal_table(result) if args.plan == "ablation" else ""
    md += signal_table(result) + savings_table(result) + flop_split_table(result) if args.plan in PLAN_DEFAULTS else ""
    (RESULTS / f"{name}.md").write_text(md)
    return result


def run_job(job: Job, args: argparse.Namespace, log) -> dict:
    """run_one of a plan's job, in the command line's work folder and budget."""
    return run_one(*job, args.work, (args.tflops, args.eval_every), log)


def rerun(label: str, seed: int, args: argparse.Namespace, log) -> None:
    """The run again in a fresh folder; its metrics rows against the first run's, timings aside."""
    preset, sets = PLANS[args.plan][label]
    first = kept(args.work, label, seed)
    again = args.work.with_name(args.work.name + "-rerun")
    row = run_one(label, preset, sets, seed, again, (args.tflops, args.eval_every), log)
    from treegrpo_cli.training.runlog import without_timings

    read = lambda p: without_timings([json.loads(line) for line in (p / "metrics.jsonl").read_text().splitlines()])  # noqa: E731
    a, b = read(first), read(Path(row["run_dir"]))
    # a rerun by newer code may add fields; every field the first run has must be there, with the same value
    same = len(a) == len(b) and all(all(k in y and y[k] == x[k] for k in x) for x, y in zip(a, b, strict=True))
    added = sorted({k for y in b for k in y} - {k for x in a for k in x})
    log(f"rerun of {label} seed {seed}: {len(b)} metrics rows, {'equal' if same else 'NOT equal'} to the first run's")
    out = {
        "label": label,
        "seed": seed,
        "rows": len(b),
        "equal_rows": same,
        "fields_added_since": added,
        "first": str(first),
        "rerun": row["run_dir"],
    }
    (RESULTS / f"{args.work.name}-rerun.json").write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", choices=sorted(PLANS), default="core")
    ap.add_argument("--labels", nargs="+", default=None, help="a subset of the plan's variants")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tflops", type=float, default=40.0, help="denoiser TFLOPs of training per run")
    ap.add_argument("--eval-every", type=float, default=None, help="TFLOPs between held-out evaluations (--tflops/8)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (one CPU thread each)")
    ap.add_argument("--work", type=Path, default=None, help="default: runs/study-core, for every plan")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--rerun", default=None, help="a variant to run again at the first --seed")
    ap.add_argument(
        "--baseline",
        default=None,
        help="the variant whose final gain is the target (default: dance-grpo; an adaptive plan's own)",
    )
    ap.add_argument("--target", type=float, default=None, help="a held-out gain to time every variant to instead")
    args = ap.parse_args()
    args.eval_every = args.eval_every or args.tflops / 8
    args.baseline = args.baseline or plan_defaults(args.plan)[0]
    if args.target is None:
        args.target = plan_defaults(args.plan)[1]
    args.work = args.work or Path("runs/study-core")
    args.work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(time.strftime("%H:%M:%S"), msg, flush=True)

    if args.rerun:
        return rerun(args.rerun, args.seeds[0], args, log)
    if args.plan in PLAN_DEFAULTS and not (RESULTS / f"study-{args.plan}-lr.json.gz").exists():
        log(f"no bench/results/study-{args.plan}-lr.json.gz (--plan {args.plan}-lr --seeds 100): the world's rate")
    plan = {k: v for k, v in PLANS[args.plan].items() if args.labels is None or k in args.labels}
    jobs = [Job(label, *plan[label], seed) for seed in args.seeds for label in plan]  # seed by seed
    if not args.report_only:
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda j: run_job(j, args, log), jobs))
        # running a few --labels adds to the plan's table: report every kept run of the plan, not those alone
        jobs = [Job(label, *PLANS[args.plan][label], seed) for seed in args.seeds for label in PLANS[args.plan]]
    paths = [kept(args.work, label, seed) / "summary.json" for label, _, _, seed in jobs]
    rows = [json.loads(p.read_text()) for p in paths if p.exists()]
    if args.baseline not in {r["label"] for r in rows}:  # --labels left it out: its kept runs, if any
        base = [kept(args.work, args.baseline, seed) / "summary.json" for seed in args.seeds]
        rows += [json.loads(p.read_text()) for p in base if p.exists()]
    if args.baseline not in {r["label"] for r in rows}:
        return log(f"no {args.baseline} runs to time against: no report (run them, or give --baseline)")
    report(rows, args.work, args)
    log(f"wrote bench/results/study-{args.plan}*.json.gz and .md ({len(rows)} runs)")


PLANS["adaptive"], PLANS["adaptive-video"] = adaptive_plan(False), adaptive_plan(True)  # the sweeps' rates, if run

# The methods users pick in 2026 (docs/methods.md 17-19: AWM, DGPO, GRPO-Guard), flat and on trees, against
# DiffusionNFT and branch-mix-flow. Every variant, the two baselines included, trains at its best rate of a 4-value
# sweep at seed 100 (the trained weights' final gain), read from the sweep's results: equal terms, since nft was
# never swept on the world and branch-mix-flow only as branch-mix. Runs are timed to +0.25 (trained weights) with a
# held-out evaluation every TFLOP.
#   python bench/study.py --plan methods-2026-lr --seeds 100 --work runs/study-methods-2026 --tflops 10
#   python bench/study.py --plan methods-2026 --seeds 0 1 2 3 4 --work runs/study-methods-2026 --tflops 10 \
#       --eval-every 1
Plan = dict[str, tuple[str, tuple[str, ...]]]
METHODS_2026: Plan = {label: (label, ()) for label in ("awm", "tree-awm", "dgpo", "tree-dgpo", "flow-grpo-guard")}
METHODS_2026_BASES: Plan = {label: (label, ()) for label in ("nft", "branch-mix-flow")}
METHODS_2026_RATES = (*ADAPTIVE_RATES, "1e-3")  # the forward-process methods' best sat at 3e-4: one rate above it
PLANS["methods-2026-lr"] = {
    f"{label}@lr{lr}": (preset, (*sets, f"train.lr={lr}"))
    for label, (preset, sets) in {**METHODS_2026_BASES, **METHODS_2026}.items()
    for lr in METHODS_2026_RATES
}


def methods_2026_plan() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every variant at its swept rate (before the sweep: the world's), the baselines first. A tree recipe whose rate
    is not its flat method's brings two controls, so that the tree's gain on the flat method is not the rate's: the
    flat method at the tree's rate and the tree at the flat method's (labels METHOD@lrRATE)."""
    sweep = RESULTS / "study-methods-2026-lr.json.gz"
    best = best_rates(json.loads(gzip.decompress(sweep.read_bytes()))["runs"], trained=True) if sweep.exists() else {}
    variants = {**METHODS_2026_BASES, **METHODS_2026}
    rate = {label: best.get(label, WORLD_LR) for label in variants}
    plan: Plan = {}
    for label, (preset, sets) in variants.items():
        plan[label] = (preset, (*sets, f"train.lr={rate[label]}"))
        flat = label.removeprefix("tree-")
        if flat != label and flat in variants and rate[flat] != rate[label]:
            for a, b in ((flat, label), (label, flat)):
                plan[f"{a}@lr{rate[b]}"] = (variants[a][0], (*variants[a][1], f"train.lr={rate[b]}"))
    return plan


PLANS["methods-2026"] = methods_2026_plan()
PLAN_DEFAULTS["methods-2026"] = ("branch-mix-flow", 0.25)
SWEEP_BASELINES["methods-2026-lr"] = f"awm@lr{WORLD_LR}"

if __name__ == "__main__":
    main()
