"""What a user of other trainers types: eval samples what the run trained (its reward, held-out prompts, sampler),
config keys under other trainers' names, Hydra's and argparse's habits, and a list of rewards checked whole."""

import json

import pytest
from clitools import one_line_error, run

TINY = ["--model", "pixel-tiny", "--set", "train.eval_samples=0", "--set", "train.sample_every=0"]


@pytest.fixture(scope="module")
def jpeg_run(tmp_path_factory):
    """A pixel-tiny run trained on JPEG compressibility with three held-out prompts of its own."""
    root = tmp_path_factory.mktemp("jpeg")
    held_out = root / "held-out.txt"
    held_out.write_text("a harbour at noon\na field of poppies\na red bicycle\n")
    args = ["train", *TINY, "--reward", "jpeg-compressibility", "--iterations", 1, "--run-dir", root / "run"]
    r = run(*args, "--set", f"rollout.eval_prompts={json.dumps(str(held_out))}")
    assert r.exit_code == 0, r.output
    return root / "run"


@pytest.mark.slow
def test_eval_of_a_checkpoint_samples_the_runs_own_reward_and_prompts(jpeg_run):
    r = run("eval", "--checkpoint", jpeg_run, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert list(summary["metrics"]) == ["jpeg-compressibility"]  # not the world's shapes reward
    assert summary["metrics"]["jpeg-compressibility"]["n"] == 3  # the run's three held-out prompts


def test_eval_takes_reward_as_the_other_commands_do(jpeg_run):
    r = run("eval", "--checkpoint", jpeg_run, "--reward", "jpeg-incompressibility", "--num-prompts", 1, "--json")
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.stdout)["metrics"]) == ["jpeg-incompressibility"]


def test_eval_of_a_model_samples_with_the_preset_and_sets_given():
    args = ["eval", "--model", "pixel-tiny", "--preset", "flow-grpo", "--set", "sampler.steps=3", "--json"]
    r = run(*args, "--num-prompts", 1, "--reward", "jpeg-compressibility")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["sampler"]["steps"] == 3
    r = run("eval", "--model", "pixel-tiny", "--preset", "nope", "--num-prompts", 1)
    one_line_error(r, "nope")


def test_a_checkpoint_refuses_a_preset(jpeg_run):
    one_line_error(run("eval", "--checkpoint", jpeg_run, "--preset", "branch"), "its run's config")


@pytest.mark.parametrize(
    "key, meant",
    [
        ("train.learning_rate=1e-4", "train.lr"),
        ("policy.mixed_precision=bf16", "policy.dtype"),
        ("sampler.num_inference_steps=20", "sampler.steps"),
        ("train.kl_coef=0.01", "train.kl_beta"),
    ],
)
def test_other_trainers_names_for_a_key_suggest_ours(key, meant, tmp_path):
    one_line_error(run("train", "--set", key, "--run-dir", tmp_path / "r"), f"did you mean {meant!r}")


def test_hydra_and_argparse_habits_get_the_spelling_that_works(tmp_path):
    one_line_error(run("train", "train.lr=1e-4"), "config keys go in --set: --set train.lr=1e-4")
    one_line_error(run("train", "--set", "train.lr", "1e-4"), "write --set train.lr=1e-4")
    one_line_error(run("train", "--set", "train.lr"), "--set train.lr=VALUE")


def test_a_bad_key_in_a_config_file_names_the_file(tmp_path):
    cfg = tmp_path / "mine.toml"
    cfg.write_text("[train]\nlearning_rate = 1e-4\n")
    one_line_error(run("train", "--config", cfg, "--run-dir", tmp_path / "r"), str(cfg), "did you mean 'train.lr'")


