"""Files the user cannot read and folders they cannot write, as a user without root's override (`nobody`
through setpriv): one line, a non-zero exit, nothing left behind. Root reads and writes through any mode
bits, so these cases only mean something as another user; the test runs the CLI as one."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
PIXEL = ["--set", 'model="pixel-tiny"', "--set", "train.eval_samples=0", "--set", "train.sample_every=0"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None, reason="needs root to run the CLI as another user (setpriv)"
)


@pytest.fixture
def shared():
    """A folder `nobody` can enter (a test's own tmp_path is root's, mode 700)."""
    root = Path(tempfile.mkdtemp(prefix="treegrpo-perm-", dir=os.environ.get("TMPDIR", "/tmp")))
    root.chmod(0o777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def as_nobody(*args, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-m", "treegrpo_cli"]
    env = dict(os.environ, HOME=str(cwd), TMPDIR=str(cwd))
    return subprocess.run(cmd + [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def one_line(r: subprocess.CompletedProcess, *words: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w.lower() in lines[0].lower() for w in words), lines[0]


@pytest.mark.slow
def test_the_cli_runs_as_nobody(shared):
    r = as_nobody("presets", cwd=shared)
    assert r.returncode == 0 and "tree-grpo" in r.stdout, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--config", "--prompts"])
def test_an_unreadable_input_file(shared, option):
    f = shared / ("c.toml" if option == "--config" else "p.txt")
    f.write_text("seed = 1\n" if option == "--config" else "a red circle\n")
    f.chmod(0o000)
    r = as_nobody("train", *PIXEL, option, f, "--iterations", 1, "--run-dir", shared / "run", cwd=shared)
    one_line(r, str(f.name))
    assert not (shared / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["train", *PIXEL, "--iterations", 1, "--run-dir", "RO/run"],
        ["rollout", "--preset", "tree-grpo", "--set", 'model="pixel-tiny"', "--num-prompts", 1, "--out", "RO/trees"],
        ["eval", "--model", "pixel-tiny", "--metric", "jpeg-compressibility", "--num-images", 1, "--out", "RO/out"],
    ],
    ids=["train", "rollout", "eval"],
)
def test_a_read_only_folder(shared, command):
    ro = shared / "RO"
    ro.mkdir()
    ro.chmod(0o555)
    r = as_nobody(*command, cwd=shared)
    one_line(r, "RO")
    assert list(ro.iterdir()) == []
