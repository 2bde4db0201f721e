"""The benchmarks under bench/: the study's plans, tables and kept runs, the world probes (the model tables:
test_model_memory.py)."""

from pathlib import Path

import pytest
from benchmods import load as _bench

ROOT = Path(__file__).resolve().parents[2]


TABLES = _bench("study_tables")


def test_a_rerun_is_checked_against_the_reference_spread():
    """bench/methods.py --against: gains within the reference's mean +- 2 std over seeds, speed-ups within its
    95% interval (never reaching the target counts as 0)."""
    methods = _bench("methods")
    group = lambda label, gain, speedup, low=None, high=None: {  # noqa: E731
        "label": label,
        "gain": {"mean": gain},
        "speedup": speedup,
        "speedup_low": low,
        "speedup_high": high,
    }
    ref = {
        "runs": [
            {"label": m, "gain": g}
            for m, gs in {"d": [0.1, 0.2, 0.3], "t": [0.2, 0.3, 0.4], "b": [0.0, 0.0, 0.03]}.items()
            for g in gs
        ],
        "groups": [group("d", 0.2, 1.0), group("t", 0.3, 2.0, 1.5, 3.0), group("b", 0.01, None, 0.0, 0.8)],
    }
    new = {"baseline": "d", "groups": [group("d", 0.25, 1.0), group("t", 0.45, 2.9), group("b", -0.01, None)]}
    out = methods.against(new, ref, "ref.json")
    assert out["methods"]["t"]["within_2_std"] and not out["methods"]["t"]["within_range"]  # 0.45 < 0.3 + 0.2
    assert out["methods"]["b"]["within_2_std"]  # std 0.0173: -0.01 is 1.15 std off
    assert out["speedups"]["t"]["within_interval"] and out["speedups"]["b"]["within_interval"]  # 0 in [0, 0.8]
    assert "d" not in out["speedups"] and out["lands"]
    new["groups"][1]["speedup"] = 3.2  # past the interval
    assert not methods.against(new, ref, "ref.json")["lands"]
    new["groups"][1]["speedup"], new["groups"][2]["gain"]["mean"] = 2.9, 0.06  # 0.05 + 2 x 0.0173 < 0.06
    assert not methods.against(new, ref, "ref.json")["lands"]


def test_world_base_splits_relation_reward_into_drawing_and_placing():
    from treegrpo_cli.world.shapes import render_prompts

    mod = _bench("world_base")
    asked = ["a red circle left of a blue square", "a green triangle above a yellow circle"] * 4
    flipped = ["a red circle right of a blue square", "a green triangle below a yellow circle"] * 4
    images = render_prompts(asked, 3)
    right = mod.measure(asked, images)["relation_parts"]
    assert right == {"both_drawn": 1.0, "placed_given_both": 1.0}
    # the same pictures asked the other way round: drawn, but never in the asked relation
    assert mod.measure(flipped, images)["relation_parts"] == {"both_drawn": 1.0, "placed_given_both": 0.0}
    # a picture of the first object only: not both drawn, and no placement to judge
    lone = mod.measure(asked[:1], render_prompts(["a red circle"], 3))["relation_parts"]
    assert lone == {"both_drawn": 0.0, "placed_given_both": None}


def test_world_base_order_sensitivity_tells_a_bag_of_words_from_an_ordered_reader():
    import torch

    mod = _bench("world_base")
    assert mod.swap_objects("a red circle left of a blue square") == "a blue square left of a red circle"

    class Words:  # a stand-in policy: draws from the noise plus a picture of the prompt's words
        def __init__(self, ordered):
            self.ordered = ordered

        def __call__(self, prompts, samples, seed):
            g = torch.Generator().manual_seed(seed)
            noise = torch.rand(len(prompts) * samples, 3, 4, 4, generator=g)
            words = [p.split() if self.ordered else sorted(p.split()) for p in prompts for _ in range(samples)]
            code = torch.tensor([[len(w) * 0.1 + (w[0] == "r") for w in ws[:3]] for ws in words])
            return [p for p in prompts for _ in range(samples)], noise + code[:, :, None, None]

    prompts = ["a red circle left of a blue square", "a green triangle above a yellow circle", "a red circle"]
    for ordered, expect in ((False, 0.0), (True, None)):
        mod.sample = lambda policy, p, s, seed, f=Words(ordered): f(p, s, seed)
        ratio = mod.order_sensitivity(None, prompts, 4, 0)
        assert (ratio == 0.0) if expect == 0.0 else ratio > 0.1


