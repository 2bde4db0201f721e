"""Flow-DPPO's KL mask (engine/kl_mask.py; train.trust = "kl-mask"): the released code's outputs stored by
bench/oracle_kl_mask.py, golden values of the formulas, the defaults' update bitwise as before, a flat and a tree
preset through the CLI with the mask on, and bad values refused in one line."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from clitools import bench_module, run, undeclared
from test_grpo import scored_batch
from test_ratio_guard import _old_update

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import grpo_update, make_optimizer
from treegrpo_cli.engine.kl_mask import KLMask, drop_mask, gaussian_kl, masked_objective
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.training.runlog import MetricsRow, read_metrics

ROOT = Path(__file__).resolve().parents[1]
STORED = json.loads((ROOT / "bench" / "results" / "oracle_kl_mask.json").read_text())
SMALL = ['model="pixel-tiny"', "rollout.num_prompts=2", "train.eval_samples=0", "train.sample_every=0"]


def _oracle():
    return bench_module("oracle_kl_mask")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_ours_matches_the_released_code_stored_by_the_oracle(reduction):
    mod = _oracle()
    assert mod.SEED == STORED["seed"] and STORED[reduction]["max_abs_diff"]["grad"] <= STORED["tolerance"]
    mine = mod.ours(mod.make_inputs(), reduction, STORED[reduction]["kl_mask_threshold"])
    rel = STORED["released"]
    assert mine["drop"] == rel["drop"] and 0 < sum(rel["drop"]) < len(rel["drop"])
    for k in ("kl", "loss_per_edge", "grad", "std"):
        assert mine[k] == pytest.approx(rel[k], abs=1e-5), k
    assert mine["loss"] == pytest.approx(rel["loss"], abs=1e-6)


def test_golden_values():
    mean, old, std = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.zeros(2, 2), torch.tensor([1.0, 0.5])
    assert gaussian_kl(mean, old, std, "sum").tolist() == pytest.approx([2.5, 0.0])
    assert gaussian_kl(mean, old, std, "mean").tolist() == pytest.approx([1.25, 0.0])
    kl = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.1])
    ratio = torch.tensor([1.1, 0.9, 0.9, 1.1, 1.1])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    # past the threshold and moving away: dropped; corrective moves and low KL kept
    assert drop_mask(kl, ratio, adv, 0.5).tolist() == [True, True, False, False, False]
    r = ratio.clone().requires_grad_(True)
    loss = masked_objective(r, adv, drop_mask(kl, ratio, adv, 0.5))
    assert loss.tolist() == pytest.approx([0.0, 0.0, -0.9, 1.1, -1.1])
    loss.sum().backward()
    assert r.grad is not None and r.grad.tolist() == pytest.approx([0.0, 0.0, -1.0, 1.0, -1.0])
    big = masked_objective(torch.tensor([math.inf]), torch.tensor([1.0]), torch.tensor([True]))
    assert big.tolist() == [0.0]  # an overflowing dropped ratio gives 0, not nan
    m = KLMask(0.5, "sum")
    out, drop = m.objective(ratio[:2], adv[:2], mean, old, std, torch.tensor([0, 0]))
    assert drop.tolist() == [True, True] and out.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("preset", ["tree-grpo", "flow-grpo"])
def test_the_defaults_leave_the_update_bitwise_as_it_was(preset):
    cfg, policy, sde, batch, _ = scored_batch(preset, sets=["train.minibatches=2"])
    assert (cfg.train.trust, cfg.train.kl_mask_reduction, cfg.train.kl_mask_threshold) == ("clip", "sum", 0.0)
    w0 = {k: v.clone() for k, v in policy.trainable_state().items()}
    weights = []
    for update in (grpo_update, _old_update):
        policy.load_trainable_state({k: v.clone() for k, v in w0.items()})
        opt = make_optimizer(list(policy.trainable_parameters()), cfg.train)
        update(policy, opt, sde, batch, cfg.train, torch.Generator().manual_seed(0))
        weights.append(policy.trainable_state())
    for k in w0:
        assert torch.equal(weights[0][k], weights[1][k]), k


def test_the_mask_moves_the_update_and_drops_only_after_the_first_step():
    out = {}
    for threshold in (1e9, 1e-12):
        cfg, policy, sde, batch, _ = scored_batch("flow-grpo", sets=["tree.trees_per_prompt=4"])
        train = replace(cfg.train, trust="kl-mask", kl_mask_threshold=threshold, lr=0.05)
        opt = make_optimizer(list(policy.trainable_parameters()), train)
        m = grpo_update(policy, opt, sde, batch, train, torch.Generator().manual_seed(0))
        assert m["optimizer_steps"] == 2 and m["ratio_first_dev"] < 1e-5
        out[threshold] = m["kl_mask_frac"], policy.trainable_state()
    assert out[1e9][0] == 0.0 and 0.0 < out[1e-12][0] < 0.5  # the first step's KLs are 0: nothing dropped there
    assert any(not torch.equal(out[1e9][1][k], out[1e-12][1][k]) for k in out[1e9][1])


@pytest.mark.parametrize(
    "sets,needle",
    [
        (['train.trust="kl"'], "train.trust must be one of clip, kl-mask"),
        (['train.kl_mask_reduction="max"'], "train.kl_mask_reduction must be one of sum, mean"),
        (["train.kl_mask_threshold=-1e-5"], "train.kl_mask_threshold must be a number >= 0"),
        (['train.kl_mask_threshold="1e-5"'], "train.kl_mask_threshold must be a number"),
        (['train.trust="kl-mask"', 'train.ratio_norm="code"'], 'does not combine with train.ratio_norm = "code"'),
    ],
)
def test_bad_settings_are_one_line_errors(sets, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        load_config("flow-grpo", sets=sets)
    assert "\n" not in str(e.value)


def test_settings_that_are_ignored_warn():
    (w,) = load_config("flow-grpo", sets=["train.kl_mask_threshold=1e-3"]).warnings()
    assert 'train.kl_mask_threshold set, but train.trust = "clip" ignores it' in w
    (w,) = load_config("nft", sets=['train.trust="kl-mask"']).warnings()
    assert "train.trust set, but train.objective = nft ignores it" in w


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset,extra",
    [("flow-grpo", ["tree.trees_per_prompt=4"]), ("branch-mix-flow", ['train.kl_mask_reduction="mean"'])],
)
def test_a_flat_and_a_tree_preset_train_two_iterations_with_the_mask(preset, extra, tmp_path):
    sets = [*SMALL, 'train.trust="kl-mask"', *extra]
    args = [x for s in sets for x in ("--set", s)]
    r = run("train", "--preset", preset, *args, "--iterations", 2, "--run-dir", tmp_path / "r")
    assert r.exit_code == 0, r.output
    rows = read_metrics(tmp_path / "r")
    assert [row["iteration"] for row in rows] == [0, 1]
    assert [undeclared(row, MetricsRow) for row in rows] == [[], []]
    assert all(row["trained_edges"] > 0 and math.isfinite(row["loss"]) for row in rows)
    assert all(0.0 <= row["kl_mask_frac"] <= 1.0 for row in rows)
    cfg = json.loads((tmp_path / "r" / "run.json").read_text())["config"]["train"]
    assert cfg["trust"] == "kl-mask"


def test_the_default_threshold_is_the_recipes_per_element_in_either_reduction():
    from treegrpo_cli.engine.kl_mask import RECIPE_DELTA, KLMask, gaussian_kl

    torch.manual_seed(0)
    mean, old = torch.randn(6, 4, 8, 8), torch.randn(6, 4, 8, 8)
    mean = old + 1e-4 * (mean - old) * torch.arange(1, 7).view(6, 1, 1, 1)  # KLs spread around the threshold
    std = torch.full((6,), 0.1)
    ratio, adv, slot = torch.full((6,), 1.1), torch.ones(6), torch.arange(6)
    drops = [KLMask(0.0, r).objective(ratio, adv, mean, old, std, slot)[1] for r in ("sum", "mean")]
    assert torch.equal(drops[0], drops[1]) and 0 < int(drops[0].sum()) < 6
    per_element = gaussian_kl(mean, old, std, "mean")
    assert torch.equal(drops[1], per_element >= RECIPE_DELTA)  # |mu - mu_old|^2 / (2 s^2), meaned, at 1e-5
    assert KLMask(0.0, "sum").delta(256) == pytest.approx(256 * 1e-5) and KLMask(3e-4, "sum").delta(256) == 3e-4
