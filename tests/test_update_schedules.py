"""Optimizer steps and EMA updates per iteration, preset by preset, against the released codes' rules
(methods.md 2, 3, 6.3, 7.3 and 15). Each expected count is written as the code states it, from the
iteration's own numbers (trained transitions, training nodes, the run's optimizer step counter), not from
our minibatch plan."""

import math

import pytest
import torch
from test_grpo import PROMPTS, scored_batch
from typer.testing import CliRunner

from treegrpo_cli.cli.app import app
from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import TrainConfig, grpo_update
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.training.runlog import read_metrics
from treegrpo_cli.training.trainer import Trainer

runner = CliRunner()
BRANCH_FAMILY = ["branch", "branch-late", "branch-widpru", "branch-deppru", "branch-mix", "branch-mix-flow", "treepo"]


def rows(tmp_path, preset, iterations, *sets):
    args = ["train", "--preset", preset, "--set", 'model="pixel-tiny"', "--iterations", str(iterations)]
    args += [a for s in sets for a in ("--set", s)] + ["--run-dir", str(tmp_path / preset)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return read_metrics(tmp_path / preset)


@pytest.mark.slow
@pytest.mark.parametrize("preset", BRANCH_FAMILY)
def test_branchgrpo_steps_every_12_transitions_of_2_trees(tmp_path, preset):
    """BranchGRPO's train_one_step_tree: each process (train_batch_size 2 trees) calls optimizer.step() after
    every gradient_accumulation_steps = 12 of its transitions, and once more for a remainder, the processes'
    gradients averaged; no EMA in that trainer. One process with 2 trees is the code's process; 4 trees
    are two of them: a step every 24 of the batch's transitions."""
    for trees in (2, 4):
        for row in rows(tmp_path / str(trees), preset, 1, f"rollout.num_prompts={trees}"):
            assert row["optimizer_steps"] == math.ceil(row["edges"] / (12 * trees // 2))
            assert row["ema_updates"] == 0


def test_branchgrpo_trains_the_last_step_edge():
    """The released code collects every parent -> child transition, the last step's included, though the
    scored image is the last x0-prediction; the paper's objective (`train_last = false`) has no gradient there."""
    cfg, _, _, batch, _ = scored_batch("branch", prompts=PROMPTS[:1], sets=["pruning.skip_zero_advantage=false"])
    depth, trained = batch.tree.depth, batch.trained
    assert cfg.sampler.decode == "x0" and bool(trained[depth == cfg.sampler.steps].all())
    _, _, _, paper, _ = scored_batch(
        "branch", prompts=PROMPTS[:1], sets=["pruning.skip_zero_advantage=false", "pruning.train_last=false"]
    )
    assert not bool(paper.trained[depth == cfg.sampler.steps].any())
    assert int(trained.sum()) - int(paper.trained.sum()) == 16  # one last-step edge per leaf


@pytest.mark.slow
def test_treegrpo_two_steps_per_epoch(tmp_path):
    """TreeGRPO's train(): gradient accumulation max(1, #training nodes // 2), so #nodes // accumulation
    optimizer steps an epoch (2 from 4 nodes up); no EMA."""
    for row in rows(tmp_path, "tree-grpo", 2):
        nodes = row["edges"] // 3  # every training node has k = 3 children, all trained
        assert nodes >= 4 and row["optimizer_steps"] == nodes // max(1, nodes // 2) == 2
        assert row["ema_updates"] == 0


def test_node_sum_is_k_times_the_edge_mean_gradient():
    """TreeGRPO's code sums a node's k children's losses (tree.loss_agg = "sum") and averages over nodes:
    with every node's 3 children trained, 3 times the gradient of the mean over edges."""
    _, _, sde, batch, _ = scored_batch("tree-grpo", prompts=PROMPTS[:1], sets=["pruning.skip_zero_advantage=false"])
    grads = {}
    for norm in ("mean", "node-sum"):
        policy = load_policy("pixel-tiny")
        tc = TrainConfig(loss_norm=norm, max_grad_norm=1e9)
        opt = torch.optim.SGD(list(policy.trainable_parameters()), lr=0.0)
        m = grpo_update(policy, opt, sde, batch, tc, torch.Generator().manual_seed(0))
        assert m["edges"] == 39 and m["optimizer_steps"] == 1
        grads[norm] = torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])
    assert grads["mean"].abs().max() > 0
    scale = float(grads["mean"].abs().max())
    torch.testing.assert_close(grads["node-sum"], 3 * grads["mean"], rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.slow
def test_dancegrpo_two_steps_and_one_ema_update(tmp_path):
    """DanceGRPO's 8-GPU script: 2 prompts x 12 samples a GPU, a step every 12 samples (2 an iteration), and
    its EMA updated once per iteration."""
    for row in rows(tmp_path, "dance-grpo", 2):
        assert row["optimizer_steps"] == 2 and row["ema_updates"] == 1


@pytest.mark.slow
def test_flowgrpo_ema_every_8_optimizer_steps(tmp_path):
    """Flow-GRPO: two optimizer steps an epoch, then ema.step(params, global_step) after global_step += 1,
    which updates when (global_step + 1) % 8 == 0: after optimizer steps 7, 15, ..."""
    got = rows(tmp_path, "flow-grpo", 8, "rollout.num_prompts=1", "tree.trees_per_prompt=4")
    s, expected = 0, []
    for row in got:
        assert row["optimizer_steps"] == 2
        hits = 0
        for _ in range(row["optimizer_steps"]):
            s += 1
            hits += (s + 1) % 8 == 0
        expected.append(hits)
    assert [row["ema_updates"] for row in got] == expected == [0, 0, 0, 1, 0, 0, 0, 1]


def test_flowgrpo_ema_warmup_decay():
    """The EMA after optimizer step s moves by 1 - min((1 + s) / (10 + s), 0.9) toward the weights."""
    cfg = load_config("flow-grpo", sets=['model="pixel-tiny"', "train.kl_beta=0"])
    trainer = Trainer(cfg, "cpu")
    start = {k: v.clone() for k, v in trainer.ema.items()}
    name, param = next(iter(trainer.policy.trainable_state().items()))
    for s in range(1, 8):
        param.add_(1.0)  # the weights after optimizer step s
        trainer.after_step()
        assert trainer.opt_steps == s
    d = 8 / 17  # min((1 + 7) / (10 + 7), 0.9): the one update, after step 7
    torch.testing.assert_close(trainer.ema[name], d * start[name] + (1 - d) * param)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["mix-grpo", "tree-grpo-mean"])
def test_one_step_of_the_mean_elsewhere(tmp_path, preset):
    for row in rows(tmp_path, preset, 1):
        assert row["optimizer_steps"] == 1 and row["ema_updates"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["nft", "tree-nft"])
def test_nft_one_step_and_one_ema_update_per_iteration(tmp_path, preset):
    """DiffusionNFT's code (gradient_step_per_epoch = 1): gradients accumulated over every micro-batch and
    timestep of the epoch, one optimizer step, then ema.step(params, global_step) with update_step_interval 1."""
    for row in rows(tmp_path, preset, 2, "rollout.num_prompts=1", "tree.trees_per_prompt=2"):
        assert row["optimizer_steps"] == 1 and row["ema_updates"] == 1
