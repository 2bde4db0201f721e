"""Advantage estimators: the worked example of methods.md section 9, dense BranchGRPO trees,
multi-reward combination, clamping and config errors."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch
from treeshapes import dense_tree

from treegrpo_cli.engine.advantages import ESTIMATORS, AdvantageConfig, Advantages, combine, estimate
from treegrpo_cli.errors import ConfigError

NAN = math.nan
TOL = 1e-3

# --- the section 9 example: R=0, A=1, B=2, a1=3, a2=4, b1=5, b2=6 -------------------------------
R, A, B, A1, A2, B1, B2 = range(7)
EX_PARENT = torch.tensor([-1, 0, 0, 1, 1, 2, 2])
EX_DEPTH = torch.tensor([0, 1, 1, 2, 2, 2, 2])
EX_TREE = torch.zeros(7, dtype=torch.long)
EX_GROUP = torch.zeros(7, dtype=torch.long)
EX_REWARD = torch.tensor([NAN, NAN, NAN, 1.0, 2.0, 3.0, 4.0])
EX_LOGP = torch.tensor([NAN, -1.0, -1.2, -0.9, -1.1, -1.0, -1.0])


def example(cfg: AdvantageConfig, reward: torch.Tensor = EX_REWARD) -> Advantages:
    nodes = Nodes(EX_PARENT, EX_DEPTH, EX_TREE, EX_GROUP, reward, EX_LOGP)
    return estimate(cfg, **nodes._asdict())


def close(actual, expected, tol=TOL):
    assert torch.allclose(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), (
        f"{actual.tolist()} != {expected}"
    )


def one_hot_reward(leaf: int) -> torch.Tensor:
    r = torch.tensor([NAN, NAN, NAN, 0.0, 0.0, 0.0, 0.0])
    r[leaf] = 1.0
    return r


# --- dense BranchGRPO trees ---------------------------------------------------------------------


class Nodes(NamedTuple):
    """A batch's [N] tensors under estimate's keywords."""

    parent: torch.Tensor
    depth: torch.Tensor
    tree: torch.Tensor
    group: torch.Tensor
    reward: torch.Tensor
    log_prob: torch.Tensor


def batch(trees, groups, rewards, seed=0) -> Nodes:
    """Concatenate (parent, depth) trees; rewards[i] is the [leaves] reward of tree i."""
    gen = torch.Generator().manual_seed(seed)
    ps, ds, ts, gs, rs, off = [], [], [], [], [], 0
    for i, ((p, d), g, r) in enumerate(zip(trees, groups, rewards, strict=True)):
        ps.append(torch.where(p >= 0, p + off, p))
        ds.append(d)
        ts.append(torch.full_like(p, i))
        gs.append(torch.full_like(p, g))
        rw = torch.full((p.numel(),), NAN, dtype=torch.float64)
        leaf = ~torch.isin(torch.arange(p.numel()), p)
        rw[leaf] = r.double()
        rs.append(rw)
        off += p.numel()
    parent = torch.cat(ps)
    logp = -1.0 + 0.05 * torch.randn(parent.numel(), generator=gen, dtype=torch.float64)
    logp[parent < 0] = NAN
    return Nodes(parent, torch.cat(ds), torch.cat(ts), torch.cat(gs), torch.cat(rs), logp)


def zscore(x, ddof=1):
    return (x - x.mean()) / (x.std(correction=ddof) + 1e-8)


def test_dense_tree_shape():
    p, d = dense_tree()
    assert p.numel() == 1 + 3 * 2 + 3 * 4 + 3 * 8 + 11 * 16
    assert int((~torch.isin(torch.arange(p.numel()), p)).sum()) == 16
    assert bool((p[1:] < torch.arange(1, p.numel())).all())


# --- section 9 golden values --------------------------------------------------------------------


def test_flat_dancegrpo_group_ddof1():
    a = example(AdvantageConfig("flat", ddof=1, clamp=None))
    close(a.leaf[[A1, A2, B1, B2]], [-1.162, -0.387, 0.387, 1.162])
    close(a.edge[[A1, A2, B1, B2]], [-1.162, -0.387, 0.387, 1.162])
    close(a.edge[[A, B]], [(-1.162 - 0.387) / 2, (0.387 + 1.162) / 2])  # shared edge: mean of paths
    assert a.valid.tolist() == [False] + [True] * 6 and float(a.edge[R]) == 0.0


def test_flat_flowgrpo_population_std():
    for flat_std in ("global", "group"):  # one group: the batch std is the group std
        a = example(AdvantageConfig("flat", ddof=0, flat_std=flat_std))
        close(a.leaf[[A1, A2, B1, B2]], [-1.342, -0.447, 0.447, 1.342])
        close(a.edge[[A1, A2, B1, B2]], [-1.342, -0.447, 0.447, 1.342])
        close(a.edge[[A, B]], [(-1.342 - 0.447) / 2, (0.447 + 1.342) / 2])


def test_flat_shared_edge_sum():
    a = example(AdvantageConfig("flat", shared_edge="sum"))
    close(a.edge[[A, B, A1]], [-1.162 - 0.387, 0.387 + 1.162, -1.162])


def test_branch_uniform_ddof1():
    a = example(AdvantageConfig("branch", ddof=1))
    close(a.fused[[A, B]], [1.5, 3.5])
    close(a.edge[[A, B, A1, A2, B1, B2]], [-0.707, 0.707, -1.162, -0.387, 0.387, 1.162])
    close(a.leaf[[A1, A2, B1, B2]], [-1.162, -0.387, 0.387, 1.162])
    assert not a.valid[R] and bool(a.valid[1:].all()) and float(a.edge[R]) == 0.0


def test_branch_uniform_population():
    a = example(AdvantageConfig("branch", ddof=0))
    close(a.edge[[A, B, A1, A2, B1, B2]], [-1.0, 1.0, -1.342, -0.447, 0.447, 1.342])


def test_branch_recursive_weights_and_fusion():
    cfg = AdvantageConfig("branch", beta=1.0, weighting="recursive")
    close(example(cfg, one_hot_reward(A1)).fused[[A]], [0.550])
    close(example(cfg, one_hot_reward(A2)).fused[[A]], [0.450])
    a = example(cfg)
    close(a.fused[[A, B, R]], [1.450, 3.500, 2.373])
    close(a.edge[[A, B, A1, A2, B1, B2]], [-0.707, 0.707, -1.162, -0.387, 0.387, 1.162])  # leaves unchanged


def test_branch_leaf_softmax_weights_and_fusion():
    cfg = AdvantageConfig("branch", beta=1.0, weighting="leaf-softmax")
    weights = [float(example(cfg, one_hot_reward(leaf)).fused[R]) for leaf in (A1, A2, B1, B2)]
    close(torch.tensor(weights), [0.303, 0.248, 0.224, 0.224])
    a = example(cfg)
    assert abs(float(a.fused[R]) - 2.370) < TOL
    assert abs(float(example(AdvantageConfig("branch", beta=1.0, weighting="recursive")).fused[R]) - 2.373) < TOL
    close(a.fused[[A, B]], [1.450, 3.500])  # below A the leaf softmax is the one-level softmax
    close(a.edge[[A, B]], [-0.707, 0.707])
    assert not a.valid[R] and float(a.edge[R]) == 0.0  # the root has no incoming edge: unused


def test_treegrpo_code_uniform_backup():
    a = example(AdvantageConfig("treegrpo", ddof=0, backup="mean"))
    close(a.edge[[A, B, A1, A2, B1, B2]], [-0.894, 0.894, -1.342, -0.447, 0.447, 1.342])
    close(a.leaf[[A1, A2, B1, B2]], [-1.342, -0.447, 0.447, 1.342])


def test_treegrpo_paper_logprob_backup():
    a = example(AdvantageConfig("treegrpo", ddof=0, backup="logprob", temperature=1.0))
    close(a.edge[[A, B, A1, A2, B1, B2]], [-0.939, 0.894, -1.342, -0.447, 0.447, 1.342])


def test_treegrpo_temperature_flattens_weights():
    a = example(AdvantageConfig("treegrpo", ddof=0, temperature=1e6))
    close(a.edge[[A]], [-0.894])


def test_treepo_average():
    a = example(AdvantageConfig("treepo", ddof=0, treepo_weight="average"))
    close(a.leaf[[A1, A2, B1, B2]], [-1.414, 0.0, 0.0, 1.414])
    close(a.edge[[A1, A2, B1, B2]], [-1.414, 0.0, 0.0, 1.414])
    close(a.edge[[A, B]], [-0.707, 0.707])


def test_treepo_group_size():
    a = example(AdvantageConfig("treepo", ddof=0, treepo_weight="group_size"))
    close(a.leaf[[A1, A2, B1, B2]], [-1.4, -0.2, 0.2, 1.4])
    close(a.edge[[A1, A2, B1, B2]], [-1.4, -0.2, 0.2, 1.4])
    close(a.edge[[A, B]], [-0.8, 0.8])


def test_treepo_subgroups_across_trees():
    # two copies of the example tree in one prompt group: sub-groups are the 8-leaf prompt group,
    # each tree's 4 leaves (its root splits) and each 2-leaf subtree.
    t = (EX_PARENT, EX_DEPTH)
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    nodes = batch([t, t], [0, 0], [r, r + 4])
    a = estimate(AdvantageConfig("treepo", ddof=0, clamp=None), **nodes._asdict())
    rr = torch.cat([r, r + 4]).double()
    d0 = rr - rr.mean()
    d1 = rr - torch.tensor([2.5] * 4 + [6.5] * 4, dtype=torch.float64)
    d2 = torch.tensor([-0.5, 0.5] * 4, dtype=torch.float64)
    raw = (d0 + d1 + d2) / 3
    leaves = torch.nonzero(~torch.isnan(a.leaf)).flatten()
    close(a.leaf[leaves], zscore(raw, 0).tolist())


def test_fused_is_uniform_leaf_mean_for_path_estimators():
    for est in ("flat", "treegrpo", "treepo"):
        close(example(AdvantageConfig(est)).fused, [2.5, 1.5, 3.5, 1.0, 2.0, 3.0, 4.0])


# --- dense trees ----------------------------------------------------------------------------------


def test_branch_dense_tree():
    gen = torch.Generator().manual_seed(1)
    r = torch.rand(16, generator=gen, dtype=torch.float64)
    nodes = batch([dense_tree()], [0], [r])
    parent, depth = nodes.parent, nodes.depth
    a = estimate(AdvantageConfig("branch", clamp=None), **nodes._asdict())
    assert a.valid.tolist() == [False] + [True] * (parent.numel() - 1)  # only the root is alone
    assert float(a.edge[0]) == 0.0
    leaves = torch.nonzero(~torch.isnan(a.leaf)).flatten()
    z = zscore(r)  # leaf order == storage order == reward order
    for d in range(10, 21):
        ids = torch.nonzero(depth == d).flatten()
        assert ids.numel() == 16
        close(a.edge[ids], z.tolist(), tol=1e-5)  # uniform fusion: a chain carries its leaf reward
    close(a.leaf[leaves], z.tolist(), tol=1e-5)
    for d in (1, 2, 3):  # two nodes: +-1/sqrt(2) whatever the gap
        close(a.edge[depth == d].abs(), [1 / math.sqrt(2)] * 2)


def test_branch_per_tree_vs_treegrpo_per_group():
    gen = torch.Generator().manual_seed(2)
    r = torch.rand(16, generator=gen, dtype=torch.float64)
    nodes = batch([dense_tree()] * 2, [7, 7], [r, 10 * r + 5])
    deep, tree = nodes.depth >= 10, nodes.tree
    br = estimate(AdvantageConfig("branch", clamp=None), **nodes._asdict())
    e0, e1 = br.edge[deep & (tree == 0)], br.edge[deep & (tree == 1)]
    close(e1, e0.tolist(), tol=1e-5)  # scale removed independently in each tree
    close(e0[-16:], zscore(r).tolist(), tol=1e-5)
    tg = estimate(AdvantageConfig("treegrpo", clamp=None), **nodes._asdict())
    leaves = torch.nonzero(~torch.isnan(tg.leaf)).flatten()
    close(tg.leaf[leaves], zscore(torch.cat([r, 10 * r + 5])).tolist(), tol=1e-5)  # jointly
    assert not torch.allclose(tg.leaf[leaves[:16]], tg.leaf[leaves[16:]], atol=0.1)


def test_flat_global_std_keeps_group_means():
    r0, r1 = torch.tensor([0.0, 1.0]), torch.tensor([10.0, 14.0])
    chain2 = (torch.tensor([-1, 0, 0, 1, 2]), torch.tensor([0, 1, 1, 2, 2]))
    nodes = batch([chain2] * 2, [0, 1], [r0, r1])
    a = estimate(AdvantageConfig("flat", flat_std="global", ddof=1, clamp=None), **nodes._asdict())
    s = torch.tensor([0.0, 1.0, 10.0, 14.0]).std()
    leaves = torch.nonzero(~torch.isnan(a.leaf)).flatten()
    close(a.leaf[leaves], [(-0.5 / s).item(), (0.5 / s).item(), (-2 / s).item(), (2 / s).item()])


def test_every_estimator_runs_on_64_dense_trees():
    """A batch of the size training sees: finite float32 edge advantages (speed: bench/scoring.py)."""
    gen = torch.Generator().manual_seed(3)
    rewards = [torch.rand(16, generator=gen, dtype=torch.float64) for _ in range(64)]
    args = batch([dense_tree()] * 64, [i // 2 for i in range(64)], rewards)
    cfgs = [
        AdvantageConfig("flat"),
        AdvantageConfig("branch"),
        AdvantageConfig("branch", beta=1.0),
        AdvantageConfig("branch", beta=1.0, weighting="recursive"),
        AdvantageConfig("treegrpo"),
        AdvantageConfig("treepo", treepo_weight="group_size"),
    ]
    for cfg in cfgs:
        a = estimate(cfg, **args._asdict())
        assert a.edge.dtype == torch.float32 and bool(torch.isfinite(a.edge).all())


# --- combine, clamp, config ----------------------------------------------------------------------


def test_combine_rewards_mode_is_estimate_on_weighted_sum():
    cfg = AdvantageConfig("branch", clamp=None)
    r2 = torch.tensor([NAN, NAN, NAN, 4.0, 1.0, 1.0, 0.0])
    got = combine(
        cfg,
        parent=EX_PARENT,
        depth=EX_DEPTH,
        tree=EX_TREE,
        group=EX_GROUP,
        rewards={"hps": EX_REWARD, "clip": r2},
        weights={"hps": 0.8, "clip": 0.2},
        log_prob=EX_LOGP,
        mode="rewards",
    )
    want = example(cfg, 0.8 * EX_REWARD + 0.2 * r2)
    close(got.edge, want.edge.tolist(), tol=1e-6)
    close(got.fused, want.fused.tolist(), tol=1e-6)


def test_combine_advantages_mode_is_weighted_sum_of_advantages():
    cfg = AdvantageConfig("treegrpo", ddof=0)
    r2 = torch.tensor([NAN, NAN, NAN, 4.0, 1.0, 1.0, 0.0])
    got = combine(
        cfg,
        parent=EX_PARENT,
        depth=EX_DEPTH,
        tree=EX_TREE,
        group=EX_GROUP,
        rewards={"hps": EX_REWARD, "clip": r2},
        weights={"hps": 0.8, "clip": 0.2},
        log_prob=EX_LOGP,
        mode="advantages",
    )
    a1, a2 = example(cfg), example(cfg, r2)
    close(got.edge, (0.8 * a1.edge + 0.2 * a2.edge).tolist(), tol=1e-6)
    close(got.fused, (0.8 * a1.fused + 0.2 * a2.fused).tolist(), tol=1e-6)
    leaves = [A1, A2, B1, B2]
    close(got.leaf[leaves], (0.8 * a1.leaf + 0.2 * a2.leaf)[leaves].tolist(), tol=1e-6)
    assert got.valid.tolist() == a1.valid.tolist()
    # the clamp applies after summing: each part (|A| <= 1.342) fits, the sum does not
    big = combine(
        AdvantageConfig("treegrpo", ddof=0, clamp=2.0),
        parent=EX_PARENT,
        depth=EX_DEPTH,
        tree=EX_TREE,
        group=EX_GROUP,
        rewards={"a": EX_REWARD, "b": EX_REWARD},
        weights={"a": 1.0, "b": 1.0},
        log_prob=EX_LOGP,
        mode="advantages",
    )
    close(big.edge[[A1, A2, B2]], [-2.0, -0.894, 2.0])


def test_combine_errors():
    tree = {"parent": EX_PARENT, "depth": EX_DEPTH, "tree": EX_TREE, "group": EX_GROUP, "log_prob": EX_LOGP}
    with pytest.raises(ConfigError, match="rewards, advantages"):
        combine(AdvantageConfig(), **tree, rewards={"a": EX_REWARD}, weights={"a": 1.0}, mode="mix")
    with pytest.raises(ConfigError):
        combine(AdvantageConfig(), **tree, rewards={"a": EX_REWARD}, weights={"b": 1.0}, mode="rewards")
    with pytest.raises(ConfigError):
        combine(AdvantageConfig(), **tree, rewards={}, weights={}, mode="rewards")


def test_clamp():
    r = torch.tensor([NAN, NAN, NAN, 0.0, 0.0, 0.0, 100.0])
    off = example(AdvantageConfig("flat", ddof=0, clamp=None), r)
    on = example(AdvantageConfig("flat", ddof=0, clamp=1.0), r)
    assert float(off.edge[B2]) > 1.5
    assert float(on.edge.abs().max()) <= 1.0 + 1e-7 and float(on.edge[B2]) == pytest.approx(1.0)
    assert float(on.leaf[B2]) == pytest.approx(float(off.leaf[B2]))  # leaf values are pre-clamp


@pytest.mark.parametrize(
    "field,value,choices",
    [
        ("estimator", "ppo", ", ".join(ESTIMATORS)),
        ("weighting", "paper", "leaf-softmax, recursive"),
        ("backup", "max", "logprob, mean"),
        ("flat_std", "batch", "group, global"),
        ("ddof", 2, "0, 1"),
    ],
)
def test_config_error_names_value_and_choices(field, value, choices):
    cfg = AdvantageConfig(**{field: value})
    with pytest.raises(ConfigError, match=choices) as err:
        cfg.validate()
    assert repr(value) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        example(cfg)


@pytest.mark.parametrize("kw", [{"temperature": 0.0}, {"clamp": 0.0}, {"beta": -1.0}, {"eps": -1.0}])
def test_config_error_numeric(kw):
    with pytest.raises(ConfigError):
        AdvantageConfig(**kw).validate()
