import pytest
import torch
from treeshapes import structure

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.credit import assign_credit
from treegrpo_cli.engine.grpo import Batch, TrainConfig, clipped_loss, grpo_update, make_optimizer
from treegrpo_cli.engine.rollout import rollout
from treegrpo_cli.engine.sde import FlowSDE
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.rewards.base import get_reward, score_leaves

PROMPTS = ["a red circle", "two blue squares"]


def scored_batch(preset, sets=(), prompts=PROMPTS, seed=3):
    cfg = load_config(preset, sets=['model="pixel-tiny"', *sets])
    policy = load_policy(cfg.model)
    sde = FlowSDE(cfg.sampler)
    tree, nfe = rollout(policy, prompts, list(range(len(prompts))), sde, cfg.tree, seed)
    leaves = tree.leaves()
    images = policy.decode(tree.image_latent)
    r = score_leaves(
        {"jpeg": get_reward("jpeg-incompressibility")},
        images,
        [prompts[int(p)] for p in tree.tree_prompt[tree.tree[leaves]]],
    )["jpeg"]
    full = torch.full((tree.num_nodes,), float("nan")).index_put_((leaves,), r)
    adv, trained = assign_credit(
        tree,
        {"jpeg": full},
        weights={"jpeg": 1.0},
        combine_mode="rewards",
        advantage=cfg.advantage,
        pruning=cfg.pruning,
        steps=cfg.sampler.steps,
        decode=cfg.sampler.decode,
    )
    cond = policy.encode([prompts[int(p)] for p in tree.tree_prompt])
    return cfg, policy, sde, Batch(tree, trained, adv.edge, cond), nfe


def test_clipped_loss_golden():
    new, old = torch.log(torch.tensor([1.5, 0.5, 1.0005])), torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, ratio = clipped_loss(new, old, adv, 1e-3)
    # A>0, rho 1.5 -> clipped at 1.001; A<0, rho 0.5 -> clipped at 0.999; inside the range -> -A*rho
    assert loss.tolist() == pytest.approx([-1.001, 0.999, -2.001], abs=1e-5)
    assert ratio.tolist() == pytest.approx([1.5, 0.5, 1.0005], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["branch", "tree-grpo", "dance-grpo", "mix-grpo"])
def test_ratio_is_one_before_the_first_update(preset):
    cfg, policy, sde, batch, _ = scored_batch(preset)
    opt = make_optimizer(list(policy.trainable_parameters()), cfg.train)
    m = grpo_update(policy, opt, sde, batch, cfg.train, torch.Generator().manual_seed(0), max_batch=7)
    assert m["edges"] > 0
    assert m["ratio_first_dev"] < 1e-5
    if m["optimizer_steps"] == 1:
        assert abs(m["ratio_min"] - 1) < 1e-5 and abs(m["ratio_max"] - 1) < 1e-5


PAPER = ("pruning.train_last=false", 'train.loss_norm="mean"')  # BranchGRPO's objective: one step of the mean


@pytest.mark.slow
def test_training_evaluations_match_the_tree_shape():
    cfg, policy, sde, batch, nfe = scored_batch("branch", prompts=PROMPTS[:1], sets=PAPER)
    opt = make_optimizer(list(policy.trainable_parameters()), cfg.train)
    m = grpo_update(policy, opt, sde, batch, cfg.train, torch.Generator().manual_seed(0))
    assert nfe == 203
    assert m["train_evals"] == 203 - 16  # every parent except the last step's (x0 decode: not trained)
    assert m["edges"] == 218 - 16  # every edge except the last step's
    _, policy, sde, pruned, _ = scored_batch("branch-widpru", prompts=PROMPTS[:1], sets=PAPER)
    m2 = grpo_update(
        policy,
        make_optimizer(list(policy.trainable_parameters()), cfg.train),
        sde,
        pruned,
        cfg.train,
        torch.Generator().manual_seed(0),
    )
    # Parent-Top1 keeps 8 of the 16 chains below the last split (steps 10..18 -> 9 parents each)
    assert m2["train_evals"] == 187 - 8 * 9  # the 8 dropped chains own no trained edge at depths 10..18
    _, policy, sde, deep, _ = scored_batch("branch-deppru", prompts=PROMPTS[:1], sets=PAPER)
    m3 = grpo_update(
        policy,
        make_optimizer(list(policy.trainable_parameters()), cfg.train),
        sde,
        deep,
        cfg.train,
        torch.Generator().manual_seed(0),
    )
    assert m3["edges"] == 202 - 4 * 16  # depths 15..18 left out
    _, _, _, code, _ = scored_batch("branch", prompts=PROMPTS[:1])  # the released code's schedule: the last step too
    assert int(code.trained.sum()) == 218


