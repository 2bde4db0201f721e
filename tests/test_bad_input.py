"""Bad input, as a new user types it: every case exits non-zero with exactly one line on stderr, no
traceback, within a time limit, and leaves the folders it was given exactly as they were."""

from pathlib import Path

import pytest
from clitools import PIXEL, one_line_error, run, snapshot

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Inputs the cases point at: a scored tree folder, a finished tiny run, prompt files, bad files."""
    d = tmp_path_factory.mktemp("world")
    assert run("rollout", *PIXEL, "-n", 2, "--preset", "branch", "--out", d / "trees").exit_code == 0
    assert run("score", d / "trees").exit_code == 0
    assert run("rollout", *PIXEL, "-n", 2, "--preset", "branch", "--out", d / "unscored").exit_code == 0
    r = run("train", *PIXEL, "--preset", "branch", "--iterations", 1, "--run-dir", d / "run")
    assert r.exit_code == 0, r.output
    (d / "nometrics").mkdir()  # a run that has not finished an iteration
    (d / "nometrics" / "run.json").write_bytes((d / "run" / "run.json").read_bytes())
    (d / "file.txt").write_text("a red circle\n")
    (d / "empty.txt").write_text("\n\n")
    (d / "binary.txt").write_bytes(b"\xff\xfe\x00\x81" * 10)
    (d / "noprompt.jsonl").write_text('{"text": "a red circle"}\n')
    (d / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    shipped = Path(__file__).resolve().parents[1] / "treegrpo_cli" / "data" / "tiny-shapes.safetensors"
    data = shipped.read_bytes()
    (d / "truncated.safetensors").write_bytes(data[: len(data) // 2])
    (d / "bad.toml").write_text("[train\nlr = 1")
    (d / "lr-string.toml").write_text('[train]\nlr = "fast"\n')
    (d / "section.toml").write_text("tree = 3\n")
    return d


T = "{t}"  # the test's own empty folder, where outputs go
W = "{w}"  # the shared world folder

CASES = {
    # config values (--set), refused before any work or file
    "lr not a number": (["train", *PIXEL, "--set", "train.lr=abc"], ["train.lr"]),
    "lr nan": (["train", *PIXEL, "--set", "train.lr=nan"], ["train.lr"]),
    "lr negative": (["train", *PIXEL, "--set", "train.lr=-1"], ["train.lr"]),
    "branch a word": (["train", *PIXEL, "--set", 'tree.branch="two"'], ["tree.branch"]),
    "branch 1000": (
        ["train", *PIXEL, "--preset", "branch", "--set", "tree.branch=1000"],
        ["nodes", "rollout.max_nodes"],
    ),
    "tree memory": (
        ["train", "--preset", "branch", "--set", "rollout.max_tree_gib=0.0001"],
        ["GiB", "rollout.max_tree_gib"],
    ),
    "num_prompts 0": (["train", *PIXEL, "--set", "rollout.num_prompts=0"], ["rollout.num_prompts"]),
    "num_prompts negative": (["train", *PIXEL, "--set", "rollout.num_prompts=-3"], ["rollout.num_prompts"]),
    "max_batch 0": (["train", *PIXEL, "--set", "rollout.max_batch=0"], ["rollout.max_batch"]),
    "eta nan": (["rollout", *PIXEL, "--set", "sampler.eta=nan", "--out", T + "/o"], ["sampler.eta"]),
    "eta inf": (["rollout", *PIXEL, "--set", "sampler.eta=inf", "--out", T + "/o"], ["sampler.eta"]),
    "eta negative": (["train", *PIXEL, "--set", "sampler.eta=-0.5"], ["sampler.eta"]),
    "steps fractional": (["train", *PIXEL, "--set", "sampler.steps=2.5"], ["sampler.steps", "integer"]),
    "steps 0": (["train", *PIXEL, "--set", "sampler.steps=0"], ["sampler.steps"]),
    "shift 0": (["train", *PIXEL, "--set", "sampler.shift=0"], ["sampler.shift"]),
    "noise unknown": (["train", *PIXEL, "--set", 'sampler.noise="banana"'], ["sampler.noise"]),
    "decode unknown": (["train", *PIXEL, "--set", 'sampler.decode="jpeg"'], ["sampler.decode"]),
    "split step outside": (["train", *PIXEL, "--set", "tree.split_steps=[99]"], ["tree.split_steps"]),
    "split steps a string": (["train", *PIXEL, "--set", 'tree.split_steps="0,3"'], ["tree.split_steps"]),
    "branch_s 0": (["train", *PIXEL, "--preset", "branch", "--set", "tree.branch_s=0"], ["tree.branch_s"]),
    "trees_per_prompt 0": (["train", *PIXEL, "--set", "tree.trees_per_prompt=0"], ["tree.trees_per_prompt"]),
    "estimator unknown": (["train", *PIXEL, "--set", 'advantage.estimator="magic"'], ["advantage.estimator"]),
    "clamp nan": (["train", *PIXEL, "--set", "advantage.clamp=nan"], ["advantage.clamp"]),
    "width unknown": (["train", *PIXEL, "--set", 'pruning.width="half"'], ["pruning.width"]),
    "extreme_frac 2": (["train", *PIXEL, "--set", "pruning.extreme_frac=2"], ["pruning.extreme_frac"]),
    "timestep_fraction 0": (["train", *PIXEL, "--set", "pruning.timestep_fraction=0"], ["pruning.timestep_fraction"]),
    "reward unknown": (["train", *PIXEL, "--set", 'reward.names=["nope"]'], ["unknown reward"]),
    "weights count": (["train", *PIXEL, "--set", "reward.weights=[1, 2]"], ["reward.weights"]),
    "combine unknown": (["train", *PIXEL, "--set", 'reward.combine="nonsense"'], ["reward.combine"]),
    "iterations 0": (["train", *PIXEL, "--set", "train.iterations=0"], ["train.iterations"]),
    "clip_range 0": (["train", *PIXEL, "--set", "train.clip_range=0"], ["train.clip_range"]),
    "ema_decay 1.5": (["train", *PIXEL, "--set", "train.ema_decay=1.5"], ["train.ema_decay"]),
    "kl_form unknown": (["train", *PIXEL, "--set", 'train.kl_form="both"'], ["train.kl_form"]),
    "loss_norm unknown": (["train", *PIXEL, "--set", 'train.loss_norm="sum"'], ["train.loss_norm"]),
    "minibatches fractional": (["train", *PIXEL, "--set", "train.minibatches=1.5"], ["train.minibatches"]),
    "save_every 0": (["train", *PIXEL, "--set", "train.save_every=0"], ["train.save_every"]),
    "seed a word": (["train", *PIXEL, "--set", 'seed="abc"'], ["seed"]),
    "seed fractional": (["train", *PIXEL, "--set", "seed=1.5"], ["seed"]),
    "model a number": (["train", "--set", "model=42"], ["model"]),
    "dtype unknown": (["train", *PIXEL, "--set", 'policy.dtype="fp8"'], ["policy.dtype"]),
    "cfg_uncond unknown": (["train", *PIXEL, "--set", 'policy.cfg_uncond="maybe"'], ["policy.cfg_uncond"]),
    "schedule unknown": (["train", *PIXEL, "--set", 'schedule.kind="random"'], ["schedule.kind"]),
    "key misspelt": (["train", *PIXEL, "--set", "tree.brnch=2"], ["tree.branch"]),
    "set without =": (["train", *PIXEL, "--set", "train.lr"], ["key=value"]),
    "bool a word": (["train", *PIXEL, "--set", 'tree.init_same_noise="yes"'], ["tree.init_same_noise"]),
    # config files
    "toml lr a string": (["train", *PIXEL, "--config", W + "/lr-string.toml"], ["train.lr"]),
    "toml broken": (["train", *PIXEL, "--config", W + "/bad.toml"], ["not valid TOML"]),
    "toml section a value": (["train", *PIXEL, "--config", W + "/section.toml"], ["[tree]", "table"]),
    "toml missing": (["train", *PIXEL, "--config", W + "/none.toml"], ["not found"]),
    # command-line options
    "train weights a word": (["train", *PIXEL, "--weights", "abc"], ["--weights"]),
    "device cuda without cuda": (["train", *PIXEL, "--device", "cuda"], ["cuda"]),
    "device banana": (["train", *PIXEL, "--device", "banana"], ["banana"]),
    "rollout device banana": (["rollout", *PIXEL, "--device", "banana", "--out", T + "/o"], ["banana"]),
    "preset unknown": (["train", "--preset", "nope"], ["unknown preset"]),
    "score combine unknown": (["score", W + "/trees", "--combine", "nonsense"], ["reward.combine"]),
    "score weights a word": (["score", W + "/trees", "--weights", "abc"], ["--weights"]),
    "score estimator unknown": (["score", W + "/trees", "--estimator", "magic"], ["advantage.estimator"]),
    "score sets a tree key": (["score", W + "/trees", "--set", "tree.branch=3"], ["tree.branch"]),
    "eval metric unknown": (["eval", "--model", "pixel-tiny", "--metric", "hsp"], ["unknown reward"]),
    # prompt files
    "prompts missing": (["train", *PIXEL, "--prompts", W + "/none.txt"], ["not found"]),
    "prompts empty": (["train", *PIXEL, "--prompts", W + "/empty.txt"], ["no prompts"]),
    "prompts binary": (["train", *PIXEL, "--prompts", W + "/binary.txt"], ["binary.txt"]),
    "prompts jsonl without prompt": (["train", *PIXEL, "--prompts", W + "/noprompt.jsonl"], ["prompt"]),
    # model files
    "model junk file": (["train", "--model", W + "/junk.safetensors"], ["junk.safetensors"]),
    "model truncated": (["train", "--model", W + "/truncated.safetensors"], ["truncated.safetensors"]),
    "model missing": (["train", "--model", W + "/none.safetensors"], ["none.safetensors"]),
    "eval model missing": (["eval", "--model", W + "/none.safetensors", "--metric", "shapes"], ["none.safetensors"]),
    # shards, checkpoints, run folders
    "train trees unscored": (["train", "--trees", W + "/unscored"], ["score"]),
    "score not a tree folder": (["score", W], ["not a folder written by treegrpo"]),
    "inspect missing": (["inspect", W + "/none"], ["no such folder"]),
    "resume not a run": (["train", "--resume", W + "/trees"], ["run"]),
    "resume missing": (["train", "--resume", W + "/none"], ["none"]),
    "eval checkpoint missing": (["eval", "--checkpoint", W + "/none"], ["checkpoint"]),
    "export step missing": (["export", W + "/run", "--step", 99, "--out", T + "/x"], ["99"]),
    # output locations that cannot be written
    "rollout out under a file": (["rollout", *PIXEL, "--out", W + "/file.txt/o"], ["file.txt"]),
    "rollout out unwritable": (["rollout", *PIXEL, "--out", "/proc/treegrpo-test"], ["/proc/treegrpo-test"]),
    "train run-dir under a file": (["train", *PIXEL, "--run-dir", W + "/file.txt/r"], ["file.txt"]),
    "train run-dir unwritable": (["train", *PIXEL, "--run-dir", "/proc/treegrpo-test"], ["/proc/treegrpo-test"]),
    "eval out under a file": (["eval", "--model", "pixel-tiny", "--out", W + "/file.txt/e"], ["file.txt"]),
    "eval out unwritable": (["eval", "--model", "pixel-tiny", "--out", "/proc/treegrpo-test"], ["/proc/treegrpo-test"]),
    "diversity out unwritable": (
        ["diversity", W + "/trees", W + "/unscored", "--out", "/proc/treegrpo-test"],
        ["/proc/treegrpo-test"],
    ),
    "export out unwritable": (["export", W + "/run", "--out", "/proc/treegrpo-test"], ["/proc/treegrpo-test"]),
    "rollout out is a file": (["rollout", *PIXEL, "--out", W + "/file.txt"], ["file.txt"]),
    # compare
    "compare not a run": (["compare", W + "/trees", "--out", T + "/c"], ["run.json", "not a treegrpo run"]),
    "compare run missing": (["compare", W + "/none", "--out", T + "/c"], ["no such run folder"]),
    "compare run without metrics": (["compare", W + "/nometrics", "--out", T + "/c"], ["metrics.jsonl"]),
    "compare label count": (["compare", W + "/run", "--label", "a", "--label", "b", "--out", T + "/c"], ["--label"]),
    "compare baseline unknown": (
        ["compare", W + "/run", "--baseline", "nope", "--out", T + "/c"],
        ["--baseline", "nope"],
    ),
    "compare target nan": (["compare", W + "/run", "--target", "nan", "--out", T + "/c"], ["--target"]),
    "compare run twice": (["compare", W + "/run", W + "/run", "--out", T + "/c"], ["twice"]),
    "compare out unwritable": (["compare", W + "/run", "--out", "/proc/treegrpo-test"], ["/proc/treegrpo-test"]),
    "compare out is a file": (["compare", W + "/run", "--out", W + "/file.txt"], ["file.txt"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, world, tmp_path, monkeypatch, time_limit):
    args, needles = CASES[name]
    monkeypatch.chdir(tmp_path)  # the default runs/ would land here
    args = [str(a).replace(T, str(tmp_path)).replace(W, str(world)) for a in args]
    before_world, before_here = snapshot(world), snapshot(tmp_path)
    one_line_error(run(*args), *needles)
    assert snapshot(world) == before_world
    assert snapshot(tmp_path) == before_here, "a refused command left files behind"


def test_the_suite_is_large_enough():
    assert len(CASES) >= 60


def test_a_model_without_its_extra_names_the_pip_command(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "diffusers", None)  # as in the README's base install
    one_line_error(run("train", "--model", "flux-dev", "--run-dir", tmp_path / "r"), "pip install 'treegrpo[models]'")
    assert not (tmp_path / "r").exists()


def test_shipped_weights_with_a_flipped_byte_are_refused(tmp_path, monkeypatch):
    from treegrpo_cli.models import registry

    data = bytearray(registry.TINY_SHAPES.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy = tmp_path / "tiny-shapes.safetensors"
    copy.write_bytes(bytes(data))
    monkeypatch.setitem(registry.EMBEDDED, "tiny-shapes", (copy, registry.TINY_SHAPES_SHA256))
    one_line_error(run("eval", "--model", "tiny-shapes", "--metric", "shapes"), "damaged", "sha256", "reinstall")
    monkeypatch.setitem(registry.EMBEDDED, "tiny-shapes", (registry.TINY_SHAPES, registry.TINY_SHAPES_SHA256))
    assert registry.load_policy("tiny-shapes").name == "tiny-shapes"  # the intact file passes the same check


def test_trees_sampled_with_a_config_that_is_now_refused_are_refused(world, tmp_path):
    """A tree folder whose stored config says eta = nan (written by an older version) is not scored or trained."""
    import shutil

    from treegrpo_cli.store.trees import open_trees

    folder = tmp_path / "trees"
    shutil.copytree(world / "trees", folder)
    store = open_trees(folder)
    cfg = store.meta["config"]
    cfg["sampler"]["eta"] = float("nan")
    store.update_meta(config=cfg)
    before = snapshot(folder)
    one_line_error(run("score", folder), "sampler.eta")
    one_line_error(run("train", "--trees", folder, "--run-dir", tmp_path / "r"), "sampler.eta")
    assert snapshot(folder) == before and not (tmp_path / "r").exists()


def test_the_default_run_folder_in_an_unwritable_place(monkeypatch):
    monkeypatch.chdir("/proc")  # runs/ would be created here
    one_line_error(run("train", *PIXEL), "--run-dir", "runs/")
