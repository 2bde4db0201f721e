import math

import pytest

from treegrpo_cli.config import config_from_dict, load_config, preset_names
from treegrpo_cli.errors import ConfigError

ALL = [
    "awm",
    "branch",
    "branch-deppru",
    "branch-late",
    "branch-mix",
    "branch-mix-flow",
    "branch-mix-flow-budget",
    "branch-mix-flow-moving-splits",
    "branch-widpru",
    "dance-grpo",
    "dgpo",
    "flow-grpo",
    "flow-grpo-guard",
    "mix-grpo",
    "nft",
    "tree-awm",
    "tree-dgpo",
    "tree-grpo",
    "tree-grpo-mean",
    "tree-nft",
    "treepo",
]


def test_every_preset_loads_and_round_trips():
    assert preset_names() == ALL
    for name in ALL:
        cfg = load_config(name)
        assert cfg.name == name and cfg.description
        assert config_from_dict(cfg.to_dict()) == cfg


def test_preset_values_follow_the_papers():
    b = load_config("branch")
    assert (b.sampler.steps, b.tree.split_steps, b.tree.branch, b.tree.branch_s) == (20, (0, 3, 6, 9), 2, 4.0)
    t = load_config("tree-grpo")
    assert (t.sampler.steps, t.tree.branch, t.tree.split_steps, math.isinf(t.tree.branch_s)) == (10, 3, (0, 1, 2), True)
    assert t.advantage.backup == "logprob"


def test_set_overrides_and_config_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[tree]\nbranch = 3\n[advantage]\nbeta = 1.0\n")
    cfg = load_config("branch", f, ["advantage.beta=0.5", "tree.split_steps=[0, 5]"])
    assert cfg.tree.branch == 3 and cfg.advantage.beta == 0.5 and cfg.tree.split_steps == (0, 5)
    assert load_config("branch", sets=["tree.sde_steps=all"]).tree.sde_steps is None


@pytest.mark.parametrize(
    "sets,match",
    [
        (["tree.brnch=3"], "did you mean 'tree.branch'"),
        (["nonsense"], "key=value"),
        (["advantage.estimator=ppo"], "estimator"),
        (["tree.split_steps=[30]"], "outside"),
    ],
)
def test_bad_overrides_are_one_line_errors(sets, match):
    with pytest.raises(ConfigError, match=match):
        load_config("branch", sets=sets)


def test_a_presets_for_model_table_sits_between_the_model_defaults_and_the_users_settings(tmp_path):
    # tree-grpo: lr 1e-5 (the paper's, FLUX), the world's model default 1e-4, its [for_model.tiny-shapes] 3e-5
    assert load_config("tree-grpo").train.lr == 3e-5  # the world is the default model
    assert load_config("tree-grpo", sets=['model="tiny-shapes-video"']).train.lr == 1e-4  # another model's default
    assert load_config("dance-grpo").train.lr == 1e-4  # no table: the world's default as before
    f = tmp_path / "c.toml"
    f.write_text("[train]\nlr = 2e-5\n")
    assert load_config("tree-grpo", f).train.lr == 2e-5  # a config file beats the preset's table
    assert load_config("tree-grpo", sets=["train.lr=7e-5"]).train.lr == 7e-5  # and so does --set
    f.write_text("[for_model.tiny-shapes]\ntrain.lr = 5e-5\n[for_model.tiny-shapes-video]\ntrain.lr = 9e-5\n")
    assert load_config("tree-grpo", f).train.lr == 5e-5  # a file's table beats the preset's


@pytest.mark.parametrize(
    "text, match",
    [
        ("[for_model]\nlr = 1\n", "one table per model"),
        ("[for_model.flux-dev]\ntrain.lrr = 1e-5\n", "did you mean 'train.lr'"),  # another model's typo fails too
        ('[for_model.tiny-shapes]\nmodel = "pixel"\n', "cannot set the model"),
    ],
)
def test_bad_for_model_tables_are_one_line_errors(tmp_path, text, match):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config("tree-grpo", f)


def test_unknown_preset_suggests():
    with pytest.raises(ConfigError, match="did you mean 'branch'"):
        load_config("brnch")


def test_bad_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config("branch", tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[tree\n")
    with pytest.raises(ConfigError, match="TOML"):
        load_config("branch", bad)


@pytest.mark.parametrize(
    "sets, words",
    [
        (["sampler.eta=0"], ["sampler.eta = 0", "tree.sde_steps = []"]),  # SDE steps with no noise: log(0)
        (["tree.branch_s=0"], ["tree.branch_s must be > 0"]),  # identical siblings
        (["tree.branch_s=-1"], ["tree.branch_s must be > 0"]),
    ],
)
def test_degenerate_noise_is_refused(sets, words):
    with pytest.raises(ConfigError) as e:
        load_config("branch", sets=sets)
    assert all(w in str(e.value) for w in words)


def test_eta_zero_is_fine_for_an_ode_only_rollout():
    cfg = load_config("branch", sets=["sampler.eta=0", "tree.sde_steps=[]", "tree.split_steps=[]"])
    assert cfg.sampler.eta == 0 and cfg.tree.sde_steps == ()


def _wrong_values(typ: str) -> list:
    """Values of the wrong type (or not finite) for a config annotation."""
    base = typ.removesuffix(" | None")
    inner = base[len("tuple[") :].split(",")[0] if base.startswith("tuple[") else None
    if inner is not None:
        return {"int": [("x",), (1.5,)], "float": [("x",), (math.nan,)], "str": [(1,), (2.5,)]}[inner]
    return {
        "bool": ["yes", 1.5],
        "int": ["three", 2.5, True, math.nan],
        "float": ["fast", math.nan, True],
        "str": [3, 1.5, True],
    }[base]


def _every_key() -> list[tuple[str, str]]:
    import dataclasses

    from treegrpo_cli.config import SECTIONS

    return [(f"{sec}.{f.name}", str(f.type)) for sec, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("key,typ", _every_key())
def test_every_key_refuses_values_of_the_wrong_type(key, typ):
    """Generated from the config's own annotations: each wrong value is one ConfigError naming the key."""
    import re

    from treegrpo_cli.config import build

    for value in _wrong_values(typ):
        with pytest.raises(ConfigError, match=re.escape(key)):
            build({"model": "pixel-tiny", key: value})
