"""`treegrpo compare`: golden numbers on hand-written run folders, the command end to end, two real tiny
runs, and the page as a headless browser draws it."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from clitools import one_line_error, run
from PIL import Image

from treegrpo_cli import plots
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.report import compare, compare_page

TINY = [
    "--set",
    'model="pixel-tiny"',
    "--iterations",
    2,
    "--set",
    "rollout.num_prompts=1",
    "--set",
    "train.eval_samples=1",
]


def row(it, wall, total, rollout, score, update, fwd, bwd, peak=None):
    r = {
        "iteration": it,
        "reward_mean": 0.0,
        "wall": wall,
        "rollout_evals_per_leaf": fwd,
        "train_evals_per_leaf": bwd,
        "seconds": {"rollout": rollout, "score": score, "update": update, "total": total},
    }
    return {**r, "peak_mib": peak} if peak is not None else r


def write_run(folder: Path, name: str, seed: int, metrics: list, evals: list, samples: tuple = (), **config) -> Path:
    """A run folder as `treegrpo train` writes it (config: more of run.json's settings); sample grids are grey
    (no palette colour in them)."""
    folder.mkdir(parents=True)
    info = {
        "format": "treegrpo-run",
        "version": 1,
        "command": "treegrpo train",
        "config": {"name": name, "seed": seed, "model": "pixel-tiny", **config},
    }
    (folder / "run.json").write_text(json.dumps(info))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (folder / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    for step in samples:
        (folder / "samples").mkdir(exist_ok=True)
        Image.new("RGB", (24, 16), (90 + step, 90 + step, 90 + step)).save(folder / "samples" / f"step-{step}.png")
    return folder


@pytest.fixture
def runs(tmp_path):
    """Two flow-grpo seeds (the baseline) and two tree-grpo seeds; the numbers in the comments are by hand."""
    a1 = write_run(
        tmp_path / "a1",
        "flow-grpo",
        0,
        [
            row(0, 50, 50, 30, 5, 15, 10, 4, 100),
            row(1, 120, 70, 50, 5, 15, 10, 4, 200),
            row(2, 180, 60, 40, 5, 15, 10, 4, 150),
            row(3, 240, 60, 40, 5, 15, 10, 4, 120),
        ],
        # no "wall": iteration 2 -> metrics row 1 (120 s = 2 min), iteration 4 -> row 3 (4 min)
        [
            {"iteration": 0, "reward_mean": 0.2},
            {"iteration": 2, "reward_mean": 0.4},
            {"iteration": 4, "reward_mean": 0.6},
        ],
        samples=(0, 4),
    )
    a2 = write_run(
        tmp_path / "a2",
        "flow-grpo",
        1,
        [row(i, 75 * (i + 1), 75, 50, 5, 20, 10, 4) for i in range(4)],
        [
            {"iteration": 0, "reward_mean": 0.2, "wall": 0.0},
            {"iteration": 2, "reward_mean": 0.3, "wall": 150},
            {"iteration": 4, "reward_mean": 0.5, "wall": 300},
        ],
    )
    b1 = write_run(
        tmp_path / "b1",
        "tree-grpo",
        0,
        [row(0, 30, 30, 20, 2, 8, 20, 6, 300), row(1, 60, 30, 20, 2, 8, 20, 6, 400)],
        [{"iteration": 0, "reward_mean": 0.2}, {"iteration": 2, "reward_mean": 0.7}],
        samples=(2,),
    )
    b2 = write_run(
        tmp_path / "b2",
        "tree-grpo",
        1,
        [row(0, 30, 30, 20, 2, 8, 20, 6, 500), row(1, 60, 30, 20, 2, 8, 20, 6)],
        [
            {"iteration": 0, "reward_mean": 0.3},
            {"iteration": 1, "reward_mean": 0.45},
            {"iteration": 2, "reward_mean": 0.65},
        ],
        samples=(0, 2, 10),
    )
    return [a1, a2, b1, b2]


# --- the library -------------------------------------------------------------------------------


def test_time_to_target_interpolates_and_needs_the_curve_to_stay():
    curve = [(0.0, 0.2), (2.0, 0.4), (4.0, 0.6)]
    assert compare.time_to_target(curve, 0.55) == pytest.approx(3.5)
    assert compare.time_to_target(curve, 0.4) == pytest.approx(2.0)  # reached exactly at a point
    assert compare.time_to_target(curve, 0.1) == 0.0  # already there before training
    assert compare.time_to_target(curve, 0.61) is None
    assert compare.time_to_target([], 0.0) is None
    # from the last upward crossing on: a touch of the target that falls back does not count
    assert compare.time_to_target([(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)], 0.5) == pytest.approx(2.5)
    assert compare.time_to_target([(0, 0.0), (1, 1.0), (2, 0.0)], 0.5) is None


def test_heldout_curve_takes_the_wall_of_the_iteration_before():
    metrics = [{"iteration": 0, "wall": 30.0}, {"iteration": 1, "wall": 90.0}]
    evals = [
        {"iteration": 5, "reward_mean": 0.3},
        {"iteration": 0, "reward_mean": 0.1},
        {"iteration": 1, "reward_mean": 0.2},
        {"iteration": 2, "reward_mean": 0.25, "wall": 600.0},
    ]
    # iteration 0 -> 0; 1 -> row 0 (0.5 min); 2 has its own wall (10 min); 5 -> row 1, the latest there is (1.5 min)
    assert compare.heldout_curve(metrics, evals) == [(0.0, 0.1), (0.5, 0.2), (10.0, 0.25), (1.5, 0.3)]


def test_mean_band_on_a_common_grid():
    c1, c2 = [(0.0, 0.0), (2.0, 1.0)], [(0.0, 1.0), (1.0, 1.0), (3.0, 3.0)]
    grid = compare_page.common_grid([c1, c2], points=3)
    assert grid == [0.0, 1.0, 2.0]  # the span both curves cover
    x, mean, low, high = compare_page.mean_band([c1, c2], grid)
    assert mean == pytest.approx([0.5, 0.75, 1.5])
    assert low == pytest.approx([0.0, 0.5, 1.0]) and high == pytest.approx([1.0, 1.0, 2.0])
    assert compare_page.common_grid([[(0.0, 1.0)]]) == [0.0]
    assert compare_page.common_grid([[(0.0, 1.0), (1.0, 1.0)], [(2.0, 1.0), (3.0, 1.0)]]) == []


def test_stat_is_the_sample_std_and_zero_for_one():
    assert compare.stat([1.0, None, 3.0]) == compare.Stat(2.0, pytest.approx(1.41421356), 2)
    assert compare.stat([5.0]) == compare.Stat(5.0, 0.0, 1)
    assert compare.stat([None]) == compare.Stat(None, None, 0)


def test_runs_and_groups_golden(runs):
    cmp = compare.compare_runs(runs, baseline="flow-grpo")
    assert cmp.target == pytest.approx(0.55)  # (0.6 + 0.5) / 2
    a1, a2, b1, b2 = cmp.runs
    assert a1.heldout_curve == [(0.0, 0.2), (2.0, 0.4), (4.0, 0.6)]
    assert a2.heldout_curve == [(0.0, 0.2), (2.5, 0.3), (5.0, 0.5)]
    assert (a1.final_heldout, a1.gain, a1.iterations) == (0.6, pytest.approx(0.4), 4)
    assert a1.seconds_per_iteration == 60 and a1.phase_seconds == {"rollout": 40, "score": 5, "update": 15}
    assert (a1.forward_nfe_per_sample, a1.backward_nfe_per_sample, a1.peak_mib) == (10, 4, 200)
    assert a2.peak_mib is None
    assert a1.to_target == pytest.approx(3.5) and a2.to_target is None
    assert b1.to_target == pytest.approx(0.7) and b2.to_target == pytest.approx(0.75)
    assert Path(b2.sample_grid).name == "step-10.png" and a2.sample_grid is None
    flow, tree = cmp.groups
    assert (flow.label, flow.seeds, tree.label, tree.seeds) == ("flow-grpo", [0, 1], "tree-grpo", [0, 1])
    assert flow.final_heldout == compare.Stat(pytest.approx(0.55), pytest.approx(0.070710678), 2)
    assert flow.seconds_per_iteration == compare.Stat(67.5, pytest.approx(10.60660172), 2)
    assert flow.phase_seconds["rollout"] == compare.Stat(45.0, pytest.approx(7.07106781), 2)
    assert flow.peak_mib == compare.Stat(200.0, 0.0, 1)
    assert flow.to_target == compare.Stat(pytest.approx(3.5), 0.0, 1) and flow.reached_target == 1
    # mean curve at the union of the points, a1 held at 0.6 after 4 min: 0.2, 0.34, 0.375, 0.51, 0.55 at 0 2 2.5 4 5
    assert flow.curve_to_target == pytest.approx(5.0)
    assert flow.speedup == 1.0 and flow.speedup_low is None  # no interval against itself
    assert tree.final_heldout == compare.Stat(pytest.approx(0.675), pytest.approx(0.035355339), 2)
    assert tree.peak_mib == compare.Stat(450.0, pytest.approx(70.71067812), 2)
    assert tree.to_target == compare.Stat(pytest.approx(0.725), pytest.approx(0.035355339), 2)
    # mean curve 0.25, 0.45, 0.675 at 0, 0.5, 1 min: 0.55 at 0.5 + 0.1 / 0.225 x 0.5 = 0.7222
    assert tree.curve_to_target == pytest.approx(0.72222222)
    assert tree.speedup == pytest.approx(6.92307692)  # 5 / 0.7222
    # seeds drawn again, 4 x 4 draws: flow {a1,a1} target 0.6 at 4 min, {a2,a2} 0.5 at 5, {a1,a2} twice 0.55 at 5;
    # tree {b1,b1} (0, .2)-(1, .7), {b2,b2} (0, .3)-(.5, .45)-(1, .65), {b1,b2} twice (0, .25)-(.5, .45)-(1, .675).
    # Slowest: target 0.6, {b2,b2} at 0.875 min: 4 / 0.875; fastest: target 0.5, {b1,b1} at 0.6 min: 5 / 0.6
    assert (tree.speedup_low, tree.speedup_high, tree.speedup_reach) == (
        pytest.approx(32 / 7),
        pytest.approx(25 / 3),
        1.0,
    )


def test_speedup_interval_counts_draws_that_never_reach_the_target():
    # gains along straight lines. Baseline seeds end at 0.4 and 0.2 at 4 min: a draw's target is its mean end,
    # reached at 4 min in every draw. Group seeds end at 0.4 and 0.2 at 2 min. Of the 16 draws (by hand):
    # target 0.4 (4 draws): {g1,g1} 2 min -> 2x, the 3 others never; target 0.2 (4): 1, 2, 1.33 min ->
    # 4x, 2x, 3x, 3x; target 0.3 (8): {g1,g1} 1.5 min 2.67x twice, {g2,g2} never twice, {g1,g2} 2 min 2x four times.
    # Sorted: never x5, 2x x6, 2.67x x2, 3x x2, 4x; 11 of 16 reach it.
    base = [[(0.0, 0.0), (4.0, 0.4)], [(0.0, 0.0), (4.0, 0.2)]]
    group = [[(0.0, 0.0), (2.0, 0.4)], [(0.0, 0.0), (2.0, 0.2)]]
    assert len(compare.seed_draws(2, 2)) == 16
    assert compare.speedup_interval(base, group, None) == (0.0, pytest.approx(4.0), 11 / 16)
    # a fixed target: draws whose baseline never reaches it have no ratio; here 0.3 is reached by {b1,b1}
    # (3 min) and {b1,b2} (4 min, twice), the group's {g1,g1} at 1.5, {g1,g2} at 2, {g2,g2} never
    low, high, reach = compare.speedup_interval(base, group, 0.3)
    assert (low, high, reach) == (0.0, pytest.approx(4 / 1.5), 9 / 12)
    assert compare.speedup_interval(base, group, 0.5) is None  # no baseline draw gets there
    assert compare_page.speedup_text(2.476, 0.0, 3.1) == "2.48x (never-3.10)"
    assert compare_page.speedup_text(None, 0.0, 1.2, none="never reaches it") == "never reaches it (never-1.20)"
    assert compare_page.speedup_text(None, 0.0, 0.0, none="never") == "never"
    assert compare_page.speedup_text(None, None, None) == "-"
    assert compare_page.speedup_cell(None, None, None, None) == "-"  # the time-to-target column says never
    assert compare_page.speedup_cell(None, None, None, 9.1) == "baseline never"
    assert compare_page.speedup_cell(None, None, None, 0.0) == "at start"


def test_a_group_without_heldout_evaluations_has_no_speedup_interval(runs, tmp_path):
    quiet = write_run(tmp_path / "c1", "branch", 0, [row(0, 30, 30, 20, 2, 8, 12, 6)], [])
    cmp = compare.compare_runs([*runs, quiet], baseline="flow-grpo")
    branch = cmp.groups[-1]
    assert branch.label == "branch" and branch.curve_to_target is None
    assert (branch.speedup, branch.speedup_low, branch.speedup_high, branch.speedup_reach) == (None,) * 4


def test_seed_draws_are_all_of_them_when_few_and_fixed_when_many():
    assert len(compare.seed_draws(3, 3)) == 27 * 27 and len(set(compare.seed_draws(3, 3))) == 27 * 27
    many = compare.seed_draws(5, 4)
    assert len(many) == compare.RESAMPLES and many == compare.seed_draws(5, 4)
    assert all(len(b) == 5 and len(g) == 4 and max(b) < 5 and max(g) < 4 for b, g in many)


def test_a_given_target_without_baseline_has_no_ratios(runs):
    cmp = compare.compare_runs(runs, labels=["x", "x", "y", "y"], target=0.45)
    assert [r.to_target for r in cmp.runs] == pytest.approx([2.5, 4.375, 0.5, 0.5])
    x, y = cmp.groups
    assert x.to_target == compare.Stat(pytest.approx(3.4375), pytest.approx(1.32582521), 2)
    assert y.speedup is None and cmp.baseline is None


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"labels": ["x"]}, "--label was given 1 times for 4 runs"),
        ({"labels": ["x", "", "y", "y"]}, "--label must not be empty"),
        ({"baseline": "grpo"}, "--baseline 'grpo' is none of the runs' labels (flow-grpo, tree-grpo)"),
        ({"target": float("nan")}, "--target must be a finite number"),
    ],
)
def test_refused(runs, kwargs, needle):
    with pytest.raises(compare.TreegrpoError, match=re.escape(needle)):
        compare.compare_runs(runs, **kwargs)


def test_not_a_run_no_metrics_and_twice(runs, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(compare.TreegrpoError, match="not a treegrpo run folder"):
        compare.compare_runs([tmp_path / "empty"])
    (runs[0] / "metrics.jsonl").write_text("")
    with pytest.raises(compare.TreegrpoError, match="no iterations in metrics.jsonl"):
        compare.compare_runs(runs)
    with pytest.raises(compare.TreegrpoError, match="given twice"):
        compare.compare_runs([runs[1], runs[1]])


# --- the command -------------------------------------------------------------------------------


def test_cli_json_and_files(runs, tmp_path):
    out = tmp_path / "cmp"
    r = run("compare", *runs, "--baseline", "flow-grpo", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(data) == {
        "target",
        "baseline",
        "measure",
        "groups",
        "runs",
        "files",
        "axis",
        "unit",
        "weights",
        "warnings",
    }
    assert data["warnings"] == [] and data["runs"][0]["model"] == "pixel-tiny"
    assert data["axis"] == "time" and data["unit"] == "wall-clock minutes"
    assert data == json.loads((out / "compare.json").read_text())
    assert data["baseline"] == "flow-grpo" and data["measure"] == "reward" and data["target"] == pytest.approx(0.55)
    tree = data["groups"][1]
    assert tree["speedup"] == pytest.approx(6.92307692) and tree["reached_target"] == 2
    assert tree["to_target"]["mean"] == pytest.approx(0.725)
    assert data["runs"][0]["heldout_curve"] == [[0.0, 0.2], [2.0, 0.4], [4.0, 0.6]]
    names = {"compare.json", "index.html", "reward_vs_time.png", "pareto.png"}
    assert {Path(f).name for f in data["files"]} == names == {p.name for p in out.iterdir()}
    page = (out / "index.html").read_text()
    srcs = re.findall(r'src="([^"]*)"', page)
    assert len(srcs) == 2 + 3 and all(s.startswith("data:image/png;base64,") for s in srcs)  # 2 plots, 3 grids
    assert not re.search(r"<script|<link|https?:|url\(", page)
    assert "no sample grid" in page and "tree-grpo · seed 1 · b2 · step-10.png" in page


def test_cli_table(runs, tmp_path):
    r = run(
        "compare",
        *runs,
        "--label",
        "x",
        "--label",
        "x",
        "--label",
        "y",
        "--label",
        "y",
        "--target",
        0.45,
        "--baseline",
        "x",
        "--out",
        tmp_path / "cmp",
    )
    assert r.exit_code == 0, r.output
    # x's mean curve crosses 0.45 between (2.5, 0.375) and (4, 0.51): 3.333; y's between (0, 0.25) and (0.5, 0.45)
    assert "x" in r.stdout and "to target" in r.stdout and "3.33 (2/2)" in r.stdout
    assert "6.67x" in r.stdout  # 3.333 / 0.5
    assert "wrote" in r.stderr and "index.html" in r.stderr


def test_cli_without_out_prints_the_table_and_writes_nothing(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    r = run("compare", *runs, "--label", "x", "--label", "x", "--label", "y", "--label", "y", "--target", 0.45)
    assert r.exit_code == 0, r.output
    assert "3.33 (2/2)" in r.stdout and "wrote" not in r.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_cli_bad_input(runs, tmp_path):
    one_line_error(run("compare", tmp_path, "--out", tmp_path / "c"), "run.json")
    one_line_error(run("compare", *runs, "--label", "x", "--out", tmp_path / "c"), "--label")
    one_line_error(run("compare", *runs, "--baseline", "nope", "--out", tmp_path / "c"), "--baseline", "nope")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_two_real_tiny_runs(tmp_path):
    for preset in ("flow-grpo", "tree-grpo"):
        r = run("train", "--preset", preset, *TINY, "--run-dir", tmp_path / preset)
        assert r.exit_code == 0, r.output
    r = run(
        "compare",
        tmp_path / "flow-grpo",
        tmp_path / "tree-grpo",
        "--baseline",
        "flow-grpo",
        "--out",
        tmp_path / "cmp",
        "--json",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [g["label"] for g in data["groups"]] == ["flow-grpo", "tree-grpo"]
    flow = data["runs"][0]
    metrics = [json.loads(line) for line in (tmp_path / "flow-grpo" / "metrics.jsonl").read_text().splitlines()]
    assert flow["iterations"] == 2 and len(flow["heldout_curve"]) == 2 and flow["heldout_curve"][0][0] == 0.0
    assert flow["forward_nfe_per_sample"] == pytest.approx(sum(m["rollout_evals_per_leaf"] for m in metrics) / 2)
    assert flow["to_target"] is not None  # the target is its own final reward
    assert data["groups"][0]["speedup"] in (None, pytest.approx(1.0))  # None: at the target before training
    assert Path(flow["sample_grid"]).name == "step-2.png"
    assert (tmp_path / "cmp" / "index.html").stat().st_size > 1000
    for axis in ("flops", "iterations"):  # the same runs on the compute axes
        r = run(
            "compare", tmp_path / "flow-grpo", tmp_path / "tree-grpo", "--x", axis, "--out", tmp_path / axis, "--json"
        )
        assert r.exit_code == 0, r.output
        data = json.loads(r.stdout)
        assert data["axis"] == axis and (tmp_path / axis / f"reward_vs_{axis}.png").is_file()
        for one in data["runs"]:
            folder = Path(one["folder"])
            rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            evals = [json.loads(line) for line in (folder / "eval.jsonl").read_text().splitlines()]
            assert sum(m["flops"] for m in rows) == rows[-1]["flops_total"] == evals[-1]["flops_total"] > 0
            want = [0.0, rows[-1]["flops_total"] / 1e12] if axis == "flops" else [0.0, 2.0]
            assert [x for x, _ in one["heldout_curve"]] == pytest.approx(want)
    r = run("compare", tmp_path / "flow-grpo", tmp_path / "tree-grpo", "--raw", "--out", tmp_path / "raw", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)  # flow-grpo keeps an EMA: --raw reads its trained weights' figures
    evals = [json.loads(line) for line in (tmp_path / "flow-grpo" / "eval.jsonl").read_text().splitlines()]
    assert data["weights"] == "raw" and [y for _, y in data["runs"][0]["heldout_curve"]] == [
        e["raw/reward_mean"] for e in evals
    ]
    r = run("compare", tmp_path / "flow-grpo", "--x", "watts", "--out", tmp_path / "bad")
    assert r.exit_code != 0 and "--x must be one of time, flops, iterations" in r.output


# --- the page in a browser ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_page_draws_its_plots_in_a_headless_browser(runs, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "no chromium on PATH: install Debian's chromium package (apt-get install chromium) to run the browser check"
        )
    compare_page.write_report(compare.compare_runs(runs, baseline="flow-grpo"), tmp_path / "cmp")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,2000",
            (tmp_path / "cmp" / "index.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    assert pixels.shape[:2] == (2000, 1200)
    assert (np.abs(pixels - 255).sum(-1) > 30).mean() > 0.02  # not a blank page
    for colour in plots.PALETTE[:2]:  # both groups' lines (the grids are grey)
        near = (np.abs(pixels - np.array(colour)).max(-1) <= 3).sum()
        assert near > 50, (colour, near)


def test_gain_times_each_run_from_its_own_start(runs):
    # flow-grpo gains 0.4 and 0.3 (target 0.35); tree-grpo b2 starts at 0.3: it reaches +0.35 at its end only
    cmp = compare.compare_runs(runs, baseline="flow-grpo", gain=True)
    assert cmp.measure == "gain" and cmp.target == pytest.approx(0.35)
    a1, a2, b1, b2 = cmp.runs
    assert a1.to_target == pytest.approx(3.5)  # 0.2 + 0.35 = 0.55, as before
    assert a2.to_target is None  # 0.3 of gain: never
    assert b1.to_target == pytest.approx(0.7)
    assert b2.to_target == pytest.approx(1.0)  # 0.65 - 0.3 = 0.35 at its last point
    flow, tree = cmp.groups
    # gain curves: flow's mean 0, 0.14, 0.175, 0.31, 0.35 at 0 2 2.5 4 5; tree's 0, 0.2, 0.425 at 0 0.5 1
    assert flow.curve_to_target == pytest.approx(5.0)
    assert tree.curve_to_target == pytest.approx(0.5 + 0.15 / 0.225 * 0.5)
    assert tree.speedup == pytest.approx(6.0) and tree.speedup_low < 6.0 < tree.speedup_high
    r = run("compare", *runs, "--baseline", "flow-grpo", "--gain", "--out", runs[0].parent / "g", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["measure"] == "gain"


def test_a_baseline_that_never_reaches_a_fixed_target_gives_a_lower_bound(runs):
    # flow-grpo's mean gain curve ends at 5 min on +0.35: +0.4 is beyond its runs; tree-grpo's (0, 0.2, 0.425 at
    # 0, 0.5, 1) crosses +0.4 at 0.5 + 0.2 / 0.225 * 0.5 min, so its speed-up is more than 5 over that
    cmp = compare.compare_runs(runs, baseline="flow-grpo", gain=True, target=0.4)
    flow, tree = cmp.groups
    assert flow.curve_to_target is None and flow.speedup_above is None and tree.speedup is None
    assert tree.speedup_above == pytest.approx(5.0 / (0.5 + 0.2 / 0.225 * 0.5))
    assert compare_page.table_rows(cmp)[1][5] == "> 5.29x"
    reached = compare.compare_runs(runs, baseline="flow-grpo", gain=True, target=0.3)
    assert all(g.speedup_above is None for g in reached.groups)  # the baseline reaches +0.3: a ratio, no bound


def test_the_flops_axis_refuses_runs_that_did_not_count_them(runs):
    """The fixture's runs are written without `flops_total` (an older treegrpo): one line, no zero axis."""
    with pytest.raises(compare.TreegrpoError, match="no flops_total"):
        compare.compare_runs(runs, axis="flops")
    assert compare.compare_runs(runs, axis="iterations").axis == "iterations"


# --- groups are what was run -------------------------------------------------------------------


def two(tmp_path, first: dict, second: dict, seeds=(0, 1), names=("tree-grpo", "tree-grpo")):
    rows = [row(0, 30, 30, 20, 2, 8, 20, 6), row(1, 60, 30, 20, 2, 8, 20, 6)]
    evals = [{"iteration": 0, "reward_mean": 0.2}, {"iteration": 2, "reward_mean": 0.5}]
    return [
        write_run(tmp_path / "r1", names[0], seeds[0], rows, evals, **first),
        write_run(tmp_path / "r2", names[1], seeds[1], rows, evals, **second),
    ]


def test_one_label_over_different_models_and_rewards_is_refused(tmp_path):
    runs = two(
        tmp_path,
        {"model": "tiny-shapes", "reward": {"names": ["shapes"]}},
        {"model": "pixel-tiny", "reward": {"names": ["jpeg-compressibility"]}},
        seeds=(0, 0),
    )
    r = run("compare", *runs, "--label", "x", "--label", "x", "--out", tmp_path / "c")
    one_line_error(r, "labelled 'x'", "model", '"tiny-shapes"', '"pixel-tiny"', "reward.names", "--label")
    assert not (tmp_path / "c").exists()


def test_default_labels_split_a_preset_where_its_settings_differ(tmp_path):
    runs = two(tmp_path, {"train": {"lr": 1e-4}}, {"train": {"lr": 3e-5, "iterations": 7}})
    cmp = compare.compare_runs(runs)
    assert [g.label for g in cmp.groups] == ["tree-grpo (train.lr=0.0001)", "tree-grpo (train.lr=3e-05)"]
    # settings that agree on the three keys a label shows but differ further get a number
    third = write_run(
        tmp_path / "r3",
        "tree-grpo",
        2,
        [row(0, 30, 30, 20, 2, 8, 20, 6)],
        [],
        advantage={"clamp": 3.0},
        sampler={"eta": 0.5},
        train={"clip_range": 0.01},
    )
    labels = [g.label for g in compare.compare_runs([*runs, third]).groups]
    assert len(set(labels)) == 3 and labels[0].endswith(", ...)") and labels[1] == labels[0] + " #2", labels
    # the seed, the name and how long a run ran are not what was run: one group
    runs = two(tmp_path / "b", {"train": {"iterations": 3}}, {"train": {"iterations": 9}}, names=("a", "b"))
    cmp = compare.compare_runs(runs, labels=["same", "same"])
    assert [(g.label, g.seeds) for g in cmp.groups] == [("same", [0, 1])] and cmp.warnings == []


def test_keys_a_switch_leaves_without_effect_are_not_what_was_run(tmp_path):
    """tree.stop_tol with tree.dynamic off, a split kind's unused keys: the same run. Once the switch is on, a
    differing tolerance is a different run."""
    off = {"tree": {"dynamic": "off", "stop_tol": 0.1}, "splits": {"kind": "static", "kappa": 4.0}}
    runs = two(tmp_path, off, {"tree": {"dynamic": "off", "stop_tol": 0.0}})
    assert [g.seeds for g in compare.compare_runs(runs, labels=["fixed", "fixed"]).groups] == [[0, 1]]
    tree = {"dynamic": "distance", "split_steps": [0, 3], "branch": 2}
    runs = two(tmp_path / "b", {"tree": {**tree, "stop_tol": 0.1}}, {"tree": tree})
    with pytest.raises(ConfigError, match="tree.stop_tol 0.1 in"):
        compare.compare_runs(runs, labels=["dynamic", "dynamic"])


def test_different_rewards_are_refused_unless_asked(tmp_path):
    runs = two(tmp_path, {"reward": {"names": ["shapes"]}}, {"reward": {"names": ["jpeg-compressibility"]}})
    r = run("compare", *runs, "--label", "a", "--label", "b", "--out", tmp_path / "c")
    one_line_error(r, "different rewards", "shapes:", "jpeg-compressibility:", "--allow-mixed-rewards")
    r = run("compare", *runs, "--label", "a", "--label", "b", "--allow-mixed-rewards", "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["runs"][1]["rewards"] == ["jpeg-compressibility"]


def test_a_repeated_seed_in_a_group_is_a_warning(tmp_path):
    runs = two(tmp_path, {}, {}, seeds=(0, 0))
    r = run("compare", *runs, "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "group 'tree-grpo' has seed 0 in 2 runs" in warnings[0]
    assert str(runs[0]) in warnings[0] and str(runs[1]) in warnings[0]
    assert "has seed 0 in 2 runs" in (tmp_path / "c" / "index.html").read_text()


def test_zero_std_ratio_over_training_is_a_plot_on_the_page(runs, tmp_path):
    path = runs[2] / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "zero_std_ratio": 0.5 * i}) + "\n" for i, r in enumerate(rows)))
    cmp = compare.compare_runs(runs)
    assert cmp.runs[2].zero_std_curve == [(0.0, 0.0), (1.0, 0.5)] and cmp.runs[0].zero_std_curve == []
    compare_page.write_report(cmp, tmp_path / "cmp")
    image = Image.open(tmp_path / "cmp" / "zero_std.png").convert("RGB")
    assert plots.PALETTE[0] in {c for _, c in image.getcolors(1 << 20)}
    assert len(re.findall(r'src="data:image/png', (tmp_path / "cmp" / "index.html").read_text())) == 3 + 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # runs that do not log it: no plot, none left over
    compare_page.write_report(compare.compare_runs(runs), tmp_path / "cmp")
    assert not (tmp_path / "cmp" / "zero_std.png").exists()
