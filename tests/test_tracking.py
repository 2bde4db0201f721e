"""Run tracking (training/tracking.py): TensorBoard event files read back (scalars equal to metrics.jsonl, the
held-out curve, an image), a resumed run that recomputes logged iterations adds no duplicate steps, a tracker
added on resume gets the history, W&B offline writes its run folder, and a missing package is one line."""

import importlib.util
import json
import shutil

import pytest
from clitools import one_line_error, run

from treegrpo_cli.store.checkpoint import list_checkpoints
from treegrpo_cli.training.runlog import read_evals, read_metrics

FAST = ["--set", "rollout.num_prompts=2", "--set", "train.eval_samples=1", "--set", "train.sample_every=2"]
FAST += ["--set", "train.save_every=2"]


def _events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def _steps(acc, tag):
    return [e.step for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_tensorboard_logs_the_run_and_a_resume_adds_no_duplicate_steps(tmp_path):
    pytest.importorskip("tensorboard")
    r = tmp_path / "r"
    assert run("train", "--log", "tensorboard", *FAST, "--iterations", 3, "--run-dir", r).exit_code == 0
    shutil.rmtree(list_checkpoints(r / "checkpoints")[-1])  # the step-3 checkpoint lost: iteration 2 is recomputed
    res = run("train", "--resume", r, "--iterations", 4)
    assert res.exit_code == 0, res.output
    rows, evals, acc = read_metrics(r), read_evals(r), _events(r)
    assert [x["iteration"] for x in rows] == [0, 1, 2, 3]
    for tag in ("reward_mean", "seconds/rollout", "flops_total", "zero_std_ratio"):
        assert _steps(acc, tag) == [0, 1, 2, 3], tag  # iteration 2 logged once, though run twice
    assert [e.value for e in acc.Scalars("reward_mean")] == pytest.approx([x["reward_mean"] for x in rows], rel=1e-6)
    assert _steps(acc, "heldout/reward_mean") == [x["iteration"] for x in evals]
    assert [e.value for e in acc.Scalars("heldout/reward_mean")] == pytest.approx([x["reward_mean"] for x in evals])
    grids = acc.Images("samples")  # the first run's grid and before_after at 3 purged with the step-3 events
    assert [g.step for g in grids] == [0, 2, 4] and grids[0].width > 0 and grids[0].height > 0
    assert [g.step for g in acc.Images("before_after")] == [4]


@pytest.mark.slow
def test_a_tracker_added_on_resume_gets_the_history(tmp_path):
    pytest.importorskip("tensorboard")
    r = tmp_path / "r"
    assert run("train", *FAST, "--iterations", 2, "--run-dir", r).exit_code == 0
    assert not (r / "tensorboard").exists()
    res = run("train", "--resume", r, "--iterations", 3, "--log", "tensorboard")
    assert res.exit_code == 0, res.output
    acc = _events(r)
    assert _steps(acc, "reward_mean") == [0, 1, 2]
    assert [g.step for g in acc.Images("samples")] == [0, 2, 3]


@pytest.mark.slow
def test_wandb_offline_writes_its_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # not logged in
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # ours is the run folder
    r = tmp_path / "r"
    res = run("train", "--log", "wandb", *FAST, "--iterations", 2, "--run-dir", r)
    assert res.exit_code == 0, res.output
    state = json.loads((r / "tracking.json").read_text())["wandb"]
    runs = list((r / "wandb").glob(f"offline-run-*-{state['id']}"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), list((r / "wandb").iterdir())
    assert state["metrics"] == 1 and "samples@2" in state["images"]


def test_a_missing_tracker_package_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    r = run("train", "--log", "tensorboard,wandb", *FAST, "--iterations", 1, "--run-dir", tmp_path / "r")
    one_line_error(r, "wandb", "pip install 'treegrpo[track]'")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("value", "needle"), [("banana", "train.log takes each of"), (",", "--log takes"), ("wandb,wandb", "at most once")]
)
def test_bad_log_values_are_one_line(tmp_path, value, needle):
    r = run("train", "--log", value, *FAST, "--iterations", 1, "--run-dir", tmp_path / "r")
    one_line_error(r, needle)
    assert not (tmp_path / "r").exists()
