"""Extension points written in one place: an advantage estimator is its decorated function, and everything that
lists, dispatches or checks estimators follows from the registry (engine/advantages.py)."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from clitools import run
from treeshapes import structure

from treegrpo_cli.cli.config_doc import field_docs, markdown
from treegrpo_cli.cli.score_cmd import declared_estimators
from treegrpo_cli.config import config_layers, load_config, user_warnings
from treegrpo_cli.engine.advantages import (
    ESTIMATORS,
    OWN_KEYS,
    REGISTRY,
    AdvantageConfig,
    Advantages,
    Batch,
    choices,
    estimate,
    estimator,
    from_leaves,
    readers,
)
from treegrpo_cli.engine.credit import assign_credit
from treegrpo_cli.engine.pruning import PruneConfig
from treegrpo_cli.errors import ConfigError

NAN = math.nan
# the section 9 example of methods.md: R=0, A=1, B=2, leaves a1=3, a2=4 (under A), b1=5, b2=6 (under B)
PARENT = torch.tensor([-1, 0, 0, 1, 1, 2, 2])
DEPTH = torch.tensor([0, 1, 1, 2, 2, 2, 2])
ZERO = torch.zeros(7, dtype=torch.long)
REWARD = torch.tensor([NAN, NAN, NAN, 1.0, 2.0, 3.0, 4.0])
LOGP = torch.tensor([NAN, -1.0, -1.2, -0.9, -1.1, -1.0, -1.0])
THROWAWAY = "centred"


@pytest.fixture
def centred():
    """A throwaway estimator, added from this one place: each leaf's reward minus the batch's mean leaf reward, an
    edge the mean (or sum: advantage.shared_edge) of the leaves below it. Unregistered after the test."""

    @estimator(THROWAWAY, reads=("shared_edge",))
    def centred_leaves(cfg: AdvantageConfig, b: Batch) -> Advantages:
        return from_leaves(cfg, b, b.reward - b.reward[b.leaf].mean())

    yield THROWAWAY
    REGISTRY.pop(THROWAWAY)


def test_a_throwaway_estimator_added_in_one_place_passes_the_checks(centred):
    # the config takes it, and says which of the keys it does not read were set
    cfg = load_config("branch", sets=[f'advantage.estimator="{centred}"'])
    assert cfg.advantage.estimator == centred and centred in ESTIMATORS
    sets = [f'advantage.estimator="{centred}"', 'advantage.shared_edge="sum"', 'advantage.backup="mean"']
    cfg = load_config("branch", sets=sets)
    assert [w for w in user_warnings(cfg, config_layers("branch", None, sets)) if "advantage" in w] == [
        f"warning: advantage.backup set, but advantage.estimator = '{centred}' ignores it"
    ]
    # the help lists it: the config reference, and the error for a name that is not registered
    assert f'"{centred}"' in choices() and f'"{centred}"' in markdown()
    with pytest.raises(ConfigError, match=f"one of {', '.join(ESTIMATORS)}; got 'ppo'"):
        load_config("branch", sets=['advantage.estimator="ppo"'])
    assert ", centred;" in str(pytest.raises(ConfigError, AdvantageConfig("ppo").validate).value)
    # estimate dispatches to it: leaves 1, 2, 3, 4 (mean 2.5), edges into A and B the mean of their two leaves
    a = estimate(
        AdvantageConfig(centred), parent=PARENT, depth=DEPTH, tree=ZERO, group=ZERO, reward=REWARD, log_prob=LOGP
    )
    assert a.edge.tolist() == [0.0, -1.0, 1.0, -1.5, -0.5, 0.5, 1.5] and a.valid.tolist() == [False] + [True] * 6
    # and so does credit assignment, with the key it reads
    tree = structure(PARENT, DEPTH, ZERO, [0], log_prob=LOGP)
    adv, trained = assign_credit(
        tree, {"r": REWARD}, weights={"r": 1.0}, combine_mode="rewards", pruning=PruneConfig(), steps=2,
        decode="final", advantage=AdvantageConfig(centred, shared_edge="sum"),
    )  # fmt: skip
    assert adv.edge.tolist() == [0.0, -2.0, 2.0, -1.5, -0.5, 0.5, 1.5] and trained.tolist() == [False] + [True] * 6


def test_an_unregistered_estimator_is_refused():
    assert THROWAWAY not in ESTIMATORS  # the fixture unregisters its estimator
    with pytest.raises(ConfigError, match="advantage.estimator must be one of"):
        load_config("branch", sets=[f'advantage.estimator="{THROWAWAY}"'])


def test_the_registry_refuses_a_key_no_config_has_and_a_name_twice():
    with pytest.raises(ValueError, match="reads tempreature: not AdvantageConfig keys"):
        estimator("typo", reads=("temperature", "tempreature"))
    with pytest.raises(ValueError, match="'flat' is registered twice"):
        estimator("flat")
    assert "typo" not in REGISTRY and REGISTRY["flat"].reads == ("ddof", "eps", "flat_std", "shared_edge")


def test_every_key_is_read_by_some_estimator_and_the_comments_name_their_readers():
    """A key no estimator reads is dead; a field comment that starts with estimator names (`flat, treepo: ...`)
    names exactly the estimators that read it."""
    docs = field_docs(AdvantageConfig)
    names = "|".join(map(re.escape, ESTIMATORS))
    for f in dataclasses.fields(AdvantageConfig):
        who = readers(f.name)
        assert who, f"no estimator reads advantage.{f.name}"
        named = re.match(rf"((?:{names})(?:, (?:{names}))*)\b", docs[f.name])
        if who != list(ESTIMATORS):
            assert named and named.group(1).split(", ") == who, (f.name, docs[f.name], who)
    assert set(OWN_KEYS) <= {f.name for f in dataclasses.fields(AdvantageConfig)}


def test_the_cli_help_lists_the_registry():
    """`treegrpo score --help` reads the estimators from engine/advantages.py's source (the CLI starts without
    torch): the same names as the registry, in its order."""
    assert declared_estimators() == list(ESTIMATORS)
    r = run("score", "--help")
    assert r.exit_code == 0 and " | ".join(ESTIMATORS) in " ".join(r.stdout.replace("│", " ").split())
    row = next(line for line in markdown().splitlines() if line.startswith("| `advantage.estimator`"))
    assert " \\| ".join(f'"{n}"' for n in ESTIMATORS) in row


def test_a_key_the_estimator_ignores_warns_unless_a_preset_set_it():
    """`--preset branch --set advantage.backup="mean"`: one warning line; the flat preset's tuning left unused by a
    later `--set advantage.estimator`: quiet, like other keys a later layer switched off."""
    r = run("config", "show", "--preset", "branch", "--set", 'advantage.backup="mean"')
    said = "warning: advantage.backup set, but advantage.estimator = 'branch' ignores it"
    assert r.exit_code == 0 and r.stderr.splitlines() == [said], r.stderr
    r = run("config", "show", "--preset", "flow-grpo", "--set", 'advantage.estimator="branch"')
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    r = run(
        "config",
        "show",
        "--preset",
        "flow-grpo",
        "--set",
        'advantage.estimator="treegrpo"',
        "--set",
        "advantage.beta=1",
    )
    assert r.stderr.splitlines() == ["warning: advantage.beta set, but advantage.estimator = 'treegrpo' ignores it"], (
        r.stderr
    )
