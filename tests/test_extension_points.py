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


# -- a diffusers model is one adapter file -------------------------------------------------------------------------

TOY_MODEL = '''"""A throwaway model: SD1.5's plumbing under another name, with its card, its release's configs (a
narrower UNet) and its tiny pipeline, all in this one file."""

from dataclasses import replace

from .catalog import AdapterCard
from .sd import RELEASES as SD_RELEASES
from .sd import SDPolicy, tiny_sd

_SD15 = SD_RELEASES["sd1.5"]


class ToyPolicy(SDPolicy):
    card = AdapterCard(
        name="toy",
        family="Toy-1",
        pipelines=("ToyPipeline",),
        releases={"toy-1": "toy-org/Toy-1"},
        defaults={"rollout.max_batch": 2},
        release_defaults={"toy-1": {"policy.guidance": 2.0}},
        predicts="noise (epsilon)",
        sampling="DDIM, as SD1.5",
    )


NARROW = {**_SD15.config, "block_out_channels": [32, 64, 128, 128]}
RELEASES = {"toy-1": replace(_SD15, config=NARROW, guidance="true CFG 2.0", denoiser_b=0.03)}
TINY_PIPELINES = {"toy": tiny_sd}
'''

TOY_CHECKS = """
import sys
from pathlib import Path

import pytest
import treegrpo_cli

root, copy, tmp = map(Path, sys.argv[1:4])
assert Path(treegrpo_cli.__file__).is_relative_to(copy), treegrpo_cli.__file__  # the copy, not the checkout

# 1. the catalog checks, on the package with the toy in it
assert pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", str(root / "tests" / "test_models_catalog.py")]) == 0
from treegrpo_cli.models import catalog, hub, registry, releases
from treegrpo_cli.cli.common import MODEL_PANEL
from tinypipes import TINY

assert hub.KNOWN["toy-1"] == ("toy-org/Toy-1", "toy") and hub.PIPELINES["ToyPipeline"] == "toy"
assert registry.model_defaults("toy-1") == {"rollout.max_batch": 2, "policy.guidance": 2.0}
assert "Toy-1" in MODEL_PANEL and releases.release("toy-1").adapter == "toy" and TINY["toy"] is TINY["sd"]

# 2. the command line: a dry run, then one iteration, of the toy release with random weights at the tiny size
from clitools import run

random = ["--set", 'policy.weights="random"', "--set", 'policy.size="tiny"', "--reward", "jpeg-compressibility"]
r = run("train", "--model", "toy-1", *random, "--dry-run")
assert r.exit_code == 0 and "model toy-1 (random weights, tiny size)" in r.output, r.output
small = ["--set", "rollout.num_prompts=2", "--set", "sampler.steps=4", "--set", "train.eval_samples=0"]
r = run("train", "--model", "toy-1", *random, *small, "--iterations", 1, "--run-dir", tmp / "run")
assert r.exit_code == 0 and (tmp / "run" / "run.json").is_file(), r.output
assert '"adapter": "toy"' in (tmp / "run" / "run.json").read_text()

# 3. docs/models.md's tables, generated: a row of the toy in each (its memory counted from its configs), the rest
# of the page as it is
sys.path.insert(0, str(root / "bench"))
import model_memory

text = (root / "docs" / "models.md").read_text()
page = model_memory.page(text, model_memory.rows(model_memory.recorded()))
added = [line for line in page.splitlines() if line not in text.splitlines()]
assert len(added) == 2, added
assert added[0].startswith("| Toy-1 | `toy-1` | `ToyPipeline` | `models/toy.py` `ToyPolicy` | UNet2DConditionModel")
assert added[1].startswith("| `toy-1` | toy-org/Toy-1 | 0.") and "| true CFG 2.0 |" in added[1], added[1]
print("ok")
"""


@pytest.mark.slow
def test_a_throwaway_model_added_in_one_file_passes_the_checks(tmp_path):
    """A copy of the package with models/toy.py added (a subclass of an adapter with its own card, release configs
    and tiny pipeline) and nothing else edited: the catalog tests pass on it, `train --dry-run` and a 1-iteration
    `train` run it with random weights, and docs/models.md's generated tables have its rows."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import treegrpo_cli
    from treegrpo_cli.models import catalog

    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "pkg" / "treegrpo_cli"
    shutil.copytree(Path(treegrpo_cli.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "presets", copy / "presets")  # where an installed package has them
    (copy / "models" / "toy.py").write_text(TOY_MODEL)
    env = {
        "PYTHONPATH": f"{copy.parent}:{root / 'tests'}",
        "HF_HOME": str(tmp_path / "hf"),
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }
    args = [sys.executable, "-c", TOY_CHECKS, str(root), str(copy), str(tmp_path)]
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout[-3000:], r.stderr[-3000:])
    assert "toy" not in catalog.entries()  # the checkout's package is as it was
