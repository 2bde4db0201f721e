import math

import pytest
import torch

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.rollout import TreeConfig, branch_noise, mix_seed, rollout
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.errors import ConfigError

PROMPTS = ["a red circle", "two blue squares", "a green triangle"]


def _roll(policy, preset, sets=(), prompts=PROMPTS, ids=None, seed=7, max_batch=64):
    cfg = load_config(preset, sets=list(sets))
    ids = list(range(len(prompts))) if ids is None else ids
    return rollout(policy, [prompts[i] for i in ids], ids, FlowSDE(cfg.sampler), cfg.tree, seed, max_batch=max_batch)


def test_dense_branch_tree_counts(tiny_policy):
    tree, nfe = _roll(tiny_policy, "branch", prompts=PROMPTS[:1])
    assert nfe == 203  # 1 + 3*2 + 3*4 + 3*8 + 10*16
    assert len(tree.leaves()) == 16
    assert tree.num_nodes == 1 + 3 * 2 + 3 * 4 + 3 * 8 + 11 * 16
    assert load_config("branch").tree.model_evals(20) == 203


def test_treegrpo_default_counts(tiny_policy):
    tree, nfe = _roll(tiny_policy, "tree-grpo", prompts=PROMPTS[:1])
    assert nfe == 202 and len(tree.leaves()) == 27  # 1 + 3 + 9 + 27*7
    # only the window steps are SDE edges; the rest are ODE with no log-prob
    sde_depths = sorted(set(tree.depth[tree.sde].tolist()))
    assert sde_depths == [1, 2, 3]
    assert torch.isnan(tree.log_prob[~tree.sde]).all() and torch.isfinite(tree.log_prob[tree.sde]).all()


def test_structure_is_breadth_first(tiny_policy):
    tree, _ = _roll(tiny_policy, "branch")
    assert torch.all(tree.depth[1:] >= tree.depth[:-1])
    nr = tree.parent >= 0
    assert torch.all(tree.depth[nr] == tree.depth[tree.parent[nr]] + 1)
    assert torch.all(tree.tree[nr] == tree.tree[tree.parent[nr]])
    assert tree.image_latent.shape[0] == len(tree.leaves())


def test_same_seed_is_bitwise_identical(tiny_policy):
    a, _ = _roll(tiny_policy, "branch")
    b, _ = _roll(tiny_policy, "branch")
    for k, v in a.tensors().items():
        assert torch.equal(v.nan_to_num(), getattr(b, k).nan_to_num()), k
    c, _ = _roll(tiny_policy, "branch", seed=8)
    assert not torch.equal(a.latent, c.latent)


@pytest.mark.slow
def test_max_batch_does_not_change_noise_or_latents(tiny_policy):
    a, na = _roll(tiny_policy, "branch", max_batch=64)
    b, nb = _roll(tiny_policy, "branch", max_batch=1)
    assert na == nb
    assert torch.equal(a.seed, b.seed)
    assert torch.allclose(a.latent, b.latent, atol=1e-5)
    assert torch.allclose(a.image_latent, b.image_latent, atol=1e-5)


def test_trees_do_not_depend_on_batch_composition(tiny_policy):
    """Prompt 2's tree is the same whether it is rolled out alone or with others."""
    full, _ = _roll(tiny_policy, "branch", ids=[0, 1, 2])
    alone, _ = _roll(tiny_policy, "branch", ids=[2])
    m = full.tree == 2
    assert torch.equal(full.seed[m], alone.seed)
    assert torch.allclose(full.latent[m], alone.latent, atol=1e-5)


@pytest.mark.slow
def test_root_noise_sharing(tiny_policy):
    shared, _ = _roll(tiny_policy, "branch", sets=["tree.init_same_noise=true"])
    own, _ = _roll(tiny_policy, "branch", sets=["tree.init_same_noise=false"])

    def roots(t):
        return t.latent[t.parent < 0]

    assert torch.equal(roots(shared)[0], roots(shared)[1])
    assert not torch.equal(roots(own)[0], roots(own)[1])


