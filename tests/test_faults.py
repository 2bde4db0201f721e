"""Killed at a chosen moment (TREEGRPO_FAULT, store/faults.py), each writer leaves nothing a reader takes as whole:
checkpoint saves and keep-last, rollouts, scoring passes, eval outputs and exports; the reader refuses in one line
naming the command to run again, and that command (or --resume) finishes the job, equal to an uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from clitools import PIXEL, one_line_error, run, snapshot, write_pngs

from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import read_metrics, without_timings

pytestmark = pytest.mark.slow

TRAIN = [*PIXEL, "--set", "rollout.num_prompts=2", "--set", "train.eval_samples=0", "--set", "train.save_every=1"]
ROLLOUT = ["rollout", *PIXEL, "-n", 3, "--preset", "branch", "--prompts-per-shard", 1, "--save-images"]


def proc(*args, fault: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`treegrpo ARGS` as its own process, stopped at the named point when `fault` is given."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TREEGRPO_FAULT", None)
    env.update({"TREEGRPO_FAULT": fault} if fault else {})
    cmd = [sys.executable, "-m", "treegrpo_cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def killed(*args, fault: str, cwd: Path | None = None) -> None:
    r = proc(*args, fault=fault, cwd=cwd)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])


def ok(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    r = proc(*args, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def refused_in_one_line(result, *needles: str) -> None:
    one_line_error(result, *needles)
    assert "this is a bug" not in result.stderr and "Traceback" not in result.output


def same_run(a: Path, b: Path) -> None:
    """Two run folders hold the same metrics rows (timings aside) and the same last checkpoint, bit for bit."""
    assert without_timings(read_metrics(a)) == without_timings(read_metrics(b))
    ca, cb = (load_checkpoint(list_checkpoints(r / "checkpoints")[-1]) for r in (a, b))
    assert ca.step == cb.step
    for x, y in ((ca.model, cb.model), (ca.optimizer["state"], cb.optimizer["state"])):
        flat_x, flat_y = _flat(x), _flat(y)
        assert flat_x.keys() == flat_y.keys()
        assert all(torch.equal(flat_x[k], flat_y[k]) for k in flat_x if torch.is_tensor(flat_x[k]))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def steps_and_leftovers(run_dir: Path) -> tuple[list[str], list[str]]:
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    return [n for n in names if not n.startswith(".")], [n for n in names if n.startswith(".")]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> Path:
    """The uninterrupted 4-iteration run the killed ones are compared with."""
    d = tmp_path_factory.mktemp("faults") / "whole"
    ok("train", *TRAIN, "--iterations", 4, "--run-dir", d)
    return d


# --- checkpoints ---------------------------------------------------------------------------------------


def test_a_save_killed_midway_leaves_a_temporary_folder_that_the_resume_sweeps(tmp_path, whole_run):
    d = tmp_path / "r"
    killed("train", *TRAIN, "--iterations", 4, "--run-dir", d, fault="checkpoint.shard@3")  # inside step-2's save
    steps, leftovers = steps_and_leftovers(d)
    assert steps == ["step-1"] and leftovers and leftovers[0].startswith(".step-2."), (steps, leftovers)
    assert [p.name for p in list_checkpoints(d / "checkpoints")] == ["step-1"]
    ok("train", "--resume", d)
    assert steps_and_leftovers(d) == (["step-3", "step-4"], [])
    same_run(d, whole_run)


def test_keep_last_killed_while_it_deletes_leaves_no_damaged_checkpoint(tmp_path, whole_run):
    d = tmp_path / "r"
    killed("train", *TRAIN, "--iterations", 4, "--run-dir", d, fault="checkpoint.retire")  # step-1 going at step-3
    steps, leftovers = steps_and_leftovers(d)
    assert steps == ["step-2", "step-3"] and len(leftovers) == 1 and leftovers[0].startswith(".step-1.retired-")
    ok("train", "--resume", d)
    assert steps_and_leftovers(d) == (["step-3", "step-4"], [])
    same_run(d, whole_run)


def test_a_finished_run_killed_in_its_last_deletion_is_tidied_by_its_resume(tmp_path, whole_run):
    d = tmp_path / "r"
    killed("train", *TRAIN, "--iterations", 4, "--run-dir", d, fault="checkpoint.retire@2")  # step-2 going at step-4
    assert steps_and_leftovers(d)[0] == ["step-3", "step-4"]
    ok("train", "--resume", d)  # nothing left to train: only the tidying
    assert steps_and_leftovers(d) == (["step-3", "step-4"], [])
    same_run(d, whole_run)


def test_a_half_deleted_checkpoint_is_never_listed_or_used_and_the_next_save_removes_it(tmp_path):
    """What a kill in the middle of an rmtree left (before deletions were renames first): a manifest without
    some of the files it lists."""
    d = tmp_path / "r"
    assert run("train", *TRAIN, "--iterations", 2, "--run-dir", d).exit_code == 0
    shutil.copytree(d / "checkpoints" / "step-2", d / "checkpoints" / "step-3")
    (d / "checkpoints" / "step-3" / "optimizer.index.json").unlink()
    assert [p.name for p in list_checkpoints(d / "checkpoints")] == ["step-1", "step-2"]
    r = run("eval", "--checkpoint", d, "--num-images", 1, "--json")
    assert r.exit_code == 0 and '"step": 2' in r.stdout.replace("\n", " ").replace("  ", " "), r.output
    r = run("train", "--resume", d, "--iterations", 3)
    assert r.exit_code == 0, r.output
    assert "step-3: incomplete or damaged" in r.stderr and "optimizer.index.json" in r.stderr, r.stderr
    assert "resuming" in r.stderr and "from checkpoint step-2" in r.stderr
    assert steps_and_leftovers(d) == (["step-2", "step-3"], [])
    assert list_checkpoints(d / "checkpoints")[-1].name == "step-3"  # the new, complete one


# --- tree folders ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whole_trees(tmp_path_factory) -> Path:
    """An uninterrupted rollout and its scoring, as `trees` under their own working folder."""
    cwd = tmp_path_factory.mktemp("whole-trees")
    ok(*ROLLOUT, "--out", "trees", cwd=cwd)
    rolled = snapshot(cwd / "trees")
    ok("score", "trees", cwd=cwd)
    return cwd, rolled


def readers(out: Path, other: Path, tmp_path: Path) -> list[list]:
    return [
        ["inspect", out],
        ["train", "--trees", out, "--run-dir", tmp_path / "staged"],
        ["diversity", out, other, "--features", "pixels", "--kid-subsets", 2, "--permutations", 0],
    ]


def test_a_killed_rollout_is_refused_by_every_reader_and_the_same_command_replaces_it(tmp_path, whole_trees):
    cwd, rolled = whole_trees[0], whole_trees[1]
    here = tmp_path / "w"
    here.mkdir()
    killed(*ROLLOUT, "--out", "trees", fault="rollout.shard", cwd=here)
    out = here / "trees"
    for args in [
        *readers(out, cwd / "trees", tmp_path),
        ["score", out],
        ["eval", "--images", out / "images", "--out", tmp_path / "e"],
    ]:
        refused_in_one_line(run(*args), "an incomplete rollout", "roll it out again: treegrpo rollout")
    ok(*ROLLOUT, "--out", "trees", cwd=here)  # the same command: the leftover is replaced
    assert snapshot(out) == rolled
    assert (out / "images" / "prompts.json").is_file()  # --save-images: the map `eval --images` reads
    r = run("eval", "--images", out / "images", "--metric", "jpeg-compressibility", "--out", tmp_path / "e2")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("point", ["score.cleared", "score.shard", "score.shard@2"])
def test_a_killed_scoring_is_refused_by_every_reader_and_scoring_again_finishes_it(tmp_path, whole_trees, point):
    cwd = whole_trees[0]
    here = tmp_path / "w"
    shutil.copytree(cwd, here)
    out = here / "trees"
    (out / ".lock").unlink(missing_ok=True)
    scored = snapshot(out)
    killed("score", "trees", "--reward", "jpeg-compressibility", fault=point, cwd=here)
    (out / ".rewards-00001.safetensors.k1ll3d00.tmp").write_bytes(b"half a shard")  # a kill inside a write
    for args in readers(out, cwd / "trees", tmp_path):
        refused_in_one_line(run(*args), "scoring pass that did not finish", "score it again: treegrpo score trees")
    ok("score", "trees", "--reward", "jpeg-compressibility", cwd=here)
    after = snapshot(out)
    index = json.loads((out / "index.json").read_text())
    assert "scoring_pass" not in index["meta"] and index["meta"]["scoring"]["rewards"] == {"jpeg-compressibility": 1.0}
    assert {k: v for k, v in after.items() if k != "index.json"} == {
        k: v for k, v in scored.items() if k != "index.json"
    }


def test_a_folder_half_scored_without_any_record_is_refused(tmp_path, whole_trees):
    """rewards shards without meta.scoring, as a scoring killed before the record existed left them."""
    here = tmp_path / "w"
    shutil.copytree(whole_trees[0], here)
    index = json.loads((here / "trees" / "index.json").read_text())
    del index["meta"]["scoring"]
    (here / "trees" / "index.json").write_text(json.dumps(index))
    refused_in_one_line(run("inspect", here / "trees"), "an interrupted scoring", "score it again")


# --- eval outputs and the end of a run ------------------------------------------------------------------


def test_a_killed_eval_out_is_finished_by_the_same_command(tmp_path):
    folder = write_pngs(tmp_path / "imgs", 6)
    args = ["eval", "--images", folder, "--metric", "jpeg-compressibility", "--out", "e"]
    ok(*args, cwd=tmp_path)
    whole = (tmp_path / "e" / "results.csv").read_bytes(), (tmp_path / "e" / "samples.png").read_bytes()
    here = tmp_path / "w"
    here.mkdir()
    args[2] = folder
    killed(*args, fault="eval.file", cwd=here)
    assert not (here / "e" / "results.json").exists()  # no record: not taken as a finished eval
    ok(*args, cwd=here)
    assert ((here / "e" / "results.csv").read_bytes(), (here / "e" / "samples.png").read_bytes()) == whole
    assert sorted(p.name for p in (here / "e").iterdir()) == ["results.csv", "results.json", "samples.png"]


def test_a_sigterm_after_the_last_iteration_says_the_run_is_complete(tmp_path):
    d = tmp_path / "r"
    r = proc("train", *TRAIN, "--iterations", 2, "--run-dir", d, fault="train.summary:TERM")
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "SIGTERM came too late to stop the run before its last iteration: it is complete" in r.stderr
    assert len(read_metrics(d)) == 2


def test_a_sigterm_inside_a_save_stops_after_it_with_the_resume_command(tmp_path):
    d = tmp_path / "r"
    r = proc("train", *TRAIN, "--iterations", 4, "--run-dir", d, fault="checkpoint.shard:TERM")
    assert r.returncode == 143 and "continue with: treegrpo train --resume" in r.stderr, r.stderr[-2000:]
    assert len(read_metrics(d)) < 4 and list_checkpoints(d / "checkpoints")[-1].name == f"step-{len(read_metrics(d))}"


# --- exports ---------------------------------------------------------------------------------------------

FLUX = ["--model", "flux-dev", "--set", 'policy.weights="random"', "--set", 'policy.size="tiny"']


def test_a_killed_export_leaves_no_out_folder_and_the_same_command_writes_it_whole(tmp_path):
    (tmp_path / "p.txt").write_text("a red fox\na blue car\n")
    small = ["--set", "rollout.num_prompts=2", "--set", "sampler.steps=4", "--set", "train.eval_samples=0"]
    ok("train", *FLUX, *small, "--reward", "jpeg-compressibility", "--prompts", "p.txt", "--iterations", 1,
       "--run-dir", "r", cwd=tmp_path)  # fmt: skip
    ok("export", "r", "--out", "whole", cwd=tmp_path)
    killed("export", "r", "--out", "x", fault="export.file", cwd=tmp_path)
    assert not (tmp_path / "x").exists() and list(tmp_path.glob(".x.export-*"))  # staged aside, never as x
    ok("export", "r", "--out", "x", cwd=tmp_path)
    assert snapshot(tmp_path / "x") == snapshot(tmp_path / "whole") and not list(tmp_path.glob(".x.export-*"))


def test_an_export_onto_a_full_disk_gives_export_advice(tmp_path, monkeypatch):
    import errno

    from treegrpo_cli.training import export

    d = tmp_path / "r"
    assert run("train", *TRAIN, "--iterations", 1, "--run-dir", d).exit_code == 0

    class Full:
        def export(self, out, weights):
            raise OSError(errno.ENOSPC, "No space left on device")

        def describe(self):
            return {}

    monkeypatch.setattr(export, "load_policy", lambda *a, **k: Full())
    r = run("export", d, "--out", tmp_path / "x")
    refused_in_one_line(r, "no space left", "run the command again")
    assert "--resume" not in r.stderr and not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.export-*"))


def test_a_full_disk_before_the_first_checkpoint_says_the_resume_starts_again(tmp_path, monkeypatch):
    from treegrpo_cli.store import checkpoint

    def full(*a, **kw):
        raise RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')

    monkeypatch.setattr(checkpoint, "save_file", full)
    d = tmp_path / "r"
    r = run("train", *TRAIN, "--iterations", 2, "--run-dir", d)
    line = r.stderr.strip().splitlines()[-1]
    assert r.exit_code == 1 and "no space left" in line and "last checkpoint" not in line, r.stderr
    assert f"treegrpo train --resume {d}" in line and "starts again from iteration 0" in line, line
    monkeypatch.undo()
    r = run("train", *TRAIN, "--iterations", 1, "--run-dir", tmp_path / "s")
    assert r.exit_code == 0
    monkeypatch.setattr(checkpoint, "save_file", full)
    r = run("train", "--resume", tmp_path / "s", "--iterations", 2)
    assert "goes on from its last checkpoint, step-1, which is intact" in r.stderr.strip().splitlines()[-1], r.stderr
