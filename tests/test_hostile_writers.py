"""Writers and full disks: one writer per tree folder (score and rollout hold the folder's lock, as a run
does); a disk that fills on a first write leaves a folder the same command reuses; a disk that fills on a
checkpoint or a picture is one line naming the folder and the space, keeps the last checkpoint, and a resume
finishes what the stopped run did not."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from clitools import PIXEL, one_line_error, run

from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.store import checkpoint
from treegrpo_cli.store.shards import atomic_write
from treegrpo_cli.training import runlock


def last_line_error(result, *needles):
    """A run's progress lines, then exactly one error line (the last), no traceback."""
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert [ln.startswith("Error") for ln in lines].count(True) == 1 and lines[-1].startswith("Error"), result.stderr
    assert "Traceback" not in result.output and "this is a bug" not in result.stderr
    for n in needles:
        assert n in lines[-1], lines[-1]


FAST = [*PIXEL, "--set", "rollout.num_prompts=2", "--set", "train.eval_samples=0", "--set", "train.save_every=1"]


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-writers") / "trees"
    r = run("rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", d)
    assert r.exit_code == 0, r.output
    return d


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(word): every atomic write whose file name holds `word` finds no space left (ENOSPC)."""
    real = os.fdopen

    def arm(word: str) -> None:
        def fdopen(fd, *a, **kw):
            f = real(fd, *a, **kw)
            if word in os.readlink(f"/proc/self/fd/{fd}"):
                f.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
            return f

        monkeypatch.setattr(os, "fdopen", fdopen)

    yield arm
    monkeypatch.setattr(os, "fdopen", real)


# --- one writer per tree folder -------------------------------------------------------------------------


@pytest.mark.slow
def test_score_of_a_tree_folder_another_process_writes_is_refused(trees):
    with runlock.lock(trees):
        one_line_error(run("score", trees), "in use by another treegrpo process", f"pid {os.getpid()}")
    assert run("score", trees).exit_code == 0  # and the lock is gone with its holder
    assert not (trees / ".lock").exists()


def test_a_rollout_into_a_folder_another_process_writes_is_refused(tmp_path):
    out = tmp_path / "t"
    with runlock.lock(out, create=True):
        one_line_error(run("rollout", *PIXEL, "-n", 1, "--out", out), "in use by another treegrpo process")
    assert not any(out.iterdir())


def test_a_rollout_into_a_folder_holding_only_a_stale_lock_file_works(tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    (out / ".lock").write_text("12345\n")  # a writer killed before its first file
    r = run("rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", out)
    assert r.exit_code == 0, r.output
    assert (out / "index.json").is_file() and not (out / ".lock").exists()


# --- full disks -------------------------------------------------------------------------------------------


def test_atomic_write_on_a_full_disk_is_one_line_and_keeps_the_old_file(tmp_path, full_disk):
    (tmp_path / "a.json").write_text("old")
    full_disk("a.json")
    with pytest.raises(TreegrpoError, match=r"no space left on its disk \(0\.0 MB needed"):
        atomic_write(tmp_path / "a.json", b"new")
    assert (tmp_path / "a.json").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_rollout_whose_first_write_finds_a_full_disk_leaves_a_folder_the_same_command_reuses(tmp_path, full_disk):
    out = tmp_path / "t"
    args = ["rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", out]
    full_disk("index.json")
    one_line_error(run(*args), str(out), "no space left", "MB needed")
    assert not any(out.iterdir())  # no lock, no error file
    full_disk("never-matches")
    assert run(*args).exit_code == 0


@pytest.mark.slow
def test_a_run_whose_first_write_finds_a_full_disk_is_started_again_by_the_same_command(tmp_path, full_disk):
    folder = tmp_path / "r"
    args = ["train", *FAST, "--iterations", 1, "--run-dir", folder]
    full_disk("run.json")
    last_line_error(run(*args), str(folder), "no space left")
    (folder / "error-20260101-000000-1.txt").write_text("an earlier bug's traceback")
    full_disk("never-matches")
    r = run(*args)
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_a_checkpoint_on_a_full_disk_is_one_line_and_the_last_one_stays(tmp_path, monkeypatch):
    folder = tmp_path / "r"
    assert run("train", *FAST, "--iterations", 1, "--run-dir", folder).exit_code == 0

    def full(*a, **kw):
        raise RuntimeError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(checkpoint, "save_file", full)
    r = run("train", "--resume", folder, "--iterations", 2)
    last_line_error(r, "checkpoints", "no space left", "MB needed", "--resume")
    assert "this is a bug" not in r.stderr
    steps = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert steps == ["step-1"]  # the partial step-2 is gone, step-1 intact
    monkeypatch.undo()
    r = run("train", "--resume", folder, "--iterations", 2)
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_a_resume_writes_the_before_after_picture_a_full_disk_stopped(tmp_path, full_disk):
    folder = tmp_path / "r"
    args = ["train", *FAST, "--set", "train.sample_every=1", "--iterations", 1, "--run-dir", folder]
    full_disk("before_after")
    r = run(*args)
    last_line_error(r, str(folder), "no space left")
    assert not (folder / "before_after.png").exists()
    full_disk("never-matches")
    r = run("train", "--resume", folder, "--iterations", 1)
    assert r.exit_code == 0, r.output
    assert (folder / "before_after.png").is_file()
    assert [json.loads(x)["iteration"] for x in (folder / "metrics.jsonl").read_text().splitlines()] == [0]


def test_a_full_disk_the_library_did_not_name_is_one_line_not_a_bug(tmp_path, monkeypatch):
    from treegrpo_cli.training import stages

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "somewhere"))

    monkeypatch.setattr(stages, "write_tree_shard", full)
    r = run("rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", tmp_path / "t")
    last_line_error(r, "no space left", "somewhere", "MB free")
    assert "this is a bug" not in r.stderr and "system error" not in r.stderr


def test_disk_full_lines_name_a_path_that_is_a_path(tmp_path):
    from treegrpo_cli.errors import disk_full

    line = str(disk_full(Path(tmp_path), 5_000_000))
    assert str(tmp_path) in line and "5.0 MB needed" in line and "MB free" in line
