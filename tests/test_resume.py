"""Honest resume: the run's prompts and settings are kept, what is resumed is said, a damaged checkpoint
is skipped with a warning, a damaged metrics file is an error; stalls and non-finite losses are reported."""

import json
import math

import pytest
from clitools import one_line_error, run

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import grpo_update
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.store.checkpoint import list_checkpoints
from treegrpo_cli.training import loop, overlap
from treegrpo_cli.training.runlog import read_metrics, without_timings

TINY = [
    "--preset",
    "tree-grpo",
    "--set",
    'model="pixel-tiny"',
    "--set",
    "train.save_every=1",
    "--set",
    "train.sample_every=0",
    "--set",
    "train.eval_samples=0",
]


def comparable(rows):
    return without_timings(rows)


def train(*args):
    r = run("train", *args)
    assert r.exit_code == 0, r.output
    return r


@pytest.mark.slow
def test_resume_keeps_the_prompt_file_and_refuses_other_prompts(tmp_path):
    prompts = tmp_path / "mine.txt"
    prompts.write_text("a red circle\ntwo blue squares\n")
    train(*TINY, "--prompts", prompts, "--iterations", 2, "--run-dir", tmp_path / "a")
    train(*TINY, "--prompts", prompts, "--iterations", 1, "--run-dir", tmp_path / "b")
    r = train("--resume", tmp_path / "b", "--iterations", 2)  # no --prompts: the run's own file
    assert "resuming" in r.stderr and "step-1" in r.stderr
    assert comparable(read_metrics(tmp_path / "b")) == comparable(read_metrics(tmp_path / "a"))
    info = json.loads((tmp_path / "b" / "run.json").read_text())
    assert info["config"]["rollout"]["prompts"] == str(prompts) and info["prompts"]["train"]["count"] == 2
    other = tmp_path / "other.txt"
    other.write_text("a green triangle\n")
    one_line_error(run("train", "--resume", tmp_path / "b", "--prompts", other), "rollout.prompts")
    prompts.write_text("a red circle\n")  # the file changed under the run
    one_line_error(run("train", "--resume", tmp_path / "b", "--iterations", 3), "changed", "mine.txt")


@pytest.mark.slow
def test_resume_refuses_a_setting_that_changes_what_the_run_learns(tmp_path):
    train(*TINY, "--iterations", 1, "--run-dir", tmp_path / "r")
    one_line_error(run("train", "--resume", tmp_path / "r", "--set", "train.lr=0.5"), "train.lr", "new run")
    train("--resume", tmp_path / "r", "--iterations", 2, "--max-batch", 7)  # extending and batching are fine
    assert len(read_metrics(tmp_path / "r")) == 2


@pytest.mark.slow
def test_resume_without_a_checkpoint_says_it_starts_again(tmp_path):
    train(*TINY, "--iterations", 1, "--run-dir", tmp_path / "r")
    for p in list_checkpoints(tmp_path / "r" / "checkpoints"):
        (p / "manifest.json").unlink()
    r = train("--resume", tmp_path / "r")
    assert "no usable checkpoint" in r.stderr and "iteration 0" in r.stderr
    assert len(read_metrics(tmp_path / "r")) == 1


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path):
    train(*TINY, "--iterations", 3, "--run-dir", tmp_path / "ref")
    train(*TINY, "--iterations", 3, "--set", "train.keep_last=3", "--run-dir", tmp_path / "r")
    newest = list_checkpoints(tmp_path / "r" / "checkpoints")[-1]
    shard = newest / "model-00001-of-00001.safetensors"
    blob = bytearray(shard.read_bytes())
    blob[-1] ^= 0xFF
    shard.write_bytes(bytes(blob))
    r = train("--resume", tmp_path / "r", "--iterations", 3)
    assert "step-3 is damaged" in r.stderr and "from checkpoint step-2" in r.stderr
    assert comparable(read_metrics(tmp_path / "r")) == comparable(read_metrics(tmp_path / "ref"))


@pytest.mark.slow
def test_a_damaged_metrics_line_is_an_error_not_a_truncation(tmp_path):
    train(*TINY, "--iterations", 3, "--run-dir", tmp_path / "r")
    path = tmp_path / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]
    path.write_text("\n".join(lines) + "\n")
    before = path.read_bytes()
    one_line_error(run("train", "--resume", tmp_path / "r", "--iterations", 4), "metrics.jsonl", "line 2")
    assert path.read_bytes() == before
    path.write_text("\n".join(lines[:1]) + "\n" + lines[2][:10])  # a torn last line is normal after kill -9
    assert len(read_metrics(tmp_path / "r")) == 1


@pytest.mark.slow
def test_a_stalled_run_is_reported(tmp_path, monkeypatch):
    """A reward that is the same for every image: every advantage is 0, nothing to learn (a weight of 0, the
    old way to ask for it, is refused now)."""
    real = overlap.score_leaves
    monkeypatch.setattr(overlap, "score_leaves", lambda *a, **k: {n: v * 0 for n, v in real(*a, **k).items()})
    r = train(*TINY, "--iterations", 6, "--run-dir", tmp_path / "r", "--json")
    assert json.loads(r.stdout)["stalled_iterations"] == [[0, 5]]
    assert "warning: iterations 0-4 trained nothing" in r.stderr


@pytest.mark.slow
def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real, calls = grpo_update, []

    def poisoned(*a, **k):
        out = real(*a, **k)
        calls.append(1)
        return {**out, "loss": math.nan} if len(calls) == 3 else out

    monkeypatch.setattr("treegrpo_cli.engine.grpo.grpo_update", poisoned)
    cfg = load_config(
        "tree-grpo",
        sets=[
            'model="pixel-tiny"',
            "train.save_every=1",
            "train.sample_every=0",
            "train.eval_samples=0",
            "train.iterations=5",
        ],
    )
    req = loop.TrainRequest(cfg, ["a red circle"], ["a red circle"], tmp_path / "r")
    with pytest.raises(TreegrpoError, match="iteration 2: loss is nan.*last good checkpoint is step-2"):
        loop.train(req)
    assert [p.name for p in list_checkpoints(tmp_path / "r" / "checkpoints")] == ["step-1", "step-2"]
    assert len(read_metrics(tmp_path / "r")) == 2