# Backticked repository paths that name what a command writes, not a file kept in the repository.
def test_the_learning_rate_sweep_names_each_variants_best_rate():
    """bench/study.py --plan lr: a row per variant, a column per rate, the best final eval-weights gain chosen
    (not the trained weights'); a rate not run is '-'."""

    def row(label, before, after, raw=None):
        first = {"reward_mean": before, "raw/reward_mean": None if raw is None else before}
        return {"label": label, "seed": 100, "heldout": [first, {"reward_mean": after, "raw/reward_mean": raw}]}

    text = TABLES.sweep_table(
        [
            row("dance-grpo@lr3e-5", 0.5, 0.6, raw=0.9),  # the trained weights gain most here, the EMA does not
            row("dance-grpo", 0.5, 0.7, raw=0.8),
            row("dance-grpo@lr3e-4", 0.5, 0.55, raw=0.6),
            row("tree-grpo@lr3e-5", 0.4, 0.8),
            row("tree-grpo", 0.4, 0.5),
        ]
    )
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert lines["variant"] == "| variant | lr 3e-5 | lr 1e-4 | lr 3e-4 | best |"
    assert lines["dance-grpo"] == "| dance-grpo | +0.100 (+0.400) | +0.200 (+0.300) | +0.050 (+0.100) | 1e-4 |"
    assert lines["tree-grpo"] == "| tree-grpo | +0.400 | +0.100 | - | 3e-5 |"
    assert "seed 100" in text


def test_an_adaptive_sweep_names_and_runs_the_rate_with_the_best_trained_weights(tmp_path, monkeypatch):
    """The adaptive plans time the trained weights: their sweep table's best column is the rate the plan then runs,
    chosen by the trained weights' gain where the EMA's differs (the video world's dance-grpo/budget: the EMA is
    best at 3e-4, the trained weights at 3e-5); a variant away from its baseline's rate brings a control."""
    import gzip
    import json

    study = _bench("study")
    runs = []
    for lr, ema, raw in (("3e-5", 0.500, 0.497), ("1e-4", 0.496, 0.453), ("3e-4", 0.501, 0.395)):
        first = {"reward_mean": 0.5, "raw/reward_mean": 0.5}
        runs.append(
            {
                "label": f"dance-grpo/budget@lr{lr}",
                "seed": 100,
                "heldout": [first, {"reward_mean": ema, "raw/reward_mean": raw}],
            }
        )
    assert TABLES.best_rates(runs) == {"dance-grpo/budget": "3e-4"}
    text = TABLES.sweep_table(runs, trained=True)
    assert "| dance-grpo/budget | +0.000 (-0.003) | -0.004 (-0.047) | +0.001 (-0.105) | 3e-5 |" in text
    assert "the trained weights' best gain" in text
    monkeypatch.setattr(study, "RESULTS", tmp_path)
    (tmp_path / "study-adaptive-video-lr.json.gz").write_bytes(gzip.compress(json.dumps({"runs": runs}).encode()))
    plan = study.adaptive_plan(video=True)
    assert "train.lr=3e-5" in plan["dance-grpo/budget"][1]
    # dance-grpo was not in this sweep (the world's rate, 1e-4): it runs at 1e-4, and at 3e-5 as the control
    assert plan["dance-grpo"][1][-1] == "train.lr=1e-4"
    assert plan["dance-grpo@lr3e-5"] == ("dance-grpo", (*plan["dance-grpo"][1][:-1], "train.lr=3e-5"))
    # a variant at its baseline's rate brings no control
    assert "tree-grpo@lr1e-4" not in plan and [k for k in plan if "@lr" in k] == ["dance-grpo@lr3e-5"]


