"""Bad values, as a hostile user types them: counts that scale work have a stated
maximum checked in closed form before any work; values that cannot mean anything are refused;
config and prompt files that are not regular files say so; typer's own errors are one line; a run
name is a name, not a path. Every case exits non-zero with one line on stderr, no traceback, within
the time limit, and leaves the folders it was given exactly as they were."""

import os
from pathlib import Path

import pytest
from clitools import PIXEL, one_line_error, run, snapshot

from treegrpo_cli import config
from treegrpo_cli.engine.rollout import MAX_TREES_PER_PROMPT
from treegrpo_cli.engine.sde import MAX_STEPS
from treegrpo_cli.errors import ConfigError, TreegrpoError
from treegrpo_cli.prompts import load_prompts

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Inputs the cases point at: config and prompt files, a FIFO, a folder."""
    d = tmp_path_factory.mktemp("values")
    (d / "steps-int64.toml").write_text("[sampler]\nsteps = 9223372036854775807\n")
    (d / "steps-1e10.toml").write_text("[sampler]\nsteps = 10000000000\n")
    (d / "name-up.toml").write_text('name = "../escaped"\n')
    (d / "name-up3.toml").write_text('name = "../../../escaped"\n')
    (d / "name-abs.toml").write_text(f'name = "{d}/absolute"\n')
    (d / "name-newline.toml").write_text('name = "a\\nError: forged line"\n')
    (d / "name-dotdot.toml").write_text('name = ".."\n')
    (d / "name-backslash.toml").write_text('name = "a\\\\b"\n')
    return d


@pytest.fixture(scope="module")
def specials(tmp_path_factory):
    """A FIFO and a folder where files are expected (apart: reading a FIFO to compare it would block)."""
    d = tmp_path_factory.mktemp("specials")
    os.mkfifo(d / "fifo.toml")
    os.mkfifo(d / "fifo.txt")
    (d / "folder.toml").mkdir()
    (d / "folder.txt").mkdir()
    return d


T = "{t}"  # the test's own empty folder, where outputs go
F = "{f}"  # the shared files folder
S = "{s}"  # the special files
MOVING, DYNAMIC, BUDGET = "branch-mix-flow-moving-splits", "treepo", "branch-mix-flow-budget"
JPEG_TWICE = 'reward.names=["jpeg-compressibility", "jpeg-compressibility"]'
EVAL = ["eval", "--model", "pixel-tiny", "--metric", "jpeg-compressibility"]

# name -> (arguments, needles the one line must hold, strings it must not hold)
CASES = {
    # bounds, in closed form before any work (these hung or ran unbounded)
    "steps 1e10": (["train", *PIXEL, "--set", "sampler.steps=10000000000"], ["sampler.steps", f"{MAX_STEPS:,}"], []),
    "steps int64 in a toml": (["train", *PIXEL, "--config", F + "/steps-int64.toml"], ["sampler.steps"], []),
    "steps 1e10 in a toml": (
        ["rollout", *PIXEL, "--config", F + "/steps-1e10.toml", "--out", T + "/o"],
        ["sampler.steps"],
        [],
    ),
    "steps one past the maximum": (["train", *PIXEL, "--set", f"sampler.steps={MAX_STEPS + 1}"], ["sampler.steps"], []),
    "steps 1e10 on a branch tree": (
        ["train", *PIXEL, "--preset", "branch", "--set", "sampler.steps=10000000000"],
        ["sampler.steps"],
        [],
    ),
    "train timesteps 1e12": (
        [
            "train",
            *PIXEL,
            "--set",
            'sampler.grid="flow-match-euler"',
            "--set",
            "sampler.num_train_timesteps=1000000000000",
        ],
        ["sampler.num_train_timesteps", "maximum"],
        [],
    ),
    "num_prompts 1e6": (
        ["train", *PIXEL, "--set", "rollout.num_prompts=1000000"],
        ["rollout.num_prompts", "maximum"],
        [],
    ),
    "trees_per_prompt 1e8": (
        ["train", *PIXEL, "--set", "tree.trees_per_prompt=100000000"],
        ["tree.trees_per_prompt", "maximum"],
        [],
    ),
    "max_nodes beyond the hard maximum": (
        ["train", *PIXEL, "--set", "rollout.max_nodes=10000000000000"],
        ["rollout.max_nodes", "maximum"],
        [],
    ),
    "split at every step": (
        ["train", *PIXEL, "--preset", "branch", "--set", f"tree.split_steps={list(range(19))}"],
        ["nodes", "rollout.max_nodes"],
        [],
    ),
    "branch 1e9 at the hard node maximum": (
        [
            "train",
            *PIXEL,
            "--preset",
            "branch",
            "--set",
            "tree.branch=1000000000",
            "--set",
            "rollout.max_nodes=100000000",
        ],
        ["nodes", "rollout.max_nodes"],
        [],
    ),
    "eval_samples 1e8": (
        ["train", *PIXEL, "--set", "train.eval_samples=100000000"],
        ["train.eval_samples", "maximum"],
        [],
    ),
    "eval steps 1e8": ([*EVAL, "--steps", 100000000], ["--steps", "maximum"], []),
    "eval num-images 1e8": ([*EVAL, "--num-images", 100000000], ["--num-images", "maximum"], []),
    "eval images of all prompts": ([*EVAL, "--num-images", 50000], ["images", "maximum"], []),
    # values that cannot mean anything
    "reward names empty": (["train", *PIXEL, "--set", "reward.names=[]"], ["reward.names"], []),
    "reward a comma": (["train", *PIXEL, "--reward", ","], ["reward"], []),
    "reward names empty in a rollout": (
        ["rollout", *PIXEL, "--set", "reward.names=[]", "--out", T + "/o"],
        ["reward.names"],
        [],
    ),
    "reward twice with two weights": (
        ["train", *PIXEL, "--set", JPEG_TWICE, "--set", "reward.weights=[1, 2]"],
        ["reward.names", "twice"],
        [],
    ),
    "reward twice on the command line": (
        ["train", *PIXEL, "--reward", "jpeg-compressibility,jpeg-compressibility", "--weights", "1,2"],
        ["twice"],
        [],
    ),
    "reward weights all zero": (["train", *PIXEL, "--set", "reward.weights=[0]"], ["reward.weights", "zero"], []),
    "two reward weights zero": (
        ["train", *PIXEL, "--reward", "jpeg-compressibility,jpeg-incompressibility", "--weights", "0,0"],
        ["reward.weights", "zero"],
        [],
    ),
    "sample_every -1": (
        ["train", *PIXEL, "--set", "train.sample_every=-1"],
        ["train.sample_every"],
        ["kl_beta", "ema"],
    ),
    "kl_beta -1": (["train", *PIXEL, "--set", "train.kl_beta=-1"], ["train.kl_beta"], ["sample_every", "ema_decay"]),
    "eval_samples -1": (["train", *PIXEL, "--set", "train.eval_samples=-1"], ["train.eval_samples"], ["kl_beta"]),
    "ema_decay 1": (["train", *PIXEL, "--set", "train.ema_decay=1"], ["train.ema_decay"], ["kl_beta", "sample_every"]),
    # the adaptive options: [tree] dynamic, [budget], [splits], [policy] speed (values named with their key)
    "split steps named by the tree's key": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.early=[1, 1, 1, 1]"],
        ["splits.early", "[1, 1, 1, 1]", "ascending"],
        ["tree.split_steps"],
    ),
    "splits.late past the steps": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.late=[0, 3, 6, 30]"],
        ["splits.late", "30", "0..19"],
        ["tree.split_steps"],
    ),
    "splits.early negative": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.early=[-1, 1, 2, 3]"],
        ["splits.early", "-1", "0..19"],
        [],
    ),
    "splits.early out of order": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.early=[3, 2, 1, 0]"],
        ["splits.early", "ascending"],
        [],
    ),
    "splits.late past the tail guard": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.tail_guard=5", "--set", "splits.late=[0, 3, 6, 18]"],
        ["splits.late", "18", "14", "splits.tail_guard"],
        [],
    ),
    "splits.early closer than min_gap": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.min_gap=2"],
        ["splits.early", "[0, 1, 2, 3]", "splits.min_gap = 2"],
        [],
    ),
    "splits.tail_guard 1e9": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.tail_guard=1000000000"],
        ["splits.tail_guard", "1000000000", "no step"],
        [],
    ),
    "splits.late at the last step, decoding x0": (
        ["rollout", *PIXEL, "--preset", MOVING, "--set", "splits.late=[0, 3, 6, 19]", "--out", T + "/o"],
        ["splits.late", "last step 19"],
        [],
    ),
    "progress without early and late": (
        ["train", *PIXEL, "--preset", "branch", "--set", 'splits.kind="progress"'],
        ["splits.early", "splits.late", "got 0 and 0"],
        [],
    ),
    "splits.early and late of different lengths": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.early=[0, 1, 2]"],
        ["splits.early", "got 3 and 4"],
        [],
    ),
    "splits.early a string": (
        ["train", *PIXEL, "--preset", MOVING, "--set", 'splits.early="0,1,2,3"'],
        ["splits.early", "a list of integers"],
        [],
    ),
    "splits.kappa nan": (["train", *PIXEL, "--preset", MOVING, "--set", "splits.kappa=nan"], ["splits.kappa"], []),
    "splits.over 1e9 as a float": (
        ["train", *PIXEL, "--preset", MOVING, "--set", "splits.over=1e9"],
        ["splits.over", "an integer"],
        [],
    ),
    "splits on a window schedule's split": (
        ["train", *PIXEL, "--preset", "mix-grpo", "--set", 'splits.kind="adaptive"'],
        ["splits.kind", "schedule.split"],
        [],
    ),
    "dynamic on a tree without branching": (
        ["train", *PIXEL, "--preset", "flow-grpo", "--set", 'tree.dynamic="distance"'],
        ["tree.dynamic = 'distance'", "tree.split_steps has []"],
        [],
    ),
    "dynamic on a window schedule of one split": (
        ["train", *PIXEL, "--preset", "tree-grpo", "--set", 'tree.dynamic="distance"', "--set", "schedule.window=1"],
        ["schedule.split = 'all'", "schedule.window = 1", "tree.dynamic"],
        [],
    ),
    "max_evals below a window schedule's tree": (
        [
            "train",
            *PIXEL,
            "--preset",
            "tree-grpo",
            "--set",
            "tree.split_steps=[5, 6, 7]",
            "--set",
            "tree.max_evals=150",
        ],
        ["schedule.split = 'all'", "tree.max_evals = 150"],
        [],
    ),
    "dynamic on one moving split": (
        ["train", *PIXEL, "--preset", MOVING, "--set", 'tree.dynamic="reward"', "--set", "splits.early=[0]"]
        + ["--set", "splits.late=[5]"],
        ["tree.dynamic = 'reward'", "splits.early"],
        [],
    ),
    "stop_tol a list": (
        ["train", *PIXEL, "--preset", DYNAMIC, "--set", "tree.stop_tol=[0.1]"],
        ["tree.stop_tol", "a number"],
        [],
    ),
    "stop_tol inf": (["train", *PIXEL, "--preset", DYNAMIC, "--set", "tree.stop_tol=inf"], ["tree.stop_tol"], []),
    "stop_tol -1": (["train", *PIXEL, "--preset", DYNAMIC, "--set", "tree.stop_tol=-1"], ["tree.stop_tol", ">= 0"], []),
    "transfer a string": (
        ["train", *PIXEL, "--preset", DYNAMIC, "--set", 'tree.transfer="yes"'],
        ["tree.transfer", "true or false"],
        [],
    ),
    "dynamic a table": (
        ["train", *PIXEL, "--preset", DYNAMIC, "--set", "tree.dynamic={kind = 1}"],
        ["tree.dynamic", "a string"],
        [],
    ),
    "tree width 1e9": (
        ["train", *PIXEL, "--preset", DYNAMIC, "--set", "tree.width=1000000000"],
        ["nodes", "rollout.max_nodes", "lower", "tree.width"],
        [],
    ),
    "max_evals below the tree": (
        ["train", *PIXEL, "--preset", DYNAMIC, "--set", "tree.max_evals=1"],
        ["tree.max_evals", "203"],
        [],
    ),
    "max_evals below a tree the adaptive splits may draw": (
        ["train", *PIXEL, "--preset", "branch", "--set", 'splits.kind="adaptive"', "--set", "tree.max_evals=203"]
        + ["--iterations", 1],
        ["tree.max_evals = 203", "splits.kind = 'adaptive'", "[0, 1, 2, 3]"],
        [],
    ),
    "max_evals below a tree the budget may widen": (
        ["train", *PIXEL, "--preset", BUDGET, "--set", "tree.max_evals=203", "--iterations", 1],
        ["tree.max_evals = 203", "budget.mode", "32 leaves"],
        [],
    ),
    "replace_after without budgets": (
        ["train", *PIXEL, "--preset", "branch", "--set", "budget.replace_after=2"],
        ["budget.replace_after = 2", "budget.mode"],
        [],
    ),
    "budget on a flat baseline of chains": (
        ["train", *PIXEL, "--preset", "flow-grpo", "--set", 'budget.mode="spread"'],
        ["budget.mode", "no split steps"],
        [],
    ),
    "budget.mode Spread": (
        ["train", *PIXEL, "--preset", BUDGET, "--set", 'budget.mode="Spread"'],
        ["budget.mode", "off, spread"],
        [],
    ),
    "budget.max_width below the tree": (
        ["train", *PIXEL, "--preset", BUDGET, "--set", "budget.max_width=4"],
        ["budget.max_width", "16 leaves"],
        [],
    ),
    "budget.max_width 1e9": (
        ["train", *PIXEL, "--preset", BUDGET, "--set", "budget.max_width=1000000000"],
        ["nodes", "rollout.max_nodes", "lower", "budget.max_width"],
        [],
    ),
    "budget.decay 1": (["train", *PIXEL, "--preset", BUDGET, "--set", "budget.decay=1"], ["budget.decay"], []),
    "budget.replace_after 1.5": (
        ["train", *PIXEL, "--preset", BUDGET, "--set", "budget.replace_after=1.5"],
        ["budget.replace_after", "an integer"],
        [],
    ),
    "checkpoint_blocks 1.5": (
        ["train", *PIXEL, "--set", "policy.checkpoint_blocks=1.5"],
        ["policy.checkpoint_blocks", "0 to 1"],
        [],
    ),
    "compile a bool": (["train", *PIXEL, "--set", "policy.compile=true"], ["policy.compile", "a string"], []),
    "attention unknown": (
        ["train", *PIXEL, "--set", 'policy.attention="fast"'],
        ["policy.attention", "_native_flash", "'fast'"],
        [],
    ),
    "size tiny of pretrained weights": (
        ["train", *PIXEL, "--set", 'policy.size="tiny"'],
        ["policy.size", 'policy.weights = "random"'],
        [],
    ),
    "random weights of a built-in model": (
        ["rollout", *PIXEL, "--set", 'policy.weights="random"', "--out", T + "/o"],
        ["policy.weights", "flux-dev"],
        [],
    ),
    # files that are not regular files
    "config a fifo": (["train", *PIXEL, "--config", S + "/fifo.toml"], ["regular file", "fifo.toml"], ["not found"]),
    "config a folder": (["train", *PIXEL, "--config", S + "/folder.toml"], ["not a regular file"], ["not found"]),
    "config /dev/zero": (["train", *PIXEL, "--config", "/dev/zero"], ["regular file", "/dev/zero"], ["not found"]),
    "prompts a fifo": (["train", *PIXEL, "--prompts", S + "/fifo.txt"], ["regular file", "fifo.txt"], ["not found"]),
    "prompts a folder": (["train", *PIXEL, "--prompts", S + "/folder.txt"], ["not a regular file"], ["not found"]),
    "prompts /dev/zero": (["train", *PIXEL, "--prompts", "/dev/zero"], ["not a regular file"], ["not found"]),
    "eval prompts a fifo": ([*EVAL, "--prompts", S + "/fifo.txt"], ["not a regular file"], ["not found"]),
    "rollout config a folder": (
        ["rollout", *PIXEL, "--config", S + "/folder.toml", "--out", T + "/o"],
        ["not a regular file"],
        [],
    ),
    "config still missing": (["train", *PIXEL, "--config", F + "/none.toml"], ["not found"], []),
    # typer's own errors: one line like every other error
    "eval num-images 0": (["eval", "--num-images", 0], ["--num-images"], []),
    "eval num-images a word": (["eval", "--num-images", "abc"], ["--num-images"], []),
    "train iterations 0": (["train", "--iterations", 0], ["--iterations"], []),
    "option unknown": (["eval", "--bogus"], ["--bogus"], []),
    "command unknown": (["bogus"], ["bogus"], []),
    "argument missing": (["score"], ["Missing"], []),
    "option without its value": (["train", "--preset"], ["--preset"], []),
    # a run name is a name, not a path
    "name ../ in a toml": (["train", *PIXEL, "--config", F + "/name-up.toml"], ["name"], []),
    "name ../../../ in a toml": (["train", *PIXEL, "--config", F + "/name-up3.toml"], ["name"], []),
    "name absolute in a toml": (["train", *PIXEL, "--config", F + "/name-abs.toml"], ["name"], []),
    "name with a newline": (["train", *PIXEL, "--config", F + "/name-newline.toml"], ["name"], []),
    "name ..": (["train", *PIXEL, "--config", F + "/name-dotdot.toml"], ["name"], []),
    "name with a backslash": (["train", *PIXEL, "--config", F + "/name-backslash.toml"], ["name"], []),
    "name with a slash on the command line": (["train", *PIXEL, "--set", 'name="a/b"'], ["name"], []),
    "name empty": (["train", *PIXEL, "--set", 'name=""'], ["name"], []),
    "name ../ with a run-dir": (["rollout", *PIXEL, "--set", 'name="../x"', "--out", T + "/o"], ["name"], []),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_value(name, files, specials, tmp_path, monkeypatch, time_limit):  # noqa: F811
    args, needles, absent = CASES[name]
    monkeypatch.chdir(tmp_path)  # the default runs/ would land here
    args = [str(a).replace(T, str(tmp_path)).replace(F, str(files)).replace(S, str(specials)) for a in args]
    before_files, before_here = snapshot(files), snapshot(tmp_path)
    result = run(*args)
    one_line_error(result, *needles)
    assert "Traceback" not in result.output
    for word in absent:
        assert word not in result.stderr, result.stderr
    assert snapshot(files) == before_files
    assert snapshot(tmp_path) == before_here, "a refused command left files behind"


def test_an_empty_reward_option_is_refused(tmp_path, monkeypatch, time_limit):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    one_line_error(run("train", *PIXEL, "--reward", ""), "reward")
    assert snapshot(tmp_path) == {}


def test_the_cases_are_many():
    assert len(CASES) >= 50


# --- the library: bounds are closed form, values are coerced as the messages promise -------------


def test_node_count_is_closed_form_and_matches_the_loop():
    """TreeConfig.model_evals and leaves agree with a step-by-step count, and take no time for any steps."""
    import time

    from treegrpo_cli.engine.rollout import TreeConfig

    def loop(cfg, steps):
        total, width = 0, 1
        for i in range(steps):
            total += width
            width *= cfg.children(i)
        return total, width

    for splits, branch, steps in [((), 2, 20), ((0, 3, 6, 9), 2, 20), ((0,), 5, 1), ((2, 0, 1), 3, 10), ((9,), 2, 10)]:
        cfg = TreeConfig(split_steps=splits, branch=branch)
        assert (cfg.model_evals(steps), cfg.leaves(steps)) == loop(cfg, steps)
    t = time.monotonic()
    big = TreeConfig(split_steps=(0, 5), branch=3)
    assert big.model_evals(10**18) == 1 + 3 * 5 + 9 * (10**18 - 6)
    assert big.leaves(10**18) == 9
    assert time.monotonic() - t < 0.1


def test_steps_bound_is_checked_before_the_node_count(monkeypatch):
    from treegrpo_cli.engine.rollout import TreeConfig

    def never(self, steps):
        raise AssertionError("the node count ran before the steps bound")

    monkeypatch.setattr(TreeConfig, "model_evals", never)
    with pytest.raises(ConfigError, match="sampler.steps"):
        config.load_config(sets=["sampler.steps=10000000000"])


def test_the_maxima_are_stated_and_generous():
    """The constants exist and leave every shipped preset (and the README's runs) far inside."""
    assert MAX_STEPS >= 1000
    assert config.MAX_PROMPTS >= 10_000 and MAX_TREES_PER_PROMPT >= 1000
    assert config.MAX_NODES >= 10_000_000 and config.MAX_IMAGES >= 100_000
    for preset in config.preset_names():
        config.load_config(preset)


def test_clamp_none_means_off():
    assert config.load_config(sets=["advantage.clamp=none"]).advantage.clamp is None
    assert config.load_config(sets=['advantage.clamp="None"']).advantage.clamp is None
    assert config.load_config(sets=["advantage.clamp=3"]).advantage.clamp == 3.0
    with pytest.raises(ConfigError, match="must be a number or none"):
        config.load_config(sets=['advantage.clamp="off"'])


def test_a_toml_with_a_byte_order_mark_reads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b'name = "bom"\n[train]\nlr = 0.25\n')
    cfg = config.load_config(config_file=path)
    assert cfg.name == "bom" and cfg.train.lr == 0.25


