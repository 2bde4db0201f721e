"""Hostile input round three, the run folder and the process's exit: one writer per run folder (an OS
lock), a stopped run exits non-zero and says how to resume, an internal error names its traceback file,
error lines cannot be split by the text they quote, run.json records the code that wrote it, and damaged
run files are refused in one line (naming the file and the field) before anything is written."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clitools import one_line_error, run, snapshot

from treegrpo_cli import __version__
from treegrpo_cli.store.checkpoint import list_checkpoints
from treegrpo_cli.training import rundir, runlock
from treegrpo_cli.training.runlog import read_metrics, without_timings

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out

FAST = [
    "--preset",
    "tree-grpo",
    "--set",
    'model="pixel-tiny"',
    "--set",
    "train.save_every=1",
    "--set",
    "train.keep_last=3",
    "--set",
    "train.sample_every=0",
    "--set",
    "train.eval_samples=1",
]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def comparable(rows):
    return without_timings(rows)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished 2-iteration run (checkpoints step-1 and step-2, held-out before and after) and scored trees."""
    d = tmp_path_factory.mktemp("base")
    r = run("train", *FAST, "--iterations", 2, "--run-dir", d / "run")
    assert r.exit_code == 0, r.output
    assert (
        run("rollout", "--set", 'model="pixel-tiny"', "-n", 1, "--preset", "branch", "--out", d / "trees").exit_code
        == 0
    )
    assert run("score", d / "trees").exit_code == 0
    return d


@pytest.fixture
def copy(base, tmp_path):
    """A private copy of the base run."""
    shutil.copytree(base / "run", tmp_path / "run", symlinks=True)
    return tmp_path / "run"


def rewrite_json(path: Path, change) -> None:
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info, indent=1))