def test_flow_grpo_is_a_forest_per_prompt(tiny_policy):
    tree, nfe = _roll(tiny_policy, "flow-grpo", sets=["tree.trees_per_prompt=4"], prompts=PROMPTS[:2])
    assert tree.num_trees == 8 and len(tree.leaves()) == 8 and nfe == 8 * 10
    assert tree.tree_prompt.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_ode_steps_are_deterministic(tiny_policy):
    """BranchGRPO-Mix: ODE edges carry no noise: every ODE child is exactly the Euler step of its parent
    (whatever the seed), while SDE children are not."""
    tree, nfe = _roll(tiny_policy, "branch-mix", prompts=PROMPTS[:1])
    assert nfe == 203
    sde_steps = sorted(set((tree.depth[tree.sde] - 1).tolist()))
    assert sde_steps == [0, 1, 2, 3, 6, 9]
    sde = FlowSDE(load_config("branch-mix").sampler)
    cond = tiny_policy.encode(PROMPTS[:1])
    edges = torch.nonzero(tree.parent >= 0).flatten()
    par = tree.parent[edges]
    with torch.no_grad():
        v = tiny_policy.velocity(tree.latent[par], tree.sigma[par], {k: t[tree.tree[par]] for k, t in cond.items()})
    euler = sde.step(tree.latent[par], v, tree.depth[par], torch.zeros(len(par), dtype=torch.bool)).mean
    gap = (tree.latent[edges] - euler).flatten(1).abs().max(1).values  # [E]
    ode = ~tree.sde[edges]
    assert ode.sum() > 0 and float(gap[ode].max()) < 1e-5
    assert float(gap[~ode].min()) > 1e-3  # noise was added there


def _branch_samples(cfg, parents=400, dim=512, K=2):
    xs = [branch_noise(cfg, mix_seed(3, p), [mix_seed(3, p, c) for c in range(K)], (dim,)) for p in range(parents)]
    return torch.stack(xs)  # [P, K, D]


@pytest.mark.parametrize("s", [4.0, 1.0])
def test_correlated_branch_noise_statistics(s):
    xi = _branch_samples(TreeConfig(split_steps=(0,), branch_s=s))
    n = xi[:, 0].numel()
    assert abs(xi.mean().item()) < 4 / math.sqrt(xi.numel())
    for b in range(2):
        assert xi[:, b].var().item() == pytest.approx(1.0, abs=4 * math.sqrt(2 / n))
    corr = (xi[:, 0] * xi[:, 1]).mean().item()
    assert corr == pytest.approx(1 / (1 + s * s), abs=4 / math.sqrt(n))


def test_independent_and_scaled_branch_noise():
    ind = _branch_samples(TreeConfig(split_steps=(0,), branch_s=math.inf))
    assert abs((ind[:, 0] * ind[:, 1]).mean().item()) < 4 / math.sqrt(ind[:, 0].numel())
    scaled = _branch_samples(TreeConfig(split_steps=(0,), branch_noise="scaled", split_noise_scale=4.0))
    assert scaled.var().item() == pytest.approx(16.0, rel=0.05)  # the released code's 16x variance


def test_split_log_prob_uses_unscaled_std_in_compat_mode(tiny_policy):
    tree, _ = _roll(tiny_policy, "branch", sets=['tree.branch_noise="scaled"'], prompts=PROMPTS[:1])
    split_children = tree.log_prob[tree.depth == 1]
    chain = tree.log_prob[tree.depth == 2]
    # 16x variance under the unscaled density: far lower log-prob than ordinary SDE edges
    assert split_children.max() < chain.min() - 1.0


def test_bad_tree_configs():
    with pytest.raises(ConfigError, match="outside"):
        TreeConfig(split_steps=(25,)).validate(20, "x0")
    with pytest.raises(ConfigError, match="identical images"):
        TreeConfig(split_steps=(19,)).validate(20, "x0")
    TreeConfig(split_steps=(19,)).validate(20, "final")
    with pytest.raises(ConfigError):
        TreeConfig(split_steps=(0,), branch=1).validate(20, "x0")


def test_rollout_on_pixel_policy_has_expected_shapes(tiny_policy):
    cfg = SamplerConfig(steps=4)
    tree, nfe = rollout(tiny_policy, ["a"], [5], FlowSDE(cfg), TreeConfig(split_steps=(1,), branch=3), 0)
    assert tree.latent.shape == (1 + 1 + 3 + 3 + 3, 3, 8, 8)
    assert nfe == 1 + 1 + 3 + 3
    assert tree.tree_prompt.tolist() == [5]


def test_shared_root_noise_still_gives_distinct_trees(tiny_policy):
    """init_same_noise shares the root latent only; everything below differs per tree."""
    tree, _ = _roll(
        tiny_policy, "flow-grpo", sets=["tree.trees_per_prompt=3", "tree.init_same_noise=true"], prompts=PROMPTS[:1]
    )
    roots = tree.latent[tree.parent < 0]
    assert torch.equal(roots[0], roots[1])
    leaves = tree.image_latent
    assert not torch.equal(leaves[0], leaves[1]) and not torch.equal(leaves[1], leaves[2])
    assert len(set(tree.seed.tolist())) == tree.num_nodes


def test_repeated_prompt_gets_new_trees(tiny_policy):
    tree, _ = _roll(tiny_policy, "branch", ids=[0, 0], sets=["tree.init_same_noise=false"])
    a, b = tree.latent[tree.tree == 0], tree.latent[tree.tree == 1]
    assert not torch.equal(a, b)
    assert tree.tree_prompt.tolist() == [0, 0]