def test_each_edge_log_prob_moves_with_the_sign_of_its_own_advantage():
    """One small SGD step on a single trained edge raises its log-prob when its advantage is positive and
    lowers it when negative (first order: d log p = lr * A * |grad log p|^2), checked for edges of both signs
    against a freshly loaded policy each time."""
    from treegrpo_cli.engine.grpo import _edge_terms

    cfg, _, sde, batch, _ = scored_batch("tree-grpo", prompts=PROMPTS[:1])
    edges = torch.nonzero(batch.trained & (batch.advantage.abs() > 1e-3)).flatten()
    signs = batch.advantage[edges] > 0
    picked = torch.cat([edges[signs][:4], edges[~signs][:4]])
    assert len(picked) == 8
    for e in picked.tolist():
        policy = load_policy(cfg.model)
        only = torch.zeros_like(batch.trained)
        only[e] = True
        one = Batch(batch.tree, only, batch.advantage, batch.cond)
        opt = torch.optim.SGD(list(policy.trainable_parameters()), lr=0.1)
        grpo_update(policy, opt, sde, one, TrainConfig(max_grad_norm=1e9), torch.Generator().manual_seed(0))
        with torch.no_grad():
            new_lp = float(_edge_terms(policy, sde, one, torch.tensor([e]), None)[0][0])
        moved = new_lp - float(batch.tree.log_prob[e])
        adv = float(batch.advantage[e])
        assert moved * adv > 0 and abs(moved) > 1e-6, (e, adv, moved)


def test_minibatches_and_per_transition_modes():
    cfg, policy, sde, batch, _ = scored_batch("tree-grpo", prompts=PROMPTS[:1])
    for tc in (TrainConfig(minibatches=3), TrainConfig(loss_norm="per-transition", accum_edges=10)):
        opt = make_optimizer(list(policy.trainable_parameters()), tc)
        m = grpo_update(policy, opt, sde, batch, tc, torch.Generator().manual_seed(1))
        assert m["edges"] == 3 + 9 + 27
    assert m["optimizer_steps"] == 4  # 39 edges in steps of 10


def test_kl_to_reference_starts_at_zero():
    cfg, policy, sde, batch, _ = scored_batch("branch")
    tc = TrainConfig(kl_beta=0.04)
    m = grpo_update(
        policy,
        make_optimizer(list(policy.trainable_parameters()), tc),
        sde,
        batch,
        tc,
        torch.Generator().manual_seed(0),
        ref=policy.reference(),
    )
    assert m["kl_ref"] == pytest.approx(0.0, abs=1e-10)


def test_kl_to_reference_golden_values():
    """A mean 0.1 away from the reference's in every element, std 0.2, a step of dsigma = -0.04:
    paper form 0.01 / (2 * 0.04) = 0.125; the released code's form divides by g^2 = 0.04 / 0.04 = 1: 0.005."""
    from treegrpo_cli.engine.grpo import kl_to_reference

    mean, ref = torch.full((2, 4, 3, 3), 0.6), torch.full((2, 4, 3, 3), 0.5)
    std, dsigma = torch.tensor([0.2, 0.2]), torch.tensor([-0.04, -0.04], dtype=torch.float64)
    assert kl_to_reference(mean, ref, std, dsigma, "paper").tolist() == pytest.approx([0.125, 0.125], rel=1e-5)
    assert kl_to_reference(mean, ref, std, dsigma, "code").tolist() == pytest.approx([0.005, 0.005], rel=1e-5)
    assert load_config("flow-grpo").train.kl_form == "code" and load_config("branch").train.kl_form == "paper"