def _train_proc(args, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "treegrpo_cli", "train", *map(str, args)]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _wait_rows(folder: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while len(read_metrics(folder)) < n:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() - t0 < timeout
        time.sleep(0.05)


# --- 1. one process per run folder ----------------------------------------------------------------


def test_a_second_resume_of_a_running_run_is_refused_naming_the_holder(copy):
    """Two `train --resume R` at once: the second is refused naming the first's pid; after the first is
    SIGKILLed the run resumes at once, and metrics.jsonl holds every iteration once."""
    p = _train_proc(["--resume", copy, "--iterations", 400])
    try:
        _wait_rows(copy, 4, p)
        before = (copy / "run.json").read_bytes()
        one_line_error(run("train", "--resume", copy, "--iterations", 3), f"pid {p.pid}", str(copy))
        assert (copy / "run.json").read_bytes() == before
        assert p.poll() is None  # the holder goes on
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    done = len(read_metrics(copy))
    r = run("train", "--resume", copy, "--iterations", done + 1)
    assert r.exit_code == 0, r.output
    its = [row["iteration"] for row in read_metrics(copy)]
    assert its == list(range(done + 1))


def test_a_new_run_and_a_staged_run_into_a_locked_folder_are_refused(base, tmp_path):
    folder = tmp_path / "busy"
    with runlock.lock(folder, create=True):
        before = snapshot(folder)
        one_line_error(run("train", *FAST, "--iterations", 1, "--run-dir", folder), f"pid {os.getpid()}")
        one_line_error(run("train", "--trees", base / "trees", "--run-dir", folder), f"pid {os.getpid()}")
        assert snapshot(folder) == before
    assert not (folder / ".lock").exists()  # released and removed
    r = run("train", "--trees", base / "trees", "--run-dir", folder)  # free again
    assert r.exit_code == 0, r.output


def test_a_two_process_resume_of_a_locked_run_is_refused_by_rank_0(copy):
    """Rank 0 holds the lock of a data-parallel run: refused there, the command says so in one line."""
    before = snapshot(copy)
    with runlock.lock(copy):
        q = subprocess.run(
            [sys.executable, "-m", "treegrpo_cli", "train", "--resume", str(copy), "--iterations", "3"]
            + ["--nproc-per-node", "2"],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert q.returncode == 1, q.stderr
    lines = q.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {os.getpid()}" in lines[0], q.stderr
    assert snapshot(copy) == before


# --- 2. a stopped run exits non-zero and says how to resume ---------------------------------------


def test_ctrl_c_checkpoints_exits_130_and_resumes(tmp_path):
    folder = tmp_path / "r"
    p = _train_proc([*FAST, "--iterations", 200, "--set", "train.eval_samples=0", "--run-dir", folder])
    _wait_rows(folder, 1, p)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=120) == 130
    err = p.stderr.read().decode()
    assert "stopped early" in err and f"treegrpo train --resume {folder}" in err, err
    assert "Traceback" not in err
    done = read_metrics(folder)
    assert list_checkpoints(folder / "checkpoints")[-1].name == f"step-{len(done)}"
    r = run("train", "--resume", folder, "--iterations", len(done) + 1)
    assert r.exit_code == 0, r.output
    assert [row["iteration"] for row in read_metrics(folder)] == list(range(len(done) + 1))


def test_sigterm_to_a_two_process_run_stops_both_checkpoints_exits_143_and_resumes(tmp_path):
    """SIGTERM to the `--nproc-per-node 2` launcher reaches both processes: they stop after the same
    iteration, rank 0 checkpoints, the command exits 143 with one line on how to resume (no error line)."""
    folder = tmp_path / "r"
    sets = [*FAST, "--set", "rollout.num_prompts=4", "--set", "train.eval_samples=0"]
    p = _train_proc([*sets, "--iterations", 200, "--run-dir", folder, "--nproc-per-node", 2])
    try:
        _wait_rows(folder, 1, p, timeout=240)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=180) == 143
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read().decode()
    assert "stopped early" in err and f"treegrpo train --resume {folder}" in err and "Error" not in err, err
    done = read_metrics(folder)
    assert list_checkpoints(folder / "checkpoints")[-1].name == f"step-{len(done)}"
    assert not (folder / ".lock").exists()
    r = run("train", "--resume", folder, "--iterations", len(done) + 1)
    assert r.exit_code == 0, r.output
    assert [row["iteration"] for row in read_metrics(folder)] == list(range(len(done) + 1))


# --- 3. internal errors and error lines ------------------------------------------------------------


def _bug_line(result) -> Path:
    one_line_error(result, "RuntimeError: injected failure", "this is a bug", "the traceback is in")
    assert result.exit_code == 1
    path = Path(result.stderr.strip().split("the traceback is in ", 1)[1].rstrip("."))
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "injected failure" in text and "this is a bug" in text
    return path


def test_an_internal_error_in_training_writes_its_traceback_to_the_run_folder(tmp_path, monkeypatch):
    from treegrpo_cli.training import loop

    def broken(self, *a, **k):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(loop.Trainer, "iteration", broken)
    path = _bug_line(run("train", *FAST, "--iterations", 2, "--run-dir", tmp_path / "r"))
    assert path.parent == tmp_path / "r" and path.name.startswith("error-")
    assert "broken" in path.read_text()  # the frame that raised


def test_an_internal_error_without_a_run_folder_goes_to_the_temp_folder(tmp_path, monkeypatch):
    import tempfile

    from treegrpo_cli import config

    def broken():
        raise RuntimeError("injected failure")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(config, "preset_names", broken)
    assert _bug_line(run("presets")).parent == tmp_path


