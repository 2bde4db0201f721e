"""Reward plugins (docs/rewards.md, "Your own reward"): an installed distribution's entry point of the group
treegrpo.rewards, FILE.py:FN and MODULE:FN train like built-in rewards; a plugin's failures are one line naming it;
a run with a file reward resumes row for row and refuses a changed file; a plugin may not take a built-in name."""

import json
import os
import re
import sys

import numpy as np
import pytest
import torch
from clitools import one_line_error, run, treegrpo

from treegrpo_cli.errors import ConfigError, TreegrpoError
from treegrpo_cli.rewards import plugins
from treegrpo_cli.rewards.base import get_reward, parse_reward_options, spec
from treegrpo_cli.training.runlog import read_metrics, without_timings

TINY = [
    "--preset",
    "tree-grpo",
    "--set",
    'model="pixel-tiny"',
    "--set",
    "rollout.num_prompts=2",
    "--set",
    "train.sample_every=0",
    "--set",
    "train.eval_samples=0",
    "--set",
    "train.save_every=1",
]

REWARDS = """\
import torch

def brightness(images, prompts, scale="1"):
    return images.mean(dim=(1, 2, 3)) * float(scale)

class Redness:
    def __init__(self, device=None, offset="0"):
        self.device, self.offset = device, float(offset)

    def __call__(self, images, prompts):
        return [float(x) + self.offset for x in images[:, 0].mean(dim=(1, 2))]

def raises(images, prompts):
    raise ValueError("the plugin broke\\nwith a second line")

def too_few(images, prompts):
    return torch.zeros(len(prompts) - 1)

def nan(images, prompts):
    return [float("nan")] * len(prompts)

def words(images, prompts):
    return ["bright"] * len(prompts)
"""


def forget_modules():
    for name in [m for m in sys.modules if m.split(".")[0] in ("mypkg", "mymod")]:
        del sys.modules[name]


@pytest.fixture
def fresh_entry_points():
    """Entry points are listed once per process, and modules imported once: both anew around a test that changes
    sys.path (the plugin modules of one test's folder are not another's)."""
    plugins.entry_points.cache_clear()
    forget_modules()
    yield
    plugins.entry_points.cache_clear()
    forget_modules()


def site(root, dist: str, entry_points: str):
    """A site folder holding the package mypkg (mypkg.rewards: REWARDS) and the distribution `dist` declaring
    `entry_points` (what pip would leave there)."""
    (root / "mypkg").mkdir(parents=True, exist_ok=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "rewards.py").write_text(REWARDS)
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[treegrpo.rewards]\n{entry_points}\n")
    return root


def rows(run_dir):
    return read_metrics(run_dir)


@pytest.mark.slow
def test_an_installed_entry_point_trains_by_its_name(tmp_path):
    """(a) a distribution on PYTHONPATH declaring mybright = mypkg.rewards:brightness: `--reward mybright`."""
    root = site(tmp_path / "site", "mypkg", "mybright = mypkg.rewards:brightness")
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    r = treegrpo(
        *TINY, "--reward", "mybright", "--iterations", 2, "--run-dir", tmp_path / "r", env={"PYTHONPATH": path}
    )
    assert r.returncode == 0, r.stderr
    got = rows(tmp_path / "r")
    assert len(got) == 2
    for row in got:
        assert row["rewards/mybright/mean"] == pytest.approx(row["reward_mean"]) and 0 < row["reward_mean"] < 1
    assert json.loads((tmp_path / "r" / "run.json").read_text())["config"]["reward"]["names"] == ["mybright"]


def test_entry_points_load_only_when_named(tmp_path, monkeypatch, fresh_entry_points):
    monkeypatch.syspath_prepend(str(site(tmp_path, "mypkg", "mybright = mypkg.rewards:brightness")))
    assert "mybright" in plugins.entry_points() and spec("shapes").name == "shapes"
    assert "mypkg.rewards" not in sys.modules  # listed, not imported
    reward = get_reward("mybright", scale="2")
    assert "mypkg.rewards" in sys.modules and spec("mybright").options == ("scale",)
    assert torch.allclose(reward(torch.full((3, 3, 4, 4), 0.25), ["a"] * 3), torch.full((3,), 0.5))


def test_a_file_reward_trains_with_its_options(tmp_path):
    """(b) --reward FILE.py:FN, its option given as --reward-opt FILE.py:FN.KEY=VALUE."""
    (tmp_path / "mine.py").write_text(REWARDS)
    name = f"{tmp_path / 'mine.py'}:brightness"
    r = run(
        "train",
        *TINY,
        "--reward",
        name,
        "--reward-opt",
        f"{name}.scale=100",
        "--iterations",
        2,
        "--run-dir",
        tmp_path / "r",
    )
    assert r.exit_code == 0, r.output
    assert name in r.stderr  # the run header names it
    got = rows(tmp_path / "r")
    assert len(got) == 2 and all(5 < row[f"rewards/{name}/mean"] < 100 for row in got)  # 100 brightnesses


