"""`treegrpo config show`: the resolved config, and with --explain the layer each value comes from."""

import json

import pytest
from clitools import one_line_error, run

from treegrpo_cli.config import load_config, preset_names
from treegrpo_cli.models.hub import KNOWN
from treegrpo_cli.models.registry import MODELS


@pytest.mark.slow
def test_every_preset_and_model_resolves_and_explains():
    for preset in preset_names():
        for model in [*MODELS, *KNOWN]:
            r = run("config", "show", "--preset", preset, "--model", model, "--explain", "--json")
            assert r.exit_code == 0, (preset, model, r.output)
            shown = json.loads(r.stdout)
            assert shown["config"] == load_config(preset, sets=[f'model="{model}"']).to_dict()
            assert set(shown["from"]) >= {"train.lr", "reward.names", "model"}


def test_explain_names_the_layer_that_won():
    r = run(
        "config", "show", "--preset", "branch-mix-flow", "--model", "flux-dev", "--set", "train.lr=3e-5", "--explain"
    )
    assert r.exit_code == 0, r.output
    where = {line.split(" = ")[0]: line.rsplit("# ", 1)[1] for line in r.stdout.splitlines()}
    assert where["train.lr"] == "--set"
    assert where["sampler.eta"] == "preset branch-mix-flow"
    assert where["reward.names"].startswith("released model flux-dev")
    assert where["rollout.max_batch"] == "model defaults of flux-dev"
    assert where["train.seed" if "train.seed" in where else "seed"] == "default"
    plain = run("config", "show", "--preset", "branch", "--set", "train.lr=3e-5").stdout
    assert "train.lr = 3e-05" in plain.splitlines() and "#" not in plain


def test_a_bad_key_is_one_line():
    one_line_error(run("config", "show", "--set", "train.learning_rate=1"), "did you mean 'train.lr'")


@pytest.mark.slow
def test_a_schedule_that_overrides_the_users_tree_is_warned_about(tmp_path):
    args = [
        "train",
        "--preset",
        "mix-grpo",
        "--model",
        "pixel-tiny",
        "--iterations",
        1,
        "--set",
        "train.eval_samples=0",
    ]
    r = run(*args, "--set", "tree.sde_steps=[1, 2]", "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert (
        "warning: tree.sde_steps from --set is overridden every iteration by schedule.kind = 'progressive'" in r.stderr
    )
    r = run(*args, "--out", tmp_path / "b")  # the preset's own window: no warning
    assert r.exit_code == 0 and "overridden" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    "preset, switch_off, key",
    [
        ("treepo", 'tree.dynamic="off"', "tree.stop_tol=0.2"),
        ("branch-mix-flow-moving-splits", 'splits.kind="static"', "splits.kappa=4"),
        ("branch-mix-flow-budget", 'budget.mode="off"', "budget.floor=0.5"),
    ],
)
def test_keys_a_later_layer_switched_off_are_the_presets_not_the_users(tmp_path, preset, switch_off, key):
    """Turning a preset's feature off leaves its tuning unused: quiet. A key the user sets beside the switch, in
    --set or in a --config file, is the user's mistake: one warning naming just that key."""
    r = run("config", "show", "--preset", preset, "--set", switch_off)
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    name, (switch, value) = key.split("=")[0], switch_off.split("=")
    said = f"warning: {name} set, but {switch} = '{value.strip(chr(34))}' ignores it"
    r = run("config", "show", "--preset", preset, "--set", key, "--set", switch_off)
    assert r.stderr.splitlines() == [said]
    file = tmp_path / "mine.toml"
    section, field = name.split(".")
    file.write_text(f"[{section}]\n{field} = {key.split('=')[1]}\n")
    r = run("config", "show", "--preset", preset, "--config", file, "--set", switch_off)
    assert r.exit_code == 0 and r.stderr == "", r.stderr  # the file's own tuning, switched off for one run
    file.write_text(f"[{section}]\n{field} = {key.split('=')[1]}\n{switch.split('.')[1]} = {value}\n")
    r = run("config", "show", "--preset", preset, "--config", file)
    assert r.stderr.splitlines() == [said]


@pytest.mark.slow
def test_train_and_rollout_say_nothing_of_a_presets_keys_switched_off(tmp_path):
    common = ["--preset", "treepo", "--model", "pixel-tiny", "--set", 'tree.dynamic="off"']
    r = run("train", *common, "--iterations", 1, "--set", "train.eval_samples=0", "--out", tmp_path / "run")
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
    r = run("rollout", *common, "-n", 1, "--out", tmp_path / "trees")
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
    r = run("train", "--resume", tmp_path / "run", "--iterations", 2)
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
