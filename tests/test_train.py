import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from clitools import undeclared
from typer.testing import CliRunner

from treegrpo_cli.cli.app import app
from treegrpo_cli.config import preset_names
from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import EvalRow, MetricsRow, read_evals, read_metrics, without_timings

runner = CliRunner()
TINY = ["--set", 'model="pixel-tiny"']


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def comparable(rows):
    return without_timings(rows)


@pytest.mark.slow
@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_trains_two_iterations(tmp_path, preset):
    r = run("train", "--preset", preset, *TINY, "--iterations", 2, "--run-dir", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.output
    rows = read_metrics(tmp_path / "run")
    assert [row["iteration"] for row in rows] == [0, 1]
    assert [undeclared(row, MetricsRow) for row in rows] == [[], []]  # every field typed for its readers
    assert all(undeclared(e, EvalRow) == [] for e in read_evals(tmp_path / "run"))
    assert all(row["trained_edges"] > 0 and row["train_evals"] > 0 for row in rows)
    if preset.endswith(("nft", "dgpo")):  # DiffusionNFT, DGPO: no likelihood ratio; the old policy's decay instead
        assert all(0 <= row["old_decay"] <= 1 and "ratio_first_dev" not in row for row in rows)
    elif preset.endswith("awm"):  # AWM: no likelihood ratio; its anchor's decay instead
        assert all(0 <= row["anchor_decay"] <= 1 and "ratio_first_dev" not in row for row in rows)
    else:
        assert all(row["ratio_first_dev"] < 1e-5 for row in rows)  # on-policy before each iteration's first step
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step-2"]
    assert (tmp_path / "run" / "reward.png").is_file()
    summary = json.loads(r.stdout)
    assert summary["iterations"] == 2


@pytest.mark.slow
def test_metrics_count_model_evaluations(tmp_path):
    paper = ["--set", "pruning.train_last=false", "--set", 'train.loss_norm="mean"']
    assert (
        run("train", "--preset", "branch", *TINY, *paper, "--iterations", 1, "--run-dir", tmp_path / "r").exit_code == 0
    )
    row = read_metrics(tmp_path / "r")[0]
    assert row["rollout_evals_per_leaf"] == pytest.approx(203 / 16)
    assert row["train_evals_per_leaf"] == pytest.approx(187 / 16)  # one forward per trained parent
    assert run("train", "--preset", "branch", *TINY, "--iterations", 1, "--run-dir", tmp_path / "c").exit_code == 0
    code = read_metrics(tmp_path / "c")[0]  # the released code: 12 shuffled transitions a step, the last step too
    assert 203 / 16 < code["train_evals_per_leaf"] <= 218 / 16 and code["edges"] == 2 * 218
    for key in (
        "reward_mean",
        "reward_std",
        "adv_mean",
        "adv_std",
        "ratio_mean",
        "clip_frac",
        "approx_kl",
        "grad_norm",
        "lr",
        "rewards/jpeg-compressibility/mean",
    ):
        assert key in row


@pytest.mark.slow
def test_heldout_reward_before_and_after(tmp_path):
    from treegrpo_cli.engine.sde import FlowSDE
    from treegrpo_cli.models.registry import load_policy
    from treegrpo_cli.prompts import load_prompts
    from treegrpo_cli.rewards.base import get_reward
    from treegrpo_cli.training.heldout import heldout_reward
    from treegrpo_cli.training.rundir import load_config
    from treegrpo_cli.training.sampling import stream_seed

    r = run(
        "train",
        "--preset",
        "flow-grpo",
        *TINY,
        "--iterations",
        2,
        "--set",
        "train.eval_samples=3",
        "--set",
        "train.lr=1e-2",
        "--run-dir",
        tmp_path / "r",
        "--json",
    )
    assert r.exit_code == 0, r.output
    evals = read_evals(tmp_path / "r")
    assert [e["iteration"] for e in evals] == [0, 2] and evals[0]["samples"] == 3
    # the first evaluation is of the initial weights, with the run's eval seed
    policy, reward = load_policy("pixel-tiny"), {"jpeg-compressibility": get_reward("jpeg-compressibility")}
    cfg = load_config(tmp_path / "r")
    again = heldout_reward(
        policy,
        FlowSDE(cfg.sampler),
        load_prompts(cfg.rollout.eval_prompts),
        reward,
        {"jpeg-compressibility": 1.0},
        samples=3,
        seed=stream_seed(cfg.seed, "heldout"),
    )
    assert again["reward_mean"] == pytest.approx(evals[0]["reward_mean"], abs=1e-6)
    # flow-grpo keeps an EMA: the evaluations score it (as `eval` and `export` do), the trained weights under raw/
    assert [e["weights"] for e in evals] == ["ema", "ema"]
    assert evals[1]["raw/reward_mean"] != evals[0]["raw/reward_mean"]  # the trained weights moved
    assert evals[1]["reward_mean"] == evals[0]["reward_mean"]  # 4 optimizer steps: its first EMA update is after 7
    summary = json.loads(r.stdout)
    assert summary["heldout_gain"] == pytest.approx(evals[1]["reward_mean"] - evals[0]["reward_mean"])
    # the before/after picture: the base model's grid (step 0) on the left, the trained one's on the right
    from PIL import Image

    grids = [Image.open(tmp_path / "r" / "samples" / f"step-{k}.png") for k in (0, 2)]
    with Image.open(tmp_path / "r" / "before_after.png") as both:
        assert both.width >= grids[0].width + grids[1].width and both.height > grids[0].height
        from treegrpo_cli.plots import PAD, line_height

        top = 2 * line_height() + 3 * PAD  # under the title's two lines (what, held-out mean reward)
        left = both.crop((0, top, grids[0].width, top + grids[0].height)).convert("RGB")
        assert left.tobytes() == grids[0].convert("RGB").tobytes()  # the base grid, untouched
    r = run(
        "train",
        "--preset",
        "flow-grpo",
        *TINY,
        "--iterations",
        1,
        "--set",
        "train.eval_samples=0",
        "--run-dir",
        tmp_path / "off",
        "--json",
    )
    assert r.exit_code == 0 and read_evals(tmp_path / "off") == [] and "heldout_before" not in json.loads(r.stdout)


@pytest.mark.slow
def test_same_seed_same_curve(tmp_path):
    for d in ("a", "b"):
        assert (
            run(
                "train", "--preset", "tree-grpo", *TINY, "--iterations", 3, "--seed", 4, "--run-dir", tmp_path / d
            ).exit_code
            == 0
        )
    assert comparable(read_metrics(tmp_path / "a")) == comparable(read_metrics(tmp_path / "b"))


def _train_proc(run_dir: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "treegrpo_cli",
        "train",
        "--preset",
        "tree-grpo",
        *TINY,
        "--iterations",
        "30",
        "--seed",
        "11",
        "--set",
        "train.save_every=4",
        "--run-dir",
        str(run_dir),
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_rows(run_dir: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while len(read_metrics(run_dir)) < n:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() - t0 < timeout
        time.sleep(0.05)


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path):
    ref = _train_proc(tmp_path / "ref")
    assert ref.wait(timeout=300) == 0, ref.stderr.read().decode()
    p = _train_proc(tmp_path / "killed")
    _wait_rows(tmp_path / "killed", 10, p)  # then kill at once: inside iteration 10 or a little later
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert len(read_metrics(tmp_path / "killed")) < 30
    q = subprocess.run(
        [sys.executable, "-m", "treegrpo_cli", "train", "--resume", str(tmp_path / "killed")],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        timeout=300,
    )
    assert q.returncode == 0, q.stderr.decode()
    assert comparable(read_metrics(tmp_path / "killed")) == comparable(read_metrics(tmp_path / "ref"))
    assert comparable(read_evals(tmp_path / "killed")) == comparable(
        read_evals(tmp_path / "ref")
    )  # before and after, not repeated
    a, b = (load_checkpoint(list_checkpoints(tmp_path / d / "checkpoints")[-1]) for d in ("killed", "ref"))
    assert all(torch.equal(a.model[k], b.model[k]) for k in b.model)
    assert a.rng.keys() == b.rng.keys() and all(torch.equal(a.rng[k], b.rng[k]) for k in b.rng)


@pytest.mark.slow
def test_sigterm_checkpoints_and_resumes(tmp_path):
    """A stopped run checkpoints, exits 143 (not 0: a scheduler must not mark it completed), says how to
    resume, and resumes from that checkpoint."""
    p = _train_proc(tmp_path / "run")
    _wait_rows(tmp_path / "run", 1, p)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == 128 + signal.SIGTERM
    err = p.stderr.read().decode()
    assert "stopped early" in err and f"treegrpo train --resume {tmp_path / 'run'}" in err, err
    done = read_metrics(tmp_path / "run")
    ck = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert ck and load_checkpoint(ck[-1]).step == len(done) < 30
    assert not [x for x in (tmp_path / "run" / "checkpoints").iterdir() if x.name.startswith(".")]
    r = run("train", "--resume", tmp_path / "run", "--iterations", len(done) + 1)
    assert r.exit_code == 0 and f"from checkpoint step-{len(done)}" in r.stderr, r.output
    assert [row["iteration"] for row in read_metrics(tmp_path / "run")] == list(range(len(done) + 1))


@pytest.mark.slow
def test_staged_update_from_trees(tmp_path):
    trees = tmp_path / "trees"
    assert run("rollout", "--preset", "branch", *TINY, "-n", 2, "--out", trees).exit_code == 0
    r = run("train", "--trees", trees, "--run-dir", tmp_path / "run")
    assert "score" in r.stderr and r.exit_code != 0
    assert run("score", trees).exit_code == 0
    r = run("train", "--trees", trees, "--run-dir", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["ratio_first_dev"] < 1e-5 and out["edges"] == 2 * 218  # the code's schedule: every edge, 12 a step
    assert out["optimizer_steps"] == -(-2 * 218 // 12)
    assert load_checkpoint(Path(out["checkpoint"])).step == 1


def one_line(r, needle):
    assert r.exit_code != 0 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.output


@pytest.mark.slow
def test_bad_train_inputs(tmp_path):
    one_line(run("train", "--preset", "nope", "--run-dir", tmp_path / "a"), "unknown preset")
    one_line(run("train", "--set", "train.lr", "--run-dir", tmp_path / "b"), "key=value")
    one_line(run("train", "--set", "train.lrr=1", "--run-dir", tmp_path / "b"), "train.lr")
    one_line(run("train", *TINY, "--prompts", tmp_path / "none.txt", "--run-dir", tmp_path / "c"), "not found")
    trees = tmp_path / "trees"
    assert run("rollout", "--preset", "branch", *TINY, "-n", 1, "--out", trees).exit_code == 0
    one_line(run("train", "--resume", trees), "not a treegrpo run")
    assert run("train", *TINY, "--iterations", 1, "--run-dir", tmp_path / "d").exit_code == 0
    one_line(run("train", *TINY, "--iterations", 1, "--run-dir", tmp_path / "d"), "--resume")


@pytest.mark.slow
def test_time_budget_finishes_the_run(tmp_path):
    # a budget any iteration exceeds: the run finishes after iteration 0 as if it were the last one
    r = run(
        "train",
        "--preset",
        "tree-grpo",
        *TINY,
        "--iterations",
        50,
        "--set",
        "train.max_minutes=1e-9",
        "--set",
        "train.sample_every=10",
        "--run-dir",
        tmp_path / "r",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert [m["iteration"] for m in read_metrics(tmp_path / "r")] == [0]
    assert [e["iteration"] for e in read_evals(tmp_path / "r")] == [0, 1]  # before, and after the last
    assert [p.name for p in list_checkpoints(tmp_path / "r" / "checkpoints")] == ["step-1"]
    assert (tmp_path / "r" / "before_after.png").is_file() and not json.loads(r.stdout)["stopped_early"]
    # resuming with the same budget trains nothing more; lifting it continues the same run
    assert run("train", "--resume", tmp_path / "r").exit_code == 0
    assert len(read_metrics(tmp_path / "r")) == 1
    r = run("train", "--resume", tmp_path / "r", "--set", "train.max_minutes=0", "--iterations", 3)
    assert r.exit_code == 0, r.output
    assert [m["iteration"] for m in read_metrics(tmp_path / "r")] == [0, 1, 2]
    assert [e["iteration"] for e in read_evals(tmp_path / "r")] == [0, 1, 3]


@pytest.mark.slow
def test_heldout_every_few_minutes_of_training(tmp_path):
    # an interval every iteration crosses: a held-out row after each one, stamped with the training clock
    r = run(
        "train",
        "--preset",
        "tree-grpo",
        *TINY,
        "--iterations",
        3,
        "--set",
        "train.eval_every_minutes=1e-9",
        "--set",
        "train.sample_every=0",
        "--run-dir",
        tmp_path / "r",
    )
    assert r.exit_code == 0, r.output
    rows, evals = read_metrics(tmp_path / "r"), read_evals(tmp_path / "r")
    assert [e["iteration"] for e in evals] == [0, 1, 2, 3]
    assert [e["wall"] for e in evals] == [0.0] + [m["wall"] for m in rows]
    assert all(m["peak_mib"] > 0 for m in rows)
    # the same run without the extra evaluations trains the same curve
    assert (
        run(
            "train",
            "--preset",
            "tree-grpo",
            *TINY,
            "--iterations",
            3,
            "--set",
            "train.sample_every=0",
            "--run-dir",
            tmp_path / "plain",
        ).exit_code
        == 0
    )
    assert comparable(read_metrics(tmp_path / "plain")) == comparable(rows)