def test_a_module_callable_trains(tmp_path, monkeypatch, fresh_entry_points):
    """(c) --reward MODULE:FN, and a reward class with an option (MODULE:Class)."""
    (tmp_path / "mymod.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    r = run("train", *TINY, "--reward", "mymod:brightness,mymod:Redness", "--weights", "1,0.5",
            "--reward-opt", "mymod:Redness.offset=10", "--iterations", 2, "--run-dir", tmp_path / "r")  # fmt: skip
    assert r.exit_code == 0, r.output
    for row in rows(tmp_path / "r"):
        assert 0 < row["rewards/mymod:brightness/mean"] < 1 and 10 < row["rewards/mymod:Redness/mean"] < 11
        want = row["rewards/mymod:brightness/mean"] + 0.5 * row["rewards/mymod:Redness/mean"]
        assert row["reward_mean"] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        ("raises", "failed: ValueError: the plugin broke"),
        ("too_few", "returned 53 scores for 54 images"),
        ("nan", "returned nan for image 0"),
        ("words", "returned a non-number for image 0: 'bright'"),
        ("nothing_here", "has no nothing_here"),
    ],
)
def test_a_plugin_that_fails_is_one_line_naming_it(tmp_path, fn, says):
    """(d) raises, the wrong number of scores, NaN, non-numbers, a missing function: one line, no traceback."""
    (tmp_path / "mine.py").write_text(REWARDS)
    name = f"{tmp_path / 'mine.py'}:{fn}"
    one_line_error(run("train", *TINY, "--reward", name, "--run-dir", tmp_path / "r"), f"reward '{name}'", says)


def test_a_plugin_that_fails_to_import_is_one_line_naming_it(tmp_path, monkeypatch, fresh_entry_points):
    (tmp_path / "broken.py").write_text("import a_module_that_is_not_there\n")
    name = f"{tmp_path / 'broken.py'}:score"
    one_line_error(run("train", *TINY, "--reward", name), f"reward '{name}'", "fails to import", "ModuleNotFound")
    one_line_error(run("train", *TINY, "--reward", "no_such_module_x:score"), "'no_such_module_x:score'", "import")
    one_line_error(run("train", *TINY, "--reward", f"{tmp_path / 'gone.py'}:score"), "no file")
    monkeypatch.syspath_prepend(str(site(tmp_path / "s", "brokenpkg", "mybroken = brokenpkg_missing.rewards:f")))
    one_line_error(
        run("train", *TINY, "--reward", "mybroken"), "reward 'mybroken'", "brokenpkg 0.1", "cannot be loaded"
    )


@pytest.mark.slow
def test_a_run_with_a_file_reward_resumes_row_for_row_and_refuses_another_file(tmp_path, monkeypatch):
    """(e) the run records the file (path as given, content hash): a resume repeats the uninterrupted run."""
    (tmp_path / "mine.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)  # the path as given: relative to where the run is started and resumed
    for run_dir, iterations in (("a", 2), ("b", 1)):
        r = run("train", *TINY, "--reward", "mine.py:brightness", "--iterations", iterations, "--run-dir", run_dir)
        assert r.exit_code == 0, r.output
    info = json.loads((tmp_path / "b" / "run.json").read_text())
    assert info["reward_files"]["mine.py:brightness"]["path"] == str(tmp_path / "mine.py")
    r = run("train", "--resume", "b", "--iterations", 2)
    assert r.exit_code == 0, r.output
    assert without_timings(read_metrics(tmp_path / "b")) == without_timings(read_metrics(tmp_path / "a"))
    (tmp_path / "mine.py").write_text(REWARDS + "\n# edited\n")
    one_line_error(run("train", "--resume", "b", "--iterations", 3), "reward 'mine.py:brightness'", "changed")
    (tmp_path / "mine.py").unlink()
    one_line_error(run("train", "--resume", "b", "--iterations", 3), "reward 'mine.py:brightness'", "no file")


def test_a_plugin_may_not_take_a_built_in_name(tmp_path, monkeypatch, fresh_entry_points):
    """(f) an entry point named like a built-in: refused when the name is used, naming both ways out."""
    monkeypatch.syspath_prepend(str(site(tmp_path, "shadowpkg", "shapes = mypkg.rewards:brightness")))
    one_line_error(
        run("train", *TINY, "--reward", "shapes"), "'shapes' is built in", "shadowpkg", "mypkg.rewards:brightness"
    )
    assert spec("jpeg-compressibility").name == "jpeg-compressibility"  # the other built-ins are untouched


def test_scores_are_one_finite_number_per_image():
    ok = [torch.ones(3), torch.ones(3, 1), np.ones(3), [1, 2.5, np.float32(3)], (torch.tensor(1.0),) * 3]
    for out in ok:
        assert plugins.scores_of("p", out, 3).shape == (3,)
    for out, says in [
        (torch.ones(3, 2), "shape [3, 2]"),
        (torch.ones(2), "2 scores for 3 images"),
        ([1, None, 2], "non-number for image 1"),
        (np.array(["a", "b", "c"]), "not of numbers"),
        ({"a": 1}, "returned a dict"),
        (torch.tensor([1.0, float("inf"), 0.0]), "inf for image 1"),
    ]:
        with pytest.raises(TreegrpoError, match=f"reward 'p' .*{re.escape(says)}"):
            plugins.scores_of("p", out, 3)


def test_plugin_names_and_options_parse(tmp_path):
    (tmp_path / "mine.py").write_text(REWARDS)
    name = f"{tmp_path / 'mine.py'}:brightness"
    assert parse_reward_options([f"{name}.scale=3", "hps.checkpoint=/x.pt"]) == {
        name: {"scale": "3"},
        "hps": {"checkpoint": "/x.pt"},
    }
    with pytest.raises(ConfigError, match="no option 'nope'"):
        parse_reward_options([f"{name}.nope=1"])
    with pytest.raises(ConfigError, match="FILE.py:FUNCTION"):
        spec("mine.py")
    with pytest.raises(ConfigError, match="neither a reward name"):
        spec("not a module:f")
    assert spec("http://127.0.0.1:9/").name == "http://127.0.0.1:9/"  # the remote reward is no plugin
