import math

import pytest

from treegrpo_cli.config import config_from_dict, load_config, preset_names
from treegrpo_cli.errors import ConfigError

ALL = ["branch", "branch-deppru", "branch-late", "branch-mix", "branch-widpru", "dance-grpo",
       "flow-grpo", "mix-grpo", "tree-grpo", "treepo"]


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


@pytest.mark.parametrize("sets,match", [
    (["tree.brnch=3"], "did you mean 'tree.branch'"),
    (["nonsense"], "key=value"),
    (["advantage.estimator=ppo"], "estimator"),
    (["tree.split_steps=[30]"], "outside"),
])
def test_bad_overrides_are_one_line_errors(sets, match):
    with pytest.raises(ConfigError, match=match):
        load_config("branch", sets=sets)


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


@pytest.mark.parametrize("sets, words", [
    (["sampler.eta=0"], ["sampler.eta = 0", "tree.sde_steps = []"]),       # SDE steps with no noise: log(0)
    (["tree.branch_s=0"], ["tree.branch_s must be > 0"]),                 # identical siblings
    (["tree.branch_s=-1"], ["tree.branch_s must be > 0"]),
])
def test_degenerate_noise_is_refused(sets, words):
    with pytest.raises(ConfigError) as e:
        load_config("branch", sets=sets)
    assert all(w in str(e.value) for w in words)


def test_eta_zero_is_fine_for_an_ode_only_rollout():
    cfg = load_config("branch", sets=["sampler.eta=0", "tree.sde_steps=[]", "tree.split_steps=[]"])
    assert cfg.sampler.eta == 0 and cfg.tree.sde_steps == ()