def test_per_transition_divides_by_edges_per_tree_as_the_reference():
    """One optimizer step over all 39 edges of a tree-grpo tree (3 + 9 + 27): with transition_norm "tree" each
    edge's loss is divided by 100 x 39, with "accum" by 100 only: the step's gradient is 39x smaller."""
    _, _, sde, batch, _ = scored_batch("tree-grpo", prompts=PROMPTS[:1])
    grad = {}
    for norm in ("tree", "accum"):
        policy = load_policy("pixel-tiny")
        tc = TrainConfig(loss_norm="per-transition", accum_edges=100, transition_norm=norm, max_grad_norm=1e9)
        m = grpo_update(
            policy,
            torch.optim.SGD(list(policy.trainable_parameters()), lr=0.0),
            sde,
            batch,
            tc,
            torch.Generator().manual_seed(0),
        )
        assert m["edges"] == 39 and m["optimizer_steps"] == 1
        grad[norm] = torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])  # left by the one step
    assert grad["accum"].abs().max() > 0
    torch.testing.assert_close(grad["tree"] * 39, grad["accum"], rtol=1e-4, atol=1e-10)


def test_timestep_fraction_trains_the_first_steps_only():
    """Flow-GRPO's released code trains int(10 * 0.99) = 9 of its 10 steps: no edge of the last step."""
    _, _, _, full, _ = scored_batch("flow-grpo", prompts=PROMPTS[:1])
    _, _, _, cut, _ = scored_batch("flow-grpo", ["pruning.timestep_fraction=0.99"], prompts=PROMPTS[:1])
    step = full.tree.depth - 1
    assert set(step[full.trained].tolist()) == set(range(10))
    assert set(step[cut.trained].tolist()) == set(range(9))
    assert torch.equal(cut.trained, full.trained & (step < 9))


def test_zero_advantage_edges_are_skipped_by_default():
    """Two prompts of two chains each: the first prompt's chains tie (advantage 0), the second's do not."""
    from treegrpo_cli.engine.advantages import AdvantageConfig
    from treegrpo_cli.engine.pruning import PruneConfig

    parent = torch.tensor([-1, -1, -1, -1, 0, 1, 2, 3])  # 4 roots (one chain each), one step
    depth = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    tree = structure(parent, depth, tree=[0, 1, 2, 3, 0, 1, 2, 3], tree_prompt=[0, 0, 1, 1])  # prompts 0, 0, 1, 1
    reward = torch.tensor([float("nan")] * 4 + [0.3, 0.3, 0.2, 0.9])
    masks = {}
    for skip in (True, False):
        adv, masks[skip] = assign_credit(
            tree,
            {"r": reward},
            weights={"r": 1.0},
            combine_mode="rewards",
            advantage=AdvantageConfig(estimator="flat"),
            pruning=PruneConfig(skip_zero_advantage=skip),
            steps=1,
            decode="final",
        )
    assert masks[False].tolist() == [False] * 4 + [True] * 4
    assert masks[True].tolist() == [False] * 6 + [True] * 2
    assert adv.edge[6] < 0 < adv.edge[7]


def test_a_batch_of_tied_rewards_trains_nothing_and_costs_no_forward():
    """Every group's rewards equal: every advantage is zero, no edge is trained, the update runs no model."""
    cfg, policy, sde, batch, _ = scored_batch("tree-grpo", prompts=PROMPTS[:1])
    tied = assign_credit(
        batch.tree,
        {"r": torch.where(batch.tree.is_leaf(), 0.5, float("nan"))},
        weights={"r": 1.0},
        combine_mode="rewards",
        advantage=cfg.advantage,
        pruning=cfg.pruning,
        steps=cfg.sampler.steps,
        decode=cfg.sampler.decode,
    )[1]
    assert batch.trained.sum() == 39 and not tied.any()
    m = grpo_update(
        policy,
        make_optimizer(list(policy.trainable_parameters()), cfg.train),
        sde,
        Batch(batch.tree, tied, batch.advantage, batch.cond),
        cfg.train,
        torch.Generator().manual_seed(0),
    )
    assert m == {"edges": 0, "train_evals": 0}
