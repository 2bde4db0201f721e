"""The reward-hacking guard: drift from the base and the rules on synthetic evaluation streams, monitors in
eval.jsonl, `stop` with its exit status and a resumable checkpoint, RUN/best through rotation and resume, a resumed
guarded run equal to the uninterrupted one, and the refusals."""

import json
import math

import pytest
from clitools import one_line_error, run

from treegrpo_cli.config.guard import GUARD_EXIT, GuardConfig
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.store.checkpoint import list_checkpoints
from treegrpo_cli.training.guard import drift_fields, is_best, judge
from treegrpo_cli.training.runlog import read_evals, read_metrics, without_timings

BASE = {  # an evaluation of 10 prompts x 4 images at iteration 0
    "iteration": 0,
    "reward_mean": 0.30,
    "reward_sem": 0.01,  # spread over the 40 images: 0.01 x sqrt(40) = 0.0632
    "prompts": 10,
    "samples": 4,
    "monitor/jpeg_kb": 2.0,
    "monitor/jpeg_kb/std": 0.25,
    "monitor/dark_fraction": 0.0,
    "monitor/dark_fraction/std": 0.0,
    "monitor/gold/pick": 21.0,
    "monitor/gold/pick/std": 0.4,
    "monitor/diversity/within": 8.0,
    "monitor/diversity/across": 10.0,
}


def later(**changes):
    row = {**BASE, "iteration": 20, **changes}
    return {**row, **drift_fields(row, BASE)}


def test_drift_is_in_base_spreads_and_diversity_a_share():
    row = later(**{"monitor/jpeg_kb": 1.5, "monitor/gold/pick": 20.8, "monitor/diversity/within": 2.0})
    assert row["drift/jpeg_kb"] == pytest.approx(-2.0)  # (1.5 - 2.0) / 0.25
    assert row["drift/gold/pick"] == pytest.approx(-0.5)  # (20.8 - 21.0) / 0.4
    assert row["drift/diversity/within"] == pytest.approx(0.25)
    assert row["drift/diversity/across"] == pytest.approx(1.0)
    assert row["drift/reward"] == pytest.approx(0.0)
    moved = later(reward_mean=0.30 + 0.0632456)
    assert moved["drift/reward"] == pytest.approx(1.0, rel=1e-4)
    flat = later(**{"monitor/dark_fraction": 0.25})  # the base had no dark pixels at all: the raw difference
    assert flat["drift/dark_fraction"] == pytest.approx(0.25)


def test_a_healthy_stream_fires_nothing():
    cfg = GuardConfig(rewards=("pick",))
    for step in range(1, 11):  # the trained reward climbs, gold and statistics wander a little
        row = later(
            reward_mean=0.30 + 0.02 * step,
            **{
                "monitor/jpeg_kb": 2.0 + 0.05 * math.sin(step),
                "monitor/gold/pick": 21.0 + 0.1 * math.cos(step),
                "monitor/diversity/within": 8.0 - 0.2 * step,
            },
        )
        assert judge(cfg, row) == [], step


def test_the_gold_rule_fires_only_while_the_trained_reward_rises():
    cfg = GuardConfig(rewards=("pick",), gold_drop=0.5)
    falling_gold = {"monitor/gold/pick": 21.0 - 0.4 * 0.6}  # 0.6 base spreads down
    assert [r for r, _ in judge(cfg, later(reward_mean=0.35, **falling_gold))] == ["gold:pick"]
    assert judge(cfg, later(reward_mean=0.29, **falling_gold)) == []  # both fell: no hacking, a bad run
    assert judge(cfg, later(reward_mean=0.35, **{"monitor/gold/pick": 21.0 - 0.4 * 0.4})) == []
    assert judge(GuardConfig(rewards=("pick",), gold_drop=0), later(reward_mean=0.35, **falling_gold)) == []


def test_the_statistic_rule_fires_either_way_past_k_spreads():
    cfg = GuardConfig(stat_sigmas=3.0)
    assert [r for r, _ in judge(cfg, later(**{"monitor/jpeg_kb": 2.0 - 0.25 * 3.2}))] == ["stat:jpeg_kb"]
    up = judge(cfg, later(**{"monitor/jpeg_kb": 2.0 + 0.25 * 3.2}))
    assert [r for r, _ in up] == ["stat:jpeg_kb"] and "above the base" in up[0][1]
    assert judge(cfg, later(**{"monitor/jpeg_kb": 2.0 - 0.25 * 2.8})) == []


