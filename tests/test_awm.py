"""Advantage Weighted Matching (engine/awm.py, train.objective = "awm"): the loss against the released code's outputs
(bench/results/oracle_awm.json), the loss, advantages, noise levels and path credit by hand, refused settings, and the
training loop end to end (two iterations of both presets, exact resume with the anchor, staged against online, one
process against two)."""

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from clitools import bench_module, close, one_line_error, run, treegrpo, undeclared

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.awm import (
    AWMConfig,
    anchor_decay_at,
    awm_loss,
    matching_loss,
    path_advantages,
    scaled_advantage,
    strata,
    velocity_gap,
)
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.prompts import load_prompts
from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import MetricsRow, read_metrics, without_timings
from treegrpo_cli.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
ORACLE = json.loads((ROOT / "bench" / "results" / "oracle_awm.json").read_text())


@functools.cache
def _oracle_inputs() -> dict[str, torch.Tensor]:
    return bench_module("oracle_awm").inputs(ORACLE["inputs"]["seed"])


# --- against the released code ------------------------------------------------------------------------------


def test_the_oracle_ran_on_the_released_code_and_agreed():
    assert ORACLE["released"]["repository"] == "scxue/advantage_weighted_matching"
    assert len(ORACLE["released"]["commit"]) == 40 and ORACLE["agree"] and ORACLE["max_abs_diff"] <= 1e-5
    assert {row["weighting"] for row in ORACLE["log_prob"]} == {"uniform", "t", "t2", "huber", "ghuber"}


