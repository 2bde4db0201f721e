"""Bad input on the adaptive trees' options ([tree] dynamic, [budget], [splits]) and the [policy] speed keys:
legal values that change nothing or stop everything warn, in one line, on train, rollout, resume and config show;
staged, scored and resumed runs refuse the keys they cannot change, with exit 2, leaving their folders as they
were. (Their bad values are cases of test_bad_input_values.py.)"""

import json
import shutil

import pytest
import test_bad_input_runs
from clitools import PIXEL, one_line_error, run, snapshot

from treegrpo_cli import config
from treegrpo_cli.errors import ConfigError

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out

MOVING, DYNAMIC, BUDGET = "branch-mix-flow-moving-splits", "treepo", "branch-mix-flow-budget"
base, copy = test_bad_input_runs.base, test_bad_input_runs.copy  # its fixtures: a finished run and scored trees


def _warned(preset, *sets):
    return " | ".join(config.load_config(preset, sets=list(sets)).warnings())


def test_adaptive_options_that_change_nothing_or_stop_everything_warn():
    # keys that the chosen kind, mode or heuristic ignores
    assert "splits.early, splits.late set, but splits.kind = 'static' ignores them" in _warned(
        "branch", "splits.early=[0, 1]", "splits.late=[3, 4]"
    )
    assert "splits.early, splits.late, splits.over set, but splits.kind = 'adaptive'" in _warned(
        MOVING, 'splits.kind="adaptive"'
    )
    assert "budget.floor set, but budget.mode = 'off' ignores it" in _warned("branch", "budget.floor=0.5")
    assert "tree.stop_tol set, but tree.dynamic = 'off' ignores it" in _warned(DYNAMIC, 'tree.dynamic="off"')
    # values that stop no node, every node, move no leaf, or leave a group of one image
    assert "tree.stop_tol = 0 stops only identical x0-predictions" in _warned("branch", 'tree.dynamic="distance"')
    assert "tree.stop_tol = 1.5 is at least the distance of two unrelated" in _warned(DYNAMIC, "tree.stop_tol=1.5")
    assert "every advantage is 0" in _warned(DYNAMIC, "tree.width=1")
    assert "moves no leaves" in _warned(BUDGET, "budget.min_width=16")
    assert "U-shaped" in _warned(MOVING, "splits.kappa=0.5")
    # a diffusers model reads [policy]: a share that takes no effect
    flux = 'model="flux-dev"'
    assert "takes effect only with policy.gradient_checkpointing = true" in _warned(
        None, flux, "policy.gradient_checkpointing=false", "policy.checkpoint_blocks=0.5"
    )
    assert "policy.checkpoint_blocks = 0 recomputes no block" in _warned(None, flux, "policy.checkpoint_blocks=0")
    # the same keys where they count
    for preset, sets in [
        ("branch", ['tree.dynamic="reward"']),  # a tie of rewards can be exact
        (DYNAMIC, ["tree.stop_tol=0.4"]),
        (BUDGET, ["budget.min_width=4"]),
        (BUDGET, ["budget.min_width=16", "budget.replace_after=1"]),  # replaces tied prompts, at least
        (MOVING, ["splits.kappa=6", "splits.over=10"]),
        ("branch", ['splits.kind="adaptive"', 'splits.low_reward="later"', "budget.decay=0.9"]),
        (None, [flux, "policy.checkpoint_blocks=0.5"]),  # its default: gradient checkpointing on
    ]:
        assert config.load_config(preset, sets=sets).warnings() == [], (preset, sets)


def test_budget_bounds_are_checked_against_the_tree_the_moving_splits_sample():
    """Two moving splits make a tree of 4 leaves, whatever tree.split_steps says (16 on branch)."""
    sets = ['splits.kind="progress"', "splits.early=[0, 1]", "splits.late=[0, 5]", 'budget.mode="spread"']
    assert config.load_config("branch", sets=[*sets, "budget.max_width=8"]).budget.max_width == 8
    with pytest.raises(ConfigError, match="budget.max_width = 3 is below the tree's 4 leaves"):
        config.load_config("branch", sets=[*sets, "budget.max_width=3"])


def test_replace_after_runs_where_estimates_are_kept():
    assert config.load_config("branch", sets=['budget.mode="spread"', "budget.replace_after=2"]).warnings() == []
    assert config.load_config("branch", sets=['splits.kind="adaptive"', "budget.replace_after=2"])