def test_a_prompt_file_with_a_byte_order_mark_reads(tmp_path):
    txt, jsonl = tmp_path / "p.txt", tmp_path / "p.jsonl"
    txt.write_bytes(b"\xef\xbb\xbfa red circle\na blue square\n")
    jsonl.write_bytes(b'\xef\xbb\xbf{"prompt": "a red circle"}\n')
    assert load_prompts(txt) == ["a red circle", "a blue square"]
    assert load_prompts(jsonl) == ["a red circle"]


NOT_NAMES = ["../../../escaped", "/abs/name", "a/b", "a\\b", "..", ".", "", "a\nb", "a\x1bb", "x" * 201]


@pytest.mark.parametrize("name", NOT_NAMES)
def test_a_run_name_is_not_a_path(name):
    with pytest.raises(ConfigError, match="^name "):
        config.config_from_dict({"name": name})


def test_ordinary_run_names_pass():
    for name in ("branch", "tree-grpo", "my run 2", "a.b", "v1.2", "étude", "x" * 200):
        assert config.config_from_dict({"name": name}).name == name


def test_reward_values_that_mean_nothing_are_refused():
    for sets, needle in [
        (["reward.names=[]"], "reward.names"),
        (['reward.names=["shapes", "shapes"]', "reward.weights=[1, 2]"], "twice"),
        (['reward.names=["shapes", "shapes"]'], "twice"),
        (["reward.weights=[0]"], "zero"),
        (['reward.names=["shapes", "jpeg-compressibility"]', "reward.weights=[0, -0.0]"], "zero"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            config.load_config(sets=sets)


def test_legal_but_surely_mistaken_values_warn():
    cfg = config.load_config(sets=['reward.names=["shapes", "jpeg-compressibility"]', "reward.weights=[1, 0]"])
    assert any("jpeg-compressibility" in w and "weight 0" in w for w in cfg.warnings())
    assert any("train.lr" in w for w in config.load_config(sets=["train.lr=2"]).warnings())
    assert any("train.clip_range" in w for w in config.load_config(sets=["train.clip_range=1.5"]).warnings())
    for preset in config.preset_names():
        assert config.load_config(preset).warnings() == [], preset
    # [policy] on a built-in model, which ignores it; a diffusers model reads it
    sets = ['policy.compile="blocks"', "policy.lora_rank=8"]
    (w,) = config.load_config(sets=sets).warnings()
    assert "policy.lora_rank, policy.compile set, but tiny-shapes is a built-in model and ignores [policy]" in w
    assert config.load_config(sets=[*sets, 'model="flux-dev"']).warnings() == []


def test_prompt_files_that_are_not_regular_files(tmp_path):
    os.mkfifo(tmp_path / "fifo.txt")
    for p in (tmp_path / "fifo.txt", tmp_path, Path("/dev/zero")):
        with pytest.raises(TreegrpoError, match="not a regular file"):
            load_prompts(p)
    with pytest.raises(TreegrpoError, match="not found"):
        load_prompts(tmp_path / "none.txt")


def test_help_is_unchanged_by_the_one_line_errors():
    """--help and a bare `treegrpo` still print the full help; only errors become one line."""
    r = run("--help")
    assert r.exit_code == 0 and "Commands" in r.output and "train" in r.output
    r = run("eval", "--help")
    assert r.exit_code == 0 and "--num-images" in r.output and "Usage" in r.output
    r = run()
    assert "Commands" in r.output and "Usage" in r.output
    r = run("--version")
    assert r.exit_code == 0 and r.output.startswith("treegrpo ")


@pytest.mark.parametrize("name", ["a" * 300, "b" * 300 + ".safetensors", "org/" + "c" * 300])
def test_a_model_name_no_file_can_have_is_one_line(name, tmp_path):
    """A name longer than a file name may be is a name, not a crash (found by the config fuzzer: `model` set to a
    long TOML value raised OSError from the folder check): the config loads and --model refuses it."""
    config.load_config(None, None, [f'model="{name}"'])
    config.load_config(None, None, ['model="x\\u0000y"'])  # a NUL byte: no path either
    one_line_error(run("train", "--model", name, "--run-dir", tmp_path / "r"), "model")