@pytest.mark.parametrize("row", ORACLE["log_prob"], ids=lambda r: r["weighting"])
def test_the_weighted_matching_loss_is_the_released_log_prob(row):
    """compute_log_prob_awm's log_prob = -w(l, t), every weighting, on the oracle's seeded inputs."""
    x = _oracle_inputs()
    ours = -matching_loss(x["v"], x["x0"], x["eps"], x["t"], row["weighting"], 0.25)
    torch.testing.assert_close(ours.double(), torch.tensor(row["released"], dtype=torch.float64), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("row", ORACLE["gradient"], ids=lambda r: "-".join(map(str, r["case"])))
def test_the_loss_gradient_and_penalties_are_the_released_ones(row):
    """The released micro-batch loss (ratio, clip, advantage clip and scale, KL to the reference and to the EMA
    anchor): its gradient in the velocity is that of the mean of our loss rows; its KL terms are our gaps' means."""
    weighting, kl_weight, beta, anchor_beta = row["case"]
    x, levels = _oracle_inputs(), ORACLE["inputs"]["levels"]
    cfg = AWMConfig(weighting=weighting, kl_weight=kl_weight, anchor_beta=anchor_beta)
    v = x["v"].clone().requires_grad_(True)
    a = scaled_advantage(x["adv"].repeat(levels), cfg)
    loss, k_ref, k_anchor = awm_loss(
        v, x["x0"], x["eps"], x["t"], a, cfg, kl_beta=beta, v_ref=x["v_ref"], v_anchor=x["v_anchor"]
    )
    loss.mean().backward()
    released = row["released"]
    torch.testing.assert_close(v.grad.flatten(), torch.tensor(released["grad"]), rtol=1e-4, atol=1e-7)
    assert float(k_ref.detach().mean()) == pytest.approx(released["kl"], rel=1e-5)
    assert float(k_anchor.detach().mean()) == pytest.approx(released["ema_kl"], rel=1e-5)


@pytest.mark.parametrize("row", ORACLE["timesteps"], ids=lambda r: f"{r['time_type']}-{r['seed']}")
def test_the_noise_levels_are_the_released_strata(row):
    """The released time types' grid steps from the same uniforms (torch.manual_seed(seed), then torch.rand)."""
    inp = ORACLE["inputs"]
    first, top = AWMConfig(levels=inp["levels"], time_sampling=row["time_type"]).grid(inp["grid"])
    torch.manual_seed(row["seed"])
    assert strata(torch.rand(inp["levels"]), first, top).tolist() == row["released"]


def test_the_anchor_decay_is_the_released_rule():
    for row in ORACLE["anchor_decay"]:
        assert anchor_decay_at(row["step"], AWMConfig(anchor_ramp=row["ramp"])) == pytest.approx(row["released"])


# --- by hand ---------------------------------------------------------------------------------------------------


def _one(x):
    return torch.tensor([[x]])


@pytest.mark.parametrize(
    "weighting, w",
    [("uniform", 0.25), ("t", 0.125), ("t2", 0.0625), ("huber", 0.249995), ("ghuber", 2 * (0.25**0.25 - 1e-10**0.25))],
)
def test_the_weightings_on_one_element(weighting, w):
    """x0 = 0, eps = 1 (target velocity 1), v = 0.5, t = 0.5: l = 0.25; huber 0.5 (sqrt(0.25) - 1e-5); ghuber
    0.5 (0.25^0.25 - 1e-10^0.25) / 0.25."""
    got = matching_loss(_one(0.5), _one(0.0), _one(1.0), torch.tensor([0.5]), weighting, 0.25)
    assert got.item() == pytest.approx(w, rel=1e-6)


def test_the_ghuber_gradient_is_the_advantage_times_its_slope():
    """a = 0.4: d(a w)/dv = a t (l + e)^(p - 1) dl/dv = 0.4 x 0.5 x 0.25^-0.75 x 2 (0.5 - 1) = -0.2 x 2.828427."""
    v = _one(0.5).requires_grad_(True)
    loss, k_ref, k_anchor = awm_loss(v, _one(0.0), _one(1.0), torch.tensor([0.5]), torch.tensor([0.4]), AWMConfig())
    loss.sum().backward()
    assert v.grad.item() == pytest.approx(-0.2 * 2.828427, rel=1e-5) and k_ref is None and k_anchor is None


def test_the_penalties_add_with_their_coefficients():
    """a = 0 leaves the penalties: kl_beta 0.5 x (1 - 0)^2 + anchor_beta 2 x (1 - 0.5)^2 = 1.0."""
    cfg = AWMConfig(weighting="uniform", anchor_beta=2.0)
    loss, k_ref, k_anchor = awm_loss(
        _one(1.0), _one(0.0), _one(1.0), torch.tensor([0.5]), torch.zeros(1), cfg, kl_beta=0.5,
        v_ref=_one(0.0), v_anchor=_one(0.5),
    )  # fmt: skip
    assert (loss.item(), k_ref.item(), k_anchor.item()) == pytest.approx((1.0, 1.0, 0.25))


def test_the_elbo_weight_of_the_penalties():
    """s_t = 0.7 sqrt(t / (1 - min(t, 0.99))): at t = 0.5 s = 0.7, 2 s^2 = 0.98; at t = 1, s = 7, 2 s^2 = 98."""
    gap = velocity_gap(torch.ones(2, 1), torch.zeros(2, 1), torch.tensor([0.5, 1.0]), "elbo")
    assert gap.tolist() == pytest.approx([1 / 0.98, 1 / 98])


def test_advantages_are_clipped_then_scaled():
    adv = torch.tensor([7.5, -2.5, 0.0, -9.0])
    assert scaled_advantage(adv, AWMConfig()).tolist() == pytest.approx([1.0, -0.5, 0.0, -1.0])
    assert scaled_advantage(adv, AWMConfig(adv_clip=2.0, adv_max=3.0)).tolist() == pytest.approx([3, -3, 0, -3])


def test_strata_of_the_grid():
    """linspace(1, 12, 7) cut to whole steps: strata [1,2) [2,4) [4,6) [6,8) [8,10) [10,12); a stratum narrower than a
    step gives its start."""
    assert strata(torch.tensor([0.0, 0.5, 0.999, 0.0, 0.5, 0.99]), 1, 12).tolist() == [1, 3, 5, 6, 9, 11]
    assert strata(torch.full((6,), 0.9), 1, 3).tolist() == [1, 1, 1, 2, 2, 2]
    assert AWMConfig().grid(14) == (1, 12) and AWMConfig(time_sampling="discrete").grid(14) == (0, 12)


def test_anchor_decay_ramps():
    cfg = AWMConfig()
    assert [anchor_decay_at(s, cfg) for s in (0, 1, 100, 300, 5000)] == pytest.approx([0, 0.001, 0.1, 0.3, 0.3])
    assert anchor_decay_at(1, AWMConfig(anchor_ramp="constant", anchor_decay=0.7)) == 0.7


def test_path_credit_gives_each_step_the_edge_that_made_it():
    """3 steps: root 0 splits at step 0 into 1, 2 (depth 1); 1 -> 3, 2 -> 4 (depth 2); 3 splits at step 2 into the
    leaves 5, 6, 4 -> leaf 7 (depth 3). Leaf 5's steps were made by the edges into 1, 3, 5."""
    parent = torch.tensor([-1, 0, 0, 1, 2, 3, 3, 4])
    depth = torch.tensor([0, 1, 1, 2, 2, 3, 3, 3])
    edge = torch.tensor([0.0, 0.5, -0.5, 0.5, -0.5, 1.0, 0.0, -0.5])
    got = path_advantages(parent, depth, edge, torch.tensor([5, 6, 7]), 3)
    assert got.tolist() == [[0.5, 0.5, 1.0], [0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]
    # an edge over two steps (a parent two steps up) makes both
    two = path_advantages(torch.tensor([-1, 0, 1]), torch.tensor([0, 2, 3]), torch.tensor([0.0, 0.25, -1.0]),
                          torch.tensor([2]), 3)  # fmt: skip
    assert two.tolist() == [[0.25, 0.25, -1.0]]


@pytest.mark.parametrize(
    "sets",
    [
        ['awm.weighting="huberish"'],
        ['awm.time_sampling="logit_normal"'],
        ['awm.kl_weight="ELBO"'],
        ['awm.anchor_ramp="cosine"'],
        ['awm.credit="edge"'],
        ["awm.ghuber_power=0"],
        ["awm.adv_clip=-1"],
        ["awm.adv_max=inf"],
        ["awm.anchor_beta=-0.5"],
        ["awm.anchor_decay=1.5"],
        ["awm.timestep_fraction=0"],
        ["awm.levels=0"],
        ["awm.steps=1.5"],
        ["awm.timestep_fraction=0.05"],  # int(14 x 0.05) = 0: no grid step to train
    ],
)
def test_bad_awm_settings(sets):
    with pytest.raises(ConfigError, match="awm"):
        load_config("awm", sets=sets)


def test_a_bad_awm_setting_is_one_line():
    one_line_error(run("train", "--preset", "awm", "--set", 'awm.weighting="huberish"'), "awm.weighting", "ghuber")
    one_line_error(run("train", "--preset", "tree-awm", "--set", "awm.timestep_fraction=0.05"), "sampler.steps = 14")


def test_awm_is_refused_with_fsdp():
    with pytest.raises(ConfigError, match="replicate"):
        load_config("awm", sets=['train.parallel="fsdp"'])


# --- the loop --------------------------------------------------------------------------------------------------

SMALL = ["rollout.num_prompts=2", "tree.trees_per_prompt=3", "train.eval_samples=0", "train.sample_every=0"]
TREE = ["rollout.num_prompts=2", "tree.split_steps=[0, 4]", "train.eval_samples=0", "train.sample_every=0"]


def _trainer(preset="awm", extra=()):
    return Trainer(load_config(preset, sets=[*SMALL, *extra]), "cpu")


@pytest.mark.slow
def test_an_awm_iteration_samples_on_policy_and_takes_one_step():
    """Rollouts use the trained weights, one optimizer step of every leaf at 6 levels, the anchor trails the trained
    weights by d = 0.001 after one step, 3 forwards per trained row in the FLOPs (theta, reference, anchor)."""
    t = _trainer()
    prompts = load_prompts("shapes-train")
    before = [p.detach().clone() for p in t.policy.trainable_parameters()]
    with t.sampling_policy():
        assert all(torch.equal(p, b) for p, b in zip(t.policy.trainable_parameters(), before, strict=True))
    row = t.iteration(prompts, lambda *a: None)
    assert row["adv_std"] > 0.5 and row["grad_norm"] > 0 and row["optimizer_steps"] == 1
    assert row["leaves"] == 6 and row["train_evals"] == 6 * 6 and row["rollout_evals"] == 6 * 14
    assert row["kl_ref"] == 0 and row["kl_anchor"] == 0  # the first step starts at the reference and the anchor
    theta = [p.detach() for p in t.policy.trainable_parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(theta, before, strict=True))
    d = row["anchor_decay"]
    assert d == pytest.approx(0.001)
    for o, a, b in zip(t.update.anchor.tensors, before, theta, strict=True):  # anchor = d initial + (1 - d) trained
        torch.testing.assert_close(o, d * a + (1 - d) * b)
    fwd, bwd = t.flops_row
    assert t.add_to_totals(row)["flops"] == 84 * fwd + 36 * (fwd + bwd + 2 * fwd)
    row = t.iteration(prompts, lambda *a: None)
    assert row["kl_ref"] > 0 and row["kl_anchor"] > 0
    t2 = _trainer(extra=["awm.steps=2", "awm.anchor_beta=0", "train.kl_beta=0"])
    row2 = t2.iteration(prompts, lambda *a: None)
    assert row2["optimizer_steps"] == 2 and "kl_anchor" not in row2 and "anchor_decay" not in row2
    assert t2.update.anchor is None and t2.extra_forwards == 0 and t2.checkpoint({}).update_state == {}


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["awm", "tree-awm"])
def test_both_presets_train_two_iterations(preset, tmp_path):
    sets = SMALL if preset == "awm" else [*TREE, 'awm.credit="path"']
    args = [x for s in sets for x in ("--set", s)]
    r = run("train", "--preset", preset, *args, "--iterations", 2, "--run-dir", tmp_path / "r")
    assert r.exit_code == 0, r.output
    rows = read_metrics(tmp_path / "r")
    assert [row["iteration"] for row in rows] == [0, 1] and [undeclared(row, MetricsRow) for row in rows] == [[], []]
    assert all(row["grad_norm"] > 0 and row["train_evals_per_leaf"] == 6 and row["anchor_decay"] > 0 for row in rows)
    ck = load_checkpoint(list_checkpoints(tmp_path / "r" / "checkpoints")[-1])
    assert set(ck.update_state) == {"anchor"} and set(ck.update_state["anchor"]) == set(ck.model)
    if preset == "tree-awm":  # 9 leaves a tree, every edge lends its advantage: 3 + 9 + 9 x 9 + ... edges
        assert rows[0]["leaves"] == 18 and rows[0]["trained_edges"] > rows[0]["leaves"]


@pytest.mark.slow
@pytest.mark.parametrize("preset,sets", [("awm", SMALL), ("tree-awm", TREE)])
def test_awm_resume_repeats_the_run_bitwise_and_keeps_the_anchor(preset, sets, tmp_path):
    args = ["--preset", preset, *(x for s in sets for x in ("--set", s)), "--set", "train.save_every=1"]
    assert run("train", *args, "--iterations", 3, "--run-dir", tmp_path / "a").exit_code == 0
    assert run("train", *args, "--iterations", 2, "--run-dir", tmp_path / "b").exit_code == 0
    r = run("train", "--resume", tmp_path / "b", "--iterations", 3)
    assert r.exit_code == 0, r.output
    assert without_timings(read_metrics(tmp_path / "b")) == without_timings(read_metrics(tmp_path / "a"))
    a, b = (load_checkpoint(list_checkpoints(tmp_path / x / "checkpoints")[-1]) for x in ("a", "b"))
    assert a.step == b.step == 3
    for k in a.model:
        assert torch.equal(a.model[k], b.model[k]) and torch.equal(
            a.update_state["anchor"][k], b.update_state["anchor"][k]
        )
    assert any(not torch.equal(a.update_state["anchor"][k], a.model[k]) for k in a.model)


@pytest.mark.slow
@pytest.mark.parametrize("preset,iteration,extra", [("awm", 0, ()), ("tree-awm", 3, ('awm.credit="path"',))])
def test_staged_awm_equals_online(preset, iteration, extra, tmp_path):
    """rollout, score, train --trees with train.objective = awm: the same weights and anchor after the update (path
    credit reads the scored edges' advantages)."""
    sets = ['model="pixel-tiny"', "rollout.num_prompts=3", "seed=7", *extra]
    sets += ["tree.trees_per_prompt=2"] if preset == "awm" else ["tree.split_steps=[0, 4]"]
    cfg = load_config(preset, sets=sets)
    trainer = Trainer(cfg, "cpu")
    trainer.step = iteration
    row = trainer.iteration(load_prompts(cfg.rollout.prompts), lambda *a: None)
    assert row["optimizer_steps"] == 1 and row["grad_norm"] > 0
    trees, run_dir = tmp_path / "trees", tmp_path / "run"
    args = [x for s in sets for x in ("--set", s)]
    assert run("rollout", "--preset", preset, *args, "--iteration", iteration, "--out", trees).exit_code == 0
    assert run("score", trees).exit_code == 0
    r = run("train", "--trees", trees, "--run-dir", run_dir, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [undeclared(row, MetricsRow) for row in read_metrics(run_dir)] == [[]]
    ck = load_checkpoint(Path(out["checkpoint"]))
    assert out["optimizer_steps"] == 1 and out["loss"] == pytest.approx(row["loss"], rel=1e-6)
    anchor = trainer.checkpoint({}).update_state["anchor"]
    for k, v in trainer.policy.trainable_state().items():
        assert torch.equal(v, ck.model[k]), k
        assert torch.equal(anchor[k], ck.update_state["anchor"][k]), k


@pytest.mark.slow
def test_two_processes_match_one_for_tree_awm(tmp_path):
    """The samples of each optimizer step, their noise levels, noises and path advantages do not depend on the
    process layout."""
    sets = [*TREE, "rollout.num_prompts=4", 'awm.credit="path"', "awm.steps=2"]
    args = ["--preset", "tree-awm", "--iterations", 2, "--seed", 3, *(x for s in sets for x in ("--set", s))]
    one = treegrpo(*args, "--run-dir", tmp_path / "one", timeout=600)
    assert one.returncode == 0, one.stderr
    two = treegrpo(*args, "--run-dir", tmp_path / "two", nproc=2, timeout=600)
    assert two.returncode == 0, two.stderr
    close(read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one"))
    assert math.isfinite(read_metrics(tmp_path / "one")[-1]["loss"])