def test_the_best_lr_plan_runs_each_variant_at_its_sweeps_best_rate():
    """bench/study.py's BEST_LR is what the kept sweep (bench/results/study-lr.json.gz) chose, and the best-lr and
    ablation plans train at those rates: a sweep rerun that moves a best rate fails here until the plans follow."""
    import gzip
    import json

    study = _bench("study")
    runs = json.loads(gzip.decompress((ROOT / "bench" / "results" / "study-lr.json.gz").read_bytes()))["runs"]
    assert TABLES.best_rates(runs) == study.BEST_LR

    def rate(sets):
        return next((s.split("=")[1] for s in sets if s.startswith("train.lr=")), study.WORLD_LR)

    best = dict(study.PLANS["best-lr"])
    # beside the core variants, the best BranchGRPO recipe: the ablation's run at its base preset's rate
    assert best.pop(study.BEST_BRANCH) == study.PLANS["ablation"][study.BEST_BRANCH]
    assert len(best) == len(study.CORE)
    for label in study.CORE:
        bare = study.BEST_LR[label] == study.WORLD_LR
        assert (label if bare else f"{label}@lr{study.BEST_LR[label]}") in best
    assert all(rate(sets) == study.BEST_LR[label.split("@lr")[0]] for label, (_, sets) in best.items())
    # the ablation varies one factor of branch or branch-mix, every variant at its base's best rate, but a variant
    # swept on its own (the update schedule), which has a row at its own rate as well
    ablation = study.PLANS["ablation"]
    for label, (preset, sets) in ablation.items():
        assert rate(sets) == study.BEST_LR.get(label.split("@lr")[0], study.BEST_LR[preset]), label
    assert ablation["branch/one-step-mean"][1] == study.PAPER_SCHEDULE  # 1e-4: its sweep's rate, not branch's
    assert rate(ablation["branch@lr3e-5/one-step-mean"][1]) == "3e-5"


def test_the_presets_train_the_world_at_the_sweeps_best_rates_and_the_study_pins_its_own():
    """The swept presets' [for_model.tiny-shapes] rate is the sweep's choice, but for the default, tree-grpo-mean
    (tree-grpo with one step of the mean), whose header says why it keeps the world's rate; the study's labels name
    their rate, so a bare label trains at the world's 1e-4 whatever a preset's table says."""
    from pathlib import Path

    from treegrpo_cli.config import load_config

    study = _bench("study")
    variant = {
        "dance-grpo": "dance-grpo",
        "branch": "branch",
        "branch-mix": "branch-mix",
        "tree-grpo": "tree-grpo",
    }
    for preset, label in variant.items():
        assert load_config(preset).train.lr == float(study.BEST_LR[label]), preset
    assert study.BEST_LR["tree-grpo/one-step-mean"] != study.WORLD_LR  # the exception the header explains
    assert load_config("tree-grpo-mean").train.lr == float(study.WORLD_LR)
    assert "keeps the world's rate" in (ROOT / "presets" / "tree-grpo-mean.toml").read_text()
    args = study.train_args("tree-grpo", (), 0, Path("nowhere"), 40.0, 5.0)
    assert f"train.lr={study.WORLD_LR}" in args and "train.eval_every_tflops=5.0" in args
    args = study.train_args("tree-grpo", ("train.lr=3e-4",), 0, Path("nowhere"), 40.0, 1.0)
    assert [a for a in args if a.startswith("train.lr=")] == ["train.lr=3e-4"]


def test_the_best_branchgrpo_preset_is_the_studys_variant():
    """branch-mix-flow is what the study ran as branch-mix/flow-noise+window-0-9, name and description aside: its
    figures (header, docs) are that variant's."""
    from treegrpo_cli.config import load_config

    study = _bench("study")
    preset, sets = study.PLANS["ablation"]["branch-mix/flow-noise+window-0-9"]
    ran = load_config(preset, sets=list(sets)).to_dict()
    ours = load_config("branch-mix-flow").to_dict()
    assert {k for k in ours if ours[k] != ran[k]} == {"name", "description"}


def test_the_ablation_pairs_each_factor_with_its_base_seed_by_seed():
    """bench/study.py's factor table: a BASE/FACTOR variant's final gain against BASE's on the same seeds only
    (a seed the base lacks is left out), the mean and range of the differences, and the seeds it helps."""

    def row(label, seed, before, after):
        return {"label": label, "seed": seed, "heldout": [{"reward_mean": before}, {"reward_mean": after}]}

    rows = [
        row("branch", 0, 0.5, 0.8),  # gain 0.3
        row("branch", 1, 0.5, 0.7),  # 0.2
        row("branch/late", 0, 0.5, 0.9),  # 0.4: +0.1
        row("branch/late", 1, 0.6, 0.7),  # 0.1: -0.1
        row("branch/late", 2, 0.5, 1.0),  # no base run at seed 2: left out
        row("dance-grpo", 0, 0.5, 0.6),
        row("mix/window", 0, 0.5, 0.6),  # no base at all: no row
    ]
    lines = [line for line in TABLES.factor_table(rows).splitlines() if line.startswith("| branch")]
    assert lines == ["| branch | late | 2 | +0.250 | +0.250 | +0.000 | -0.100 to +0.100 | 1 of 2 |"]