def test_the_diversity_rule_fires_below_its_share():
    cfg = GuardConfig(diversity_share=0.5)
    assert [r for r, _ in judge(cfg, later(**{"monitor/diversity/within": 3.9}))] == ["diversity"]
    assert judge(cfg, later(**{"monitor/diversity/within": 4.1})) == []


def test_best_is_strictly_better_than_every_earlier_evaluation():
    rows = [{"reward_mean": 0.1, "monitor/gold/pick": 21.0}, {"reward_mean": 0.3, "monitor/gold/pick": 20.0}]
    assert is_best({"reward_mean": 0.4}, rows, "reward")
    assert not is_best({"reward_mean": 0.3}, rows, "reward")  # the first of equals stays
    assert is_best({"monitor/gold/pick": 21.5}, rows, "pick")
    assert not is_best({"monitor/gold/pick": 20.5}, rows, "pick")
    assert is_best({"reward_mean": 0.0}, [], "reward")  # the base is the best of one
    assert not is_best({"reward_mean": 1.0}, rows, "")


def test_config_checks():
    with pytest.raises(ConfigError, match="the run trains on 'shapes'"):
        GuardConfig(rewards=("shapes",)).validate(("shapes",))
    with pytest.raises(ConfigError, match="guard.action"):
        GuardConfig(action="halt").validate()
    with pytest.raises(ConfigError, match="guard.best"):
        GuardConfig(best="pick").validate()
    with pytest.raises(ConfigError, match="stat_sigmas"):
        GuardConfig(stat_sigmas=-1).validate()
    assert GuardConfig(rewards=("pick", "hps")).best_monitor() == "pick"
    assert GuardConfig().best_monitor() == ""


TINY = ["--preset", "tree-grpo", "--set", 'model="pixel-tiny"', "--set", "train.sample_every=0"]
WATCHED = [*TINY, "--reward", "jpeg-compressibility", "--monitor", "shapes", "--set", "train.eval_every=1"]


def test_monitors_on_a_reward_the_run_trains_on_are_refused_in_one_line(tmp_path):
    r = run("train", *TINY, "--reward", "shapes,jpeg-compressibility", "--monitor", "shapes", "--out", tmp_path / "r")
    one_line_error(r, "guard.rewards", "trains on 'shapes'")
    assert r.exit_code == 2 and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_monitors_land_in_eval_jsonl_and_the_iteration_lines_flag_a_fired_rule(tmp_path):
    out = tmp_path / "r"
    r = run("train", *WATCHED, "--iterations", 2, "--set", "guard.stat_sigmas=1e-6", "--out", out)
    assert r.exit_code == 0, r.output
    first, *rest = read_evals(out)
    assert {"monitor/jpeg_kb", "monitor/gold/shapes", "monitor/diversity/within"} <= set(first)
    assert not any(k.startswith("drift/") for k in first)  # the base
    assert all("drift/jpeg_kb" in e and e["guard/fired"] for e in rest)
    assert first["monitor/jpeg_kb"] == pytest.approx(-first["reward_mean"], rel=1e-5)  # the reward is -kB
    rows = read_metrics(out)
    assert "guard" not in rows[0] and rows[1]["guard"] == rest[0]["guard/fired"]  # flagged after it fired
    assert "GUARD: stat:" in r.stderr and "guard (warn) at iteration 1" in r.stderr