def test_every_reward_name_is_checked_before_any_weights_load(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-cache"))  # imagereward's weights are absent
    r = run("train", *TINY, "--reward", "imagereward,pickscore", "--run-dir", tmp_path / "r")
    one_line_error(r, "unknown reward 'pickscore'", "did you mean 'pick'")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_one_vocabulary_across_commands(tmp_path):
    """--out names train's folder as every other command's; torch's dtype names work; --num-prompts on train."""
    r = run("train", *TINY, "--iterations", 1, "--out", tmp_path / "r", "--num-prompts", 2, "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "r" / "run.json").read_text())["config"]
    assert cfg["rollout"]["num_prompts"] == 2 and cfg["policy"]["dtype"] == "bf16"
    from treegrpo_cli.config import load_config

    assert load_config(sets=['policy.dtype="float32"']).policy.dtype == "fp32"


def test_rollout_and_train_share_their_default_preset():
    from treegrpo_cli.cli.train_options import DEFAULT_PRESET

    flat = " ".join(run("rollout", "--help").output.replace("│", " ").split())
    assert f"[default: {DEFAULT_PRESET}]" in flat


@pytest.mark.parametrize("command", ["train", "rollout", "score", "eval", "export", "inspect", "serve-reward"])
def test_every_command_help_ends_with_examples(command):
    text = run(command, "--help").output
    assert "Example" in text and f"treegrpo {command}" in text


def _on_a_terminal(args: list[str]) -> tuple[int, str]:
    """Run `python -m treegrpo_cli ARGS` with its output on a pseudo-terminal, as a user at a shell sees it."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="120", TERM="xterm-256color")
    p = subprocess.Popen([sys.executable, "-m", "treegrpo_cli", *args], stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(), out.decode(errors="replace")


@pytest.mark.slow
def test_progress_on_a_terminal_tells_the_truth(tmp_path):
    code, text = _on_a_terminal(["train", *TINY, "--iterations", "3", "--out", str(tmp_path / "r")])
    assert code == 0, text
    assert "device: cpu" in text and "loading pixel-tiny" in text and "pixel-tiny ready on cpu" in text
    for k in range(3):
        assert f"iteration {k}: reward" in text  # on a terminal too, not only in a log
    import re

    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    # the iteration bar's clock runs from the start and it gives a time left from the first iteration on
    assert re.search(r"iterations .*1/3 +\d+:\d\d:\d\d eta \d+:\d\d:\d\d", plain), plain
    # each pass of the rollout gets a fresh bar: its count starts again from 0
    assert re.search(r"rollout .* 0/\d+ +0:00:00", plain), plain
    # scoring and the update have bars of their own: leaf scores and trained edges, counted to the end
    for phase in ("score", "update"):
        done = [m.groups() for m in re.finditer(phase + r" .*? (\d+)/(\d+) ", plain)]
        assert done and any(a == b and int(b) > 0 for a, b in done), (phase, plain)


@pytest.mark.slow
def test_progress_in_a_log_says_the_run_folder_first(tmp_path):
    r = run("train", *TINY, "--iterations", 2, "--out", tmp_path / "r", "--set", "train.eval_samples=1")
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert lines[2] == f"run folder: {tmp_path / 'r'}"
    assert lines.index(f"run folder: {tmp_path / 'r'}") < min(i for i, x in enumerate(lines) if "iteration 0" in x)
    assert any(x.startswith("held-out reward at iteration 2:") for x in lines)
    i = lines.index("held-out evaluation at iteration 2: 24 prompts x 1, ODE samples ...")  # said as it starts
    assert lines[i + 1].startswith("held-out reward at iteration 2:")
    assert not any(x.startswith(("score:", "update:", "rollout:")) for x in lines)  # a log gets the lines that matter


@pytest.mark.slow
def test_exit_codes_follow_the_documented_rule(tmp_path):
    """2 for a usage or config error, 1 for a runtime one (README)."""
    assert run("train", "--set", "train.learning_rate=1e-4").exit_code == 2  # a config key
    assert run("train", "--iterations", 0).exit_code == 2  # an option's value
    assert run("train", "--bogus").exit_code == 2  # an option
    assert run("train", *TINY, "--prompts", tmp_path / "none.txt", "--out", tmp_path / "r").exit_code == 1  # a file


@pytest.mark.parametrize(
    "preset, model, reward",
    [
        ("branch", "flux-dev", ("hps",)),
        ("flow-grpo", "sd3.5-medium", ("pick",)),
        ("mix-grpo", "flux-dev", ("hps", "pick", "imagereward")),
        ("tree-grpo", "wan2.1-t2v-1.3b", ("videoalign",)),
    ],
)
def test_a_released_model_trains_on_its_papers_reward_and_general_prompts(preset, model, reward):
    from treegrpo_cli.config import load_config

    cfg = load_config(preset, sets=[f'model="{model}"'])
    assert cfg.reward.names == reward
    assert (cfg.rollout.prompts, cfg.rollout.eval_prompts) == ("general-train", "general-test")
    world = load_config(preset)  # the embedded world keeps its own reward and prompts
    assert world.reward.names == ("shapes",) and world.rollout.prompts == "shapes-train"
    assert load_config(preset, sets=[f'model="{model}"', 'reward.names=["clip"]']).reward.names == ("clip",)


def test_the_general_prompts_are_shipped_and_held_out_apart():
    from treegrpo_cli.prompts import load_prompts

    train, test = load_prompts("general-train"), load_prompts("general-test")
    assert len(train) == 64 and len(test) == 16 and not set(train) & set(test)
    assert not any(word in p for p in train + test for word in ("circle", "square", "triangle"))


@pytest.mark.slow
def test_a_released_model_without_weights_is_one_line_before_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("TREEGRPO_HPS_CHECKPOINT", raising=False)
    r = run("train", "--model", "flux-dev", "--preset", "branch", "--out", tmp_path / "r")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr  # nothing before the error line
    assert "model weights for 'flux-dev'" in r.stderr and "hf download black-forest-labs/FLUX.1-dev" in r.stderr
    random = ["--set", 'policy.weights="random"']
    r = run("train", "--model", "flux-dev", "--preset", "branch", *random, "--out", tmp_path / "r")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "hps weights not found" in r.stderr and "TREEGRPO_HPS_CHECKPOINT" in r.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_first_lines_say_model_reward_prompts_and_device_and_whence(tmp_path):
    args = ["--model", "flux-dev", "--set", 'policy.weights="random"', "--set", 'policy.size="tiny"']
    small = ["--set", "train.eval_samples=0", "--set", "sampler.steps=4", "--num-prompts", 1, "--iterations", 1]
    r = run("train", *args, "--reward", "jpeg-compressibility", *small, "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    first, device = r.stderr.splitlines()[:2]
    assert "model flux-dev (random weights, tiny size)" in first
    assert "reward jpeg-compressibility (given)" in first
    assert "prompts general-train (held out: general-test; the shipped general prompts)" in first
    assert device == "device: cpu (no GPU seen by torch)"