def test_an_internal_error_in_a_process_prints_one_line_and_no_traceback(tmp_path):
    """The real process (not the test runner): a sitecustomize makes the loop raise."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import treegrpo_cli.training.loop as loop\n"
        "def broken(self, *a, **k):\n"
        "    raise RuntimeError('injected failure')\n"
        "loop.Trainer.iteration = broken\n"
    )
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    q = subprocess.run(
        [sys.executable, "-m", "treegrpo_cli", "train", *FAST, "--iterations", "1", "--run-dir", str(tmp_path / "r")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = q.stderr.strip().splitlines()
    assert q.returncode == 1 and "Traceback" not in q.stderr, q.stderr
    assert lines[-1].startswith("Error: RuntimeError: injected failure") and "this is a bug" in lines[-1]
    assert [ln for ln in lines if ln.startswith("Error")] == [lines[-1]]
    errors = list((tmp_path / "r").glob("error-*.txt"))
    assert len(errors) == 1 and "injected failure" in errors[0].read_text()


@pytest.mark.parametrize(
    "name", ["a\nError: a second line", "a\rb", "tab\there", "esc\x1b[31mred", "nel\x85x", "ls\u2028x"]
)
def test_a_path_with_control_characters_gives_exactly_one_line(tmp_path, name):
    r = run("train", "--resume", tmp_path / name)
    one_line_error(r, "no such run folder")
    assert "\x1b" not in r.stderr and "\t" not in r.stderr and "\r" not in r.stderr
    r = run("compare", tmp_path / name, "--out", tmp_path / "c")
    one_line_error(r, "no such run folder")


# --- 4. the code that wrote the run --------------------------------------------------------------


def test_run_json_records_the_version_and_commit_and_a_resume_under_other_code_warns(copy):
    info = json.loads((copy / "run.json").read_text())
    pkg = Path(rundir.__file__).resolve().parents[1]
    git = subprocess.run(["git", "-C", str(pkg), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = git.stdout.strip() if git.returncode == 0 else None
    assert info["treegrpo"] == {"version": __version__, "commit": commit}
    r = run("train", "--resume", copy, "--iterations", 3)
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output  # same code: nothing to say
    rewrite_json(copy / "run.json", lambda i: i.update(treegrpo={"version": "0.0.1", "commit": "0123abc"}))
    r = run("train", "--resume", copy, "--iterations", 4)
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning")]
    assert len(warnings) == 1 and "0.0.1" in warnings[0] and "0123abc" in warnings[0] and __version__ in warnings[0]


# --- 5. damaged run files ----------------------------------------------------------------------------


def _no_config(i):
    del i["config"]


def _tree_shape(i):
    i["config"]["tree"]["branch"] = 2


def _metrics_line(text):
    def damage(folder):
        with open(folder / "metrics.jsonl", "a") as f:
            f.write(text + "\n")

    return damage


def _eval_line(text):
    def damage(folder):
        with open(folder / "eval.jsonl", "a") as f:
            f.write(text + "\n")

    return damage


def _replace_with_loop(name):
    def damage(folder):
        p = folder / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        os.symlink(name, p)

    return damage


def _replace_with_dir(name):
    def damage(folder):
        (folder / name).unlink()
        (folder / name).mkdir()

    return damage


DAMAGE = {
    "run.json without config": (lambda f: rewrite_json(f / "run.json", _no_config), ["run.json", "config"]),
    "run.json config a list": (
        lambda f: rewrite_json(f / "run.json", lambda i: i.update(config=[1, 2])),
        ["run.json", "config"],
    ),
    "run.json prompts a string": (
        lambda f: rewrite_json(f / "run.json", lambda i: i.update(prompts="default")),
        ["run.json", "prompts"],
    ),
    "run.json prompt record a list": (
        lambda f: rewrite_json(f / "run.json", lambda i: i["prompts"].update(train=[1])),
        ["run.json", "prompts.train"],
    ),
    "run.json version a string": (
        lambda f: rewrite_json(f / "run.json", lambda i: i.update(version="1")),
        ["run.json", "version", "'1'"],
    ),
    "run.json version 2": (lambda f: rewrite_json(f / "run.json", lambda i: i.update(version=2)), ["run.json", "2"]),
    "run.json a list": (lambda f: (f / "run.json").write_text("[1]"), ["run.json", "not a treegrpo run"]),
    "run.json treegrpo a string": (
        lambda f: rewrite_json(f / "run.json", lambda i: i.update(treegrpo="0.1.0")),
        ["run.json", "treegrpo"],
    ),
    "run.json a folder": (_replace_with_dir("run.json"), ["run.json", "not a regular file"]),
    "run.json config edited to another tree shape": (
        lambda f: rewrite_json(f / "run.json", _tree_shape),
        ["tree.branch", "step-2"],
    ),
    "metrics iteration a word": (_metrics_line('{"iteration": "zero"}'), ["metrics.jsonl", "line 3", "iteration"]),
    "metrics iteration negative": (_metrics_line('{"iteration": -1}'), ["metrics.jsonl", "line 3", "iteration"]),
    "metrics iteration repeated": (_metrics_line('{"iteration": 1}'), ["metrics.jsonl", "line 3", "iteration 1"]),
    "metrics reward a word": (
        _metrics_line('{"iteration": 2, "reward_mean": "high"}'),
        ["metrics.jsonl", "line 3", "reward_mean"],
    ),
    "metrics wall a list": (_metrics_line('{"iteration": 2, "wall": [1]}'), ["metrics.jsonl", "line 3", "wall"]),
    "metrics seconds a number": (
        _metrics_line('{"iteration": 2, "seconds": 3}'),
        ["metrics.jsonl", "line 3", "seconds"],
    ),
    "eval reward a word": (_eval_line('{"iteration": 2, "reward_mean": "high"}'), ["eval.jsonl", "reward_mean"]),
    "eval iteration a string": (_eval_line('{"iteration": "2", "reward_mean": 0.5}'), ["eval.jsonl", "iteration"]),
    "eval without reward": (_eval_line('{"iteration": 2}'), ["eval.jsonl", "reward_mean"]),
    "checkpoints a symlink loop": (_replace_with_loop("checkpoints"), ["checkpoints", "not a folder"]),
    "checkpoints a file": (
        lambda f: (shutil.rmtree(f / "checkpoints"), (f / "checkpoints").write_text("x")),
        ["checkpoints", "not a folder"],
    ),
    "metrics a symlink loop": (_replace_with_loop("metrics.jsonl"), ["metrics.jsonl", "not a regular file"]),
    "metrics a folder": (_replace_with_dir("metrics.jsonl"), ["metrics.jsonl", "not a regular file"]),
    "eval a folder": (_replace_with_dir("eval.jsonl"), ["eval.jsonl", "not a regular file"]),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_run_is_refused_before_anything_is_written(copy, name):
    damage, needles = DAMAGE[name]
    damage(copy)
    before = snapshot(copy)
    one_line_error(run("train", "--resume", copy, "--iterations", 3), *needles)
    assert snapshot(copy) == before, "a refused resume changed the run folder"


COMPARE_DAMAGE = [n for n in DAMAGE if n.startswith(("run.json", "metrics", "eval")) and "shape" not in n]


@pytest.mark.parametrize("name", COMPARE_DAMAGE)
def test_compare_refuses_a_damaged_run(copy, tmp_path, name):
    damage, needles = DAMAGE[name]
    damage(copy)
    before = snapshot(copy)
    one_line_error(run("compare", copy, "--out", tmp_path / "c"), *[n for n in needles if n != "step-2"])
    assert snapshot(copy) == before and not (tmp_path / "c").exists()


def test_compare_refuses_an_eval_file_of_garbage_rows(copy, tmp_path):
    (copy / "eval.jsonl").write_text('{"iteration": 0, "reward_mean": "x"}\n{"iteration": 2, "reward_mean": null}\n')
    one_line_error(run("compare", copy, "--out", tmp_path / "c"), "eval.jsonl", "line 1", "reward_mean")


@pytest.mark.parametrize("how", ["no manifest", "renamed step-abc", "trainer state edited", "manifest a list"])
def test_a_damaged_newest_checkpoint_is_named_and_skipped(copy, how):
    """The newest checkpoint lacks its manifest, has a name that is no step, or was edited: a warning names
    it, the run resumes from the one before, and the history before that checkpoint is kept as it was."""
    newest = copy / "checkpoints" / "step-2"
    shown = "step-2"
    if how == "no manifest":
        (newest / "manifest.json").unlink()
    elif how == "renamed step-abc":
        newest.rename(copy / "checkpoints" / "step-abc")
        shown = "step-abc"
    elif how == "trainer state edited":
        rewrite_json(newest / "trainer_state.json", lambda i: i.update(config=[1]))
    else:
        (newest / "manifest.json").write_text("[1, 2]")
    first = (copy / "metrics.jsonl").read_text().splitlines()[0]
    r = run("train", "--resume", copy, "--iterations", 3)
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning")]
    assert any(shown in w and ("skipped" in w or "falling back" in w) for w in warnings), r.stderr
    assert "from checkpoint step-1" in r.stderr
    assert (copy / "metrics.jsonl").read_text().splitlines()[0] == first
    assert [row["iteration"] for row in read_metrics(copy)] == [0, 1, 2]


def test_no_good_checkpoint_left_says_so_and_recomputes_the_same_history(copy):
    rows = read_metrics(copy)
    for p in (copy / "checkpoints").iterdir():
        p.rename(p.with_name("step-x" + p.name[5:]))
    r = run("train", "--resume", copy)
    assert r.exit_code == 0, r.output
    assert "step-x1" in r.stderr and "step-x2" in r.stderr and "iteration 0" in r.stderr
    assert comparable(read_metrics(copy)) == comparable(rows)


# --- conflicting options -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--resume", "{run}"], "--resume"),
        (["--iterations", "3"], "--iterations"),
        (["--preset", "branch"], "--preset"),
        (["--config", "{cfg}"], "--config"),
        (["--prompts", "shapes-train"], "--prompts"),
    ],
)
def test_train_trees_refuses_options_it_would_ignore(base, copy, tmp_path, extra, needle):
    (tmp_path / "c.toml").write_text("[train]\nlr = 0.001\n")
    extra = [e.replace("{run}", str(copy)).replace("{cfg}", str(tmp_path / "c.toml")) for e in extra]
    before = snapshot(copy)
    one_line_error(run("train", "--trees", base / "trees", "--run-dir", tmp_path / "new", *extra), "--trees", needle)
    assert not (tmp_path / "new").exists() and snapshot(copy) == before


@pytest.mark.parametrize("extra,needle", [(["--preset", "branch"], "--preset"), (["--config", "{cfg}"], "--config")])
def test_resume_refuses_options_it_would_ignore(copy, tmp_path, extra, needle):
    (tmp_path / "c.toml").write_text("[train]\nlr = 0.001\n")
    extra = [e.replace("{cfg}", str(tmp_path / "c.toml")) for e in extra]
    before = snapshot(copy)
    one_line_error(run("train", "--resume", copy, *extra), "--resume", needle)
    assert snapshot(copy) == before


def test_a_new_run_or_a_compare_page_refuses_a_foreign_non_empty_folder(tmp_path):
    """`train --run-dir` and `compare --out` into a folder of the user's own files: one line, nothing written."""
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    one_line_error(run("train", *FAST, "--iterations", 1, "--run-dir", foreign), "not empty")
    r = run("train", *FAST, "--iterations", 1, "--run-dir", tmp_path / "run")
    assert r.exit_code == 0, r.output
    one_line_error(run("compare", tmp_path / "run", "--out", foreign), "not empty")
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert run("compare", tmp_path / "run", "--out", tmp_path / "page").exit_code == 0
    assert run("compare", tmp_path / "run", "--out", tmp_path / "page").exit_code == 0  # its own page: replaced