@pytest.mark.slow
def test_stop_exits_with_its_code_after_a_checkpoint_and_resumes(tmp_path):
    out = tmp_path / "r"
    stop = ["--set", "guard.stat_sigmas=1e-6", "--set", 'guard.action="stop"', "--set", "train.save_every=10"]
    r = run("train", *WATCHED, *stop, "--iterations", 4, "--out", out)
    assert r.exit_code == GUARD_EXIT == 3, r.output
    assert "stopped by the guard at iteration 1: " in r.stderr and "--set guard.action=warn" in r.stderr
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step-1"]  # written before it stopped
    assert len(read_metrics(out)) == 1
    assert "guard: stat:jpeg_kb first at iteration 1" in r.stderr  # the summary's last lines: which rule, when
    shown = run("inspect", out)
    assert shown.exit_code == 0 and "stat:jpeg_kb first at iteration 1" in shown.stdout
    assert f"best checkpoint: {out / 'best'}" in shown.stdout.replace("\n", "")
    r = run("train", "--resume", out, "--set", 'guard.action="warn"')
    assert r.exit_code == 0, r.output
    assert len(read_metrics(out)) == 4 and [e["iteration"] for e in read_evals(out)] == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_best_survives_keep_last_and_resume_and_a_resumed_run_repeats_the_whole_one(tmp_path):
    keep = ["--set", "train.save_every=1", "--set", "train.keep_last=1", "--set", 'guard.best="reward"']
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run("train", *WATCHED, *keep, "--iterations", 5, "--out", whole).exit_code == 0
    assert run("train", *WATCHED, *keep, "--iterations", 3, "--out", parts).exit_code == 0
    r = run("train", "--resume", parts, "--iterations", 5)
    assert r.exit_code == 0, r.output
    for run_dir in (whole, parts):
        evals = read_evals(run_dir)
        top = max(range(len(evals)), key=lambda i: (evals[i]["reward_mean"], -i))
        best = list_checkpoints(run_dir / "best")
        assert [p.name for p in best] == [f"step-{evals[top]['iteration']}"]
        assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["step-5"]  # rotation left best alone
        assert [bool(e.get("guard/best")) for e in evals].count(True) >= 1
    assert without_timings(read_metrics(whole)) == without_timings(read_metrics(parts))
    assert without_timings(read_evals(whole)) == without_timings(read_evals(parts))
    same = [(whole / "best").iterdir(), (parts / "best").iterdir()]
    assert [p.name for p in same[0]] == [p.name for p in same[1]]


@pytest.mark.slow
def test_export_and_eval_take_the_best_checkpoint(tmp_path):
    out = tmp_path / "r"
    assert run("train", *WATCHED, "--iterations", 2, "--out", out).exit_code == 0  # best by shapes (auto)
    best = list_checkpoints(out / "best")[-1]
    r = run("eval", "--checkpoint", out, "--best", "--num-prompts", 2, "--num-images", 1, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["source"]["checkpoint"] == str(best)
    one_line_error(run("eval", "--best"), "--checkpoint RUN")
    one_line_error(run("export", out, "--best", "--step", 1, "--out", tmp_path / "x"), "--best and --step")
    bare = tmp_path / "bare"
    assert run("train", *TINY, "--iterations", 1, "--out", bare).exit_code == 0
    one_line_error(run("export", bare, "--best", "--out", tmp_path / "y"), "no best checkpoint")


@pytest.mark.slow
def test_reward_png_and_compare_draw_the_monitors_only_where_a_run_has_them(tmp_path):
    from PIL import Image

    watched, bare = tmp_path / "watched", tmp_path / "bare"
    assert run("train", *WATCHED, "--iterations", 2, "--out", watched).exit_code == 0
    off = ["--set", "guard.enabled=false", "--set", "train.eval_every=1"]
    jpeg = ["--reward", "jpeg-compressibility"]
    assert run("train", *TINY, *jpeg, *off, "--iterations", 2, "--out", bare).exit_code == 0
    assert not any(k.startswith(("monitor/", "drift/")) for e in read_evals(bare) for k in e)
    assert not any(k.startswith("monitor/") for r in read_metrics(bare) for k in r)
    with Image.open(watched / "reward.png") as a, Image.open(bare / "reward.png") as b:
        assert a.height > b.height  # a row of monitor panels below the reward panels
    r = run("compare", watched, bare, "--x", "iterations", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cmp" / "monitors.png").is_file()
    other = tmp_path / "other"
    assert run("train", *TINY, *jpeg, *off, "--iterations", 1, "--out", other).exit_code == 0
    r = run("compare", bare, other, "--x", "iterations", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "cmp" / "monitors.png").exists()  # not the earlier comparison's


@pytest.mark.slow
def test_two_processes_stop_together_with_the_guards_code(tmp_path):
    from clitools import treegrpo

    out = tmp_path / "r"
    stop = ["--set", "guard.stat_sigmas=1e-6", "--set", 'guard.action="stop"', "--set", "train.save_every=10"]
    r = treegrpo(*WATCHED, *stop, "--iterations", 4, "--out", out, nproc=2)
    assert r.returncode == GUARD_EXIT, r.stderr
    assert "stopped by the guard at iteration 1" in r.stderr and "Error" not in r.stderr
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step-1"]
    assert len(read_metrics(out)) == 1