def test_a_rollout_prints_the_warnings_and_runs(tmp_path):
    r = run("rollout", *PIXEL, "--preset", DYNAMIC, "--set", "tree.stop_tol=2", "-n", 1, "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("warning:")]  # one line, however long
    assert line.startswith("warning: tree.stop_tol = 2 is at least the distance of two unrelated")
    assert line.endswith("nearly every node would stop (treepo: 0.1)"), line


def test_config_show_says_the_warnings_train_would(tmp_path):
    r = run("config", "show", "--preset", "branch", "--set", 'tree.dynamic="distance"', "--json")
    assert r.exit_code == 0, r.output
    assert "warning: tree.dynamic = 'distance' with tree.stop_tol = 0" in r.stderr
    assert json.loads(r.stdout)["config"]["tree"]["dynamic"] == "distance"  # stdout stays JSON
    assert run("config", "show", "--preset", "branch").stderr == ""


def test_a_staged_rollout_of_an_iteration_planned_from_rewards_is_a_usage_error(tmp_path):
    r = run("rollout", *PIXEL, "--preset", BUDGET, "-n", 1, "--iteration", 3, "--out", tmp_path / "o")
    one_line_error(r, "iteration 3", "budget.mode")
    assert r.exit_code == 2 and not (tmp_path / "o").exists()


# --- staged and resumed runs ---------------------------------------------------------------------------------

NOT_FOR_STAGED = [
    "tree.stop_tol=0.5",
    'tree.dynamic="reward"',
    'splits.kind="adaptive"',
    'budget.mode="spread"',
    "sampler.eta=0.9",
    'reward.names=["jpeg-incompressibility"]',
    'model="tiny-shapes"',
    "seed=3",
]


@pytest.mark.parametrize("item", NOT_FOR_STAGED)
def test_train_trees_refuses_keys_of_the_rollout_and_scoring(base, tmp_path, item):
    """Trees already rolled out and scored cannot take another tree, sampler, reward or seed: exit 2, one line."""
    before = snapshot(base / "trees")
    r = run("train", "--trees", base / "trees", "--run-dir", tmp_path / "new", "--set", item)
    one_line_error(r, "train --trees cannot change", item.split("=")[0])
    assert r.exit_code == 2
    assert not (tmp_path / "new").exists() and snapshot(base / "trees") == before


def test_train_trees_takes_training_and_policy_keys(base, tmp_path):
    sets = ["--set", "train.lr=1e-4", "--set", "rollout.max_batch=8", "--set", 'policy.attention="default"']
    r = run("train", "--trees", base / "trees", "--run-dir", tmp_path / "new", *sets)
    assert r.exit_code == 0, r.output


def test_train_trees_warns_of_what_its_overrides_set(base, tmp_path):
    """The overrides' warnings, once each; the rollout's own were said when it ran."""
    r = run("train", "--trees", base / "trees", "--run-dir", tmp_path / "a", "--set", "train.clip_range=2")
    assert r.exit_code == 0, r.output
    assert r.output.count("warning: train.clip_range = 2 clips nothing") == 1
    r = run("train", "--trees", base / "trees", "--run-dir", tmp_path / "b")
    assert r.exit_code == 0 and "warning" not in r.output, r.output


@pytest.mark.parametrize(
    "item",
    ["tree.stop_tol=0.5", "tree.transfer=false", 'budget.mode="spread"', "budget.decay=0.9", "splits.kappa=4"],
)
def test_resume_refuses_an_adaptive_option_changed_with_exit_2(copy, item):
    before = snapshot(copy)
    r = run("train", "--resume", copy, "--iterations", 3, "--set", item)
    one_line_error(r, "--resume keeps the run's settings", item.split("=")[0])
    assert r.exit_code == 2 and snapshot(copy) == before


@pytest.mark.parametrize("item", ["policy.checkpoint_blocks=2", 'policy.compile="yes"', 'policy.attention="fast"'])
def test_resume_refuses_a_bad_value_of_a_resumable_key(copy, item):
    before = snapshot(copy)
    r = run("train", "--resume", copy, "--iterations", 3, "--set", item)
    one_line_error(r, item.split("=")[0])
    assert r.exit_code == 2 and snapshot(copy) == before


def test_resume_prints_the_warnings_of_what_it_was_given(copy):
    """A resumable [policy] key on a built-in model is ignored: said on resume as on a new run."""
    r = run("train", "--resume", copy, "--iterations", 2, "--set", 'policy.compile="blocks"')
    assert r.exit_code == 0, r.output
    assert "warning: policy.compile set, but pixel-tiny is a built-in model and ignores [policy]" in r.stderr


@pytest.mark.parametrize("item", ["tree.stop_tol=0.5", 'budget.mode="spread"', 'policy.compile="blocks"'])
def test_score_refuses_keys_it_cannot_change_with_exit_2(base, tmp_path, item):
    trees = tmp_path / "trees"
    shutil.copytree(base / "trees", trees)
    before = snapshot(trees)
    r = run("score", trees, "--set", item)
    one_line_error(r, "score cannot change", item.split("=")[0])
    assert r.exit_code == 2 and snapshot(trees) == before