def test_the_ablations_combinations_are_their_factors_together():
    """A BASE/F1+F2 variant changes exactly what BASE/F1 and BASE/F2 change, and nothing else."""
    study = _bench("study")
    plan = study.PLANS["ablation"]
    combos = [label for label in plan if "+" in label]
    assert combos
    for label in combos:
        base, _, factors = label.partition("/")
        preset, sets = plan[label]
        parts = [plan[f"{base}/{name}"] for name in factors.split("+")]
        assert {p for p, _ in parts} == {preset}
        assert set(sets) == {s for _, part in parts for s in part}
        assert len(sets) == len(set(sets))


def test_the_ablation_reports_what_an_early_iteration_learns_from(tmp_path):
    """signal_table: tied groups, within-group std and trained edges averaged over the first quarter of each
    run's iterations (later, saturated rows left out), then over the variant's seeds."""
    import json

    def run(name, early, late):
        d = tmp_path / name
        d.mkdir()
        rows = [
            dict(zip(("zero_std_ratio", "reward_group_std", "trained_edges"), v, strict=True), flops_total=1e12)
            for v in early + late
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(d)

    late = [(1.0, 0.0, 0)] * 6
    result = {
        "runs": [
            {"label": "mix", "run_dir": run("a", [(0.5, 0.1, 200), (0.3, 0.3, 400)], late)},
            {"label": "mix", "run_dir": run("b", [(0.2, 0.2, 100), (0.2, 0.2, 100)], late)},
        ]
    }
    lines = [line for line in TABLES.signal_table(result).splitlines() if line.startswith("| mix")]
    assert lines == ["| mix | 0.30 | 0.200 | 200 |"]


def test_the_study_splits_a_flop_speedup_into_cost_per_iteration_and_iterations(tmp_path):
    """bench/study.py's cost table: TFLOPs an iteration from each run's metrics (the runs of a label meaned),
    the baseline's over the variant's as the cost ratio, and the iteration and FLOP axes' times to target."""
    import json

    runs = []
    for label, seed, per_iter, n in (
        ("dance-grpo", 0, 0.4e12, 10),
        ("dance-grpo", 1, 0.2e12, 10),
        ("tree", 0, 0.1e12, 4),
    ):
        run = tmp_path / f"{label}-{seed}"
        run.mkdir()
        rows = [{"iteration": i, "flops_total": per_iter * (i + 1)} for i in range(n)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append({"label": label, "run_dir": str(run)})

    def group(label, to, speedup):
        return {"label": label, "curve_to_target": to, "speedup": speedup, "speedup_low": None, "speedup_high": None}

    result = {
        "runs": runs,
        "baseline": "dance-grpo",
        "flops": {"target": 0.2, "groups": [group("dance-grpo", 3.0, 1.0), group("tree", 0.5, 6.0)]},
        "iterations": {"groups": [group("dance-grpo", 10, 1.0), group("tree", None, None)]},
        "flops-raw": {"target": 0.4, "groups": [group("dance-grpo", 6.0, 1.0), group("tree", None, None)]},
        "iterations-raw": {"groups": [group("dance-grpo", 20, 1.0), group("tree", 30, 0.67)]},
    }

    def lines(raw):
        text = TABLES.cost_table(result, raw=raw)
        return text, {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if "|" in line}

    text, rows = lines(False)
    assert "eval weights, gain +0.200" in text
    assert rows["dance-grpo"] == "| dance-grpo | 0.300 | 1.00x | 10 | 1.00x | 3.0 | 1.00x |"
    assert rows["tree"] == "| tree | 0.100 | 3.00x | never | never | 0.5 | 6.00x |"
    text, rows = lines(True)  # the trained weights' target and times
    assert "trained weights, gain +0.400" in text
    assert rows["tree"] == "| tree | 0.100 | 3.00x | 30 | 0.67x | never | never |"


def test_a_study_run_of_a_few_labels_reports_the_whole_plans_kept_runs(tmp_path, monkeypatch):
    """`bench/study.py --plan P --labels X` trains X, then writes P's table from every kept run of P at those seeds
    (a subset run used to overwrite the plan's results file with X and the baseline alone)."""
    import json
    import sys

    study = _bench("study")
    monkeypatch.setattr(study, "RESULTS", tmp_path)
    monkeypatch.setattr(study, "RUNS", tmp_path / "study-runs")
    plan = study.PLANS["ablation"]
    already = ["dance-grpo", "branch-mix", "branch-mix/flow-noise"]
    for label in already:
        (tmp_path / "study-runs" / "w" / study.folder(label, 0)).mkdir(parents=True)
        (study.kept(Path("w"), label, 0) / "summary.json").write_text(json.dumps({"label": label, "seed": 0}))
    trained = []

    def run_one(label, preset, sets, seed, work, tflops, log):
        assert (preset, tuple(sets)) == plan[label]
        trained.append(label)
        study.kept(work, label, seed).mkdir(parents=True)
        (study.kept(work, label, seed) / "summary.json").write_text(json.dumps({"label": label, "seed": seed}))

    reported = []
    monkeypatch.setattr(study, "run_one", run_one)
    monkeypatch.setattr(study, "report", lambda rows, work, args: reported.extend(r["label"] for r in rows))
    argv = ["study.py", "--plan", "ablation", "--labels", "branch/one-step-mean", "--seeds", "0"]
    monkeypatch.setattr(sys, "argv", argv + ["--work", str(tmp_path / "w")])
    study.main()
    assert trained == ["branch/one-step-mean"]
    assert sorted(reported) == sorted([*already, "branch/one-step-mean"])


def test_a_kept_run_carries_what_the_tables_read_and_its_files_hashes(tmp_path, monkeypatch):
    """bench/study.py keeps a finished run's raw rows under RUNS (runs/study-runs/, ignored by git) and puts in its
    summary what the tables read of them and each kept file's sha256 and size: the tables then need no raw rows."""
    import hashlib
    import json
    import shutil

    study = _bench("study")
    monkeypatch.setattr(study, "RUNS", tmp_path / "kept")
    run = tmp_path / "work" / "tree-seed0"
    run.mkdir(parents=True)
    # 8 iterations: the first quarter is rows 0-1
    rows = [
        {"optimizer_steps": 2, "flops_total": 0.5e12 * (i + 1), "zero_std_ratio": z, "trained_edges": 10 * i}
        | {"leaves": 8, "reward_images": 8 + (4 if i < 2 else 0)}  # the first two also judged 4 x0-predictions
        | {"tied_leaf_share": z / 2}
        # a forward 1 GFLOP, a training evaluation 3: the rollout's share is 1080 / 2040 of the run's FLOPs
        | {"rollout_evals": 100 + 10 * i, "train_evals": 40, "flops": (100 + 10 * i) * 10**9 + 40 * 3 * 10**9}
        for i, z in enumerate([0.5, 0.3, 0.9, 0.9, 1.0, 1.0, 1.0, 1.0])
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval.jsonl").write_text("{}\n")
    (run / "run.json").write_text("{}\n")
    row = study.keep({"label": "tree", "seed": 0, "run_dir": str(run)}, tmp_path / "work")
    assert Path(row["run_dir"]) == tmp_path / "kept" / "work" / "tree-seed0"
    assert row["metrics"] == pytest.approx(
        {
            "optimizer_steps_per_iteration": 2.0,
            "tflops_per_iteration": 0.5,
            "reward_group_std": 0.0,
            "early/zero_std_ratio": 0.4,
            "early/reward_group_std": 0.0,
            "early/trained_edges": 5.0,
            "run/zero_std_ratio": 0.825,  # over the whole run (6.6 / 8), and what adaptive trees did (none here)
            "run/early_stops": 0.0,
            "run/fallbacks": 0.0,
            "run/replaced": 0.0,
            "run/flops_saved_share": 0.0,
            "run/reward_images": 9.0,  # (6 x 8 + 2 x 12) / 8
            "run/leaves": 8.0,
            "run/tied_leaf_share": 0.4125,
            "run/rollout_share": 1080 / 2040,
            # tied rollouts by their leaves: (100 x 0.5 + 110 x 0.3 + 120 x 0.9 + 130 x 0.9 + 620) / 2 GFLOPs of 2040
            "run/tied_rollout_share": 464 / 2040,
            "run/rollout_forward_flops": 1e9,  # the rows' proportions vary: the fit tells a forward from the rest
            "run/rollout_evals": 1080.0,
            "run/flops": 2040e9,
        }
    )
    data = (run / "metrics.jsonl").read_bytes()
    assert row["raw_files"]["metrics.jsonl"] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    shutil.rmtree(tmp_path / "kept")  # the raw rows gone: the tables read the summary
    shutil.rmtree(run)
    assert TABLES.per_label({"runs": [row]}, "early/trained_edges") == {"tree": [5.0]}
    # the savings table: 0.825 of groups tied over the run (0.82 at two places), 9 images scored for 8 leaves
    # and 23% of its FLOPs went to tied rollouts: 1 / (1 - 464 / 2040) = 1.29x at most from removing every tie
    line = "| tree | 0.82 | 0.41 | 0.000 | 0.0 | 0.0 | 0.0% | 0.00 | 1.12 | 23% (1.29x) |"
    assert line in TABLES.savings_table({"runs": [row]})
    # a run kept before rows had tied_leaf_share: not a share of 0
    old = dict(row, metrics={k: v for k, v in row["metrics"].items() if "tied_" not in k})
    rows = [{k: v for k, v in r.items() if k != "tied_leaf_share"} for r in rows]
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    old["run_dir"] = str(run)
    assert "| tree | 0.82 | n/a | 0.000 |" in TABLES.savings_table({"runs": [old]})
    assert TABLES.savings_table({"runs": [old]}).splitlines()[-1].endswith("| 1.12 | n/a |")


def test_restored_raw_runs_are_checked_against_the_manifest(tmp_path):
    """bench/check_runs.py: a file with the manifest's sha256 and size passes; one changed or missing is named."""
    import hashlib

    check_runs = _bench("check_runs")
    check = check_runs.check
    (tmp_path / "w" / "a-seed0").mkdir(parents=True)
    (tmp_path / "w" / "a-seed0" / "metrics.jsonl").write_bytes(b'{"x": 1}\n')
    digest = hashlib.sha256(b'{"x": 1}\n').hexdigest()
    manifest = tmp_path / "m.tsv"
    manifest.write_text(
        f"path\tsha256\tbytes\nw/a-seed0/metrics.jsonl\t{digest}\t9\nw/a-seed0/eval.jsonl\t{digest}\t9\n"
    )
    assert check(tmp_path, manifest) == ["w/a-seed0/eval.jsonl: missing"]
    (tmp_path / "w" / "a-seed0" / "eval.jsonl").write_bytes(b'{"x": 2}\n')
    assert check(tmp_path, manifest) == ["w/a-seed0/eval.jsonl: differs (9 bytes, manifest 9)"]
    assert check(tmp_path, manifest, only="v") == []  # another study's files are not looked at
    (tmp_path / "w" / "a-seed0" / "run.json").write_bytes(b"{}")
    assert check_runs.unlisted(tmp_path, manifest, "w") == [
        f"w/a-seed0/run.json\t{hashlib.sha256(b'{}').hexdigest()}\t2"
    ]
    assert check_runs.add(tmp_path, manifest, "w") == 1 and check_runs.unlisted(tmp_path, manifest, "w") == []
    assert manifest.read_text().splitlines()[3].startswith("w/a-seed0/run.json\t")
    # every raw file a committed summary names is in the kept manifest with the summary's hash and size
    kept = ROOT / "bench" / "results" / "study-runs.tsv"
    assert kept.read_text().splitlines()[0] == "path\tsha256\tbytes"
    assert check_runs.summary_gaps(ROOT / "bench" / "results", kept) == []


def test_an_adaptive_sweep_reports_against_a_label_it_holds(tmp_path, monkeypatch):
    """The adaptive sweeps have no bare label: their report times against the baseline at the world's rate, so the
    sweep writes the results file the adaptive plans read their rates from (it used to find no dance-grpo and
    write nothing)."""
    import json
    import sys

    study = _bench("study")
    monkeypatch.setattr(study, "RESULTS", tmp_path)
    monkeypatch.setattr(study, "RUNS", tmp_path / "study-runs")
    done: list[tuple[str, int]] = []
    monkeypatch.setattr(study, "report", lambda rows, work, args: done.append((args.baseline, len(rows))))
    for plan, base in study.SWEEP_BASELINES.items():
        assert base in study.PLANS[plan] and "dance-grpo" not in study.PLANS[plan]
        done.clear()
        work = Path("w") / plan
        for label in study.PLANS[plan]:
            study.kept(work, label, 100).mkdir(parents=True)
            (study.kept(work, label, 100) / "summary.json").write_text(json.dumps({"label": label, "seed": 100}))
        argv = ["study.py", "--plan", plan, "--seeds", "100", "--report-only", "--work", str(tmp_path / work)]
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.chdir(tmp_path)
        study.main()
        assert done == [(base, len(study.PLANS[plan]))]


def test_tied_groups_over_training_are_the_seeds_mean_on_the_flop_axis():
    """Each run's zero_std_ratio by iteration, a moving mean over the window, at the iteration's end in TFLOPs;
    the label's curve is the mean of its seeds', up to where the shortest run ends (hand values)."""
    runs = [
        {"label": "a", "seed": 0, "metrics": {"tflops_per_iteration": 1.0}},
        {"label": "a", "seed": 1, "metrics": {"tflops_per_iteration": 1.0}},
        {"label": "b", "seed": 0, "metrics": {"tflops_per_iteration": 0.5}},
    ]
    curves = [
        {"label": "a", "seed": 0, "zero_std_curve": [[0, 0.0], [1, 1.0]]},  # smoothed: 0, 0.5 at 1, 2 TFLOPs
        {"label": "a", "seed": 1, "zero_std_curve": [[0, 0.5], [1, 0.5], [2, 0.5]]},  # 0.5 at 1, 2, 3
        {"label": "b", "seed": 0, "zero_std_curve": [[0, 1.0], [1, 0.0]]},  # 1, 0.5 at 0.5, 1
    ]
    got = TABLES.tied_curves({"runs": runs, "flops-raw": {"runs": curves}}, points=3)
    assert got["a"] == ([0.0, 1.0, 2.0], [0.25, 0.25, 0.5])
    assert got["b"] == ([0.0, 0.5, 1.0], [1.0, 1.0, 0.5])


def test_a_speedup_cell_tells_a_group_that_never_reaches_from_a_baseline_that_never_does():
    none = {"speedup": None, "speedup_low": None, "speedup_high": None}
    assert TABLES.speedup_cell({**none, "curve_to_target": None}) == "never"
    assert TABLES.speedup_cell({**none, "curve_to_target": 9.1}) == "baseline never"  # reached; the baseline not
    assert TABLES.speedup_cell({**none, "curve_to_target": 9.1, "speedup_above": 12 / 9.1}) == "> 1.32x"
    assert TABLES.speedup_cell({**none, "curve_minutes_to_target": 0.0}) == "at start"
    g = {"speedup": 1.5, "speedup_low": 0.0, "speedup_high": 2.25, "curve_to_target": 4.0}
    assert TABLES.speedup_cell(g) == "1.50x (never-2.25)"


def test_a_comparison_saved_without_the_lower_bound_gets_it_from_its_baseline_runs():
    cmp = {
        "target": 0.25,
        "baseline": "dance-grpo",
        "groups": [{"label": "dance-grpo", "curve_to_target": None}, {"label": "bmf", "curve_to_target": 4.0}],
        "runs": [
            {"label": "dance-grpo", "heldout_curve": [[0, 0.0], [10.0, 0.2]]},
            {"label": "dance-grpo", "heldout_curve": [[0, 0.0], [12.0, 0.1]]},  # the later end: 12 / 4
            {"label": "bmf", "heldout_curve": [[0, 0.0], [4.0, 0.3]]},
        ],
    }
    TABLES.fill_bounds(cmp)
    assert cmp["groups"][1]["speedup_above"] == 3.0 and "speedup_above" not in cmp["groups"][0]
    assert TABLES.speedup_cell({"speedup": None, **cmp["groups"][1]}) == "> 3.00x"


def test_the_flop_split_gives_every_run_the_plans_rollout_forward():
    """A run whose rollout and training evaluations keep one proportion cannot fit a forward's FLOPs alone; the
    plan's other runs (one model) can. Golden: a forward 2 GFLOPs; the fixed run spends 100 rollout forwards and
    50 training evaluations of 6 GFLOPs (forward, backward, one more forward) an iteration: 200 / 500 = 40% rollout,
    so free rollouts would make its iteration 1 / 0.6 = 1.67x cheaper."""
    fixed = {"run/rollout_forward_flops": float("nan"), "run/rollout_evals": 300.0, "run/flops": 1500e9}
    fixed |= {"tflops_per_iteration": 0.5}
    fitted = {"run/rollout_forward_flops": 2e9, "run/rollout_evals": 100.0, "run/flops": 800e9}
    fitted |= {"tflops_per_iteration": 0.8}
    result = {"runs": [{"label": "awm", "metrics": fixed}, {"label": "grpo", "metrics": fitted}]}
    assert TABLES.plan_forward_flops(result) == 2e9
    md = TABLES.flop_split_table(result)
    assert "| awm | 0.500 | 40% | 60% | 1.67x |" in md
    assert "| grpo | 0.800 | 25% | 75% | 1.33x |" in md
    # fits that disagree are not one model: no split rather than a wrong one
    other = dict(fitted, **{"run/rollout_forward_flops": 3e9})
    result["runs"].append({"label": "other", "metrics": other})
    assert TABLES.plan_forward_flops(result) != TABLES.plan_forward_flops(result)  # nan
    assert "no FLOP split" in TABLES.flop_split_table(result)


def test_a_kept_run_made_with_other_settings_is_not_taken_for_the_plans(tmp_path, monkeypatch):
    """A plan whose rate changed (a new sweep) names the same folder: the run kept there at the old rate is refused
    with a line naming it, not reported as the new rate's; a run with the plan's settings is taken as it is."""
    import json

    study = _bench("study")
    monkeypatch.setattr(study, "RUNS", tmp_path / "study-runs")
    work = tmp_path / "w"
    kept = study.kept(work, "nft", 0)
    kept.mkdir(parents=True)
    row = {"label": "nft", "preset": "nft", "sets": ["train.lr=1e-4"], "seed": 0, "run_dir": str(kept)}
    (kept / "summary.json").write_text(json.dumps(row))
    assert study.run_one("nft", "nft", ("train.lr=1e-4",), 0, work, (10, 1), print) == row
    with pytest.raises(RuntimeError, match=r"study-runs/w/nft-seed0 was trained as nft \['train.lr=1e-4'\]"):
        study.run_one("nft", "nft", ("train.lr=3e-4",), 0, work, (10, 1), print)


def test_the_2026_methods_and_their_baselines_each_train_at_their_swept_rate(tmp_path, monkeypatch):
    """Equal terms: nft and branch-mix-flow are swept beside the new methods, and the seeds plan runs every variant,
    the baselines included, at the rate whose trained weights gained most at seed 100."""
    import gzip
    import json

    study = _bench("study")
    sweep = study.PLANS["methods-2026-lr"]
    assert {k.split("@lr")[0] for k in sweep} == {
        "nft", "branch-mix-flow", "awm", "tree-awm", "dgpo", "tree-dgpo", "flow-grpo-guard"
    }  # fmt: skip
    assert sweep["nft@lr1e-3"] == ("nft", ("train.lr=1e-3",))
    runs = [
        {"label": f"{v}@lr{lr}", "seed": 100, "heldout": [{"reward_mean": 0.5}, {"reward_mean": 0.5 + g}]}
        for v, gains in (("nft", (0.1, 0.2, 0.4, 0.3)), ("awm", (0.1, 0.3, 0.2, 0.0)), ("tree-awm", (0, 0, 0.1, 0.2)))
        for lr, g in zip(("3e-5", "1e-4", "3e-4", "1e-3"), gains, strict=True)
    ]
    monkeypatch.setattr(study, "RESULTS", tmp_path)
    (tmp_path / "study-methods-2026-lr.json.gz").write_bytes(gzip.compress(json.dumps({"runs": runs}).encode()))
    plan = study.methods_2026_plan()
    assert plan["nft"] == ("nft", ("train.lr=3e-4",))
    assert plan["awm"] == ("awm", ("train.lr=1e-4",))
    assert plan["tree-dgpo"] == ("tree-dgpo", ("train.lr=1e-4",))  # not in this sweep: the world's rate
    assert list(plan)[:2] == ["nft", "branch-mix-flow"]
    # tree-awm away from awm's rate: awm at the tree's rate and the tree at awm's, as controls; tree-dgpo and dgpo
    # share a rate (neither swept): none
    assert plan["tree-awm"] == ("tree-awm", ("train.lr=1e-3",))
    assert plan["awm@lr1e-3"] == ("awm", ("train.lr=1e-3",))
    assert plan["tree-awm@lr1e-4"] == ("tree-awm", ("train.lr=1e-4",))
    assert [k for k in plan if "@" in k] == ["awm@lr1e-3", "tree-awm@lr1e-4"]
