"""Edge masks for the backward pass: base mask, width pruning, the depth window, activity."""

from __future__ import annotations

import math

import pytest
import torch
from treeshapes import dense_tree

from treegrpo_cli.engine.pruning import PruneConfig, base_mask, depth_window, prune, width_mask
from treegrpo_cli.errors import ConfigError


def batch(n_trees, seed=0, **kw):
    """n dense trees concatenated, with random per-node values and per-leaf advantages."""
    ps, ds, ts, off = [], [], [], 0
    for i in range(n_trees):
        p, d = dense_tree(**kw)
        ps.append(torch.where(p >= 0, p + off, p))
        ds.append(d)
        ts.append(torch.full_like(p, i))
        off += p.numel()
    parent, depth, tree = torch.cat(ps), torch.cat(ds), torch.cat(ts)
    gen = torch.Generator().manual_seed(seed)
    value = torch.randn(parent.numel(), generator=gen)
    leaf = leaves_of(parent)
    leaf_adv = torch.full((parent.numel(),), math.nan)
    leaf_adv[leaf] = torch.randn(int(leaf.sum()), generator=gen)
    return parent, depth, tree, value, leaf_adv


def leaves_of(parent):
    return ~torch.isin(torch.arange(parent.numel()), parent)


def leaf_of_chain(parent, node):
    """The leaf below a node on a post-split chain."""
    kids = torch.nonzero(parent == node).flatten()
    while kids.numel():
        node = int(kids[0])
        kids = torch.nonzero(parent == node).flatten()
    return node


def test_base_mask_sde_and_x0_last_edge():
    parent = torch.tensor([-1, 0, 1, 2, 2])
    depth = torch.tensor([0, 1, 2, 3, 3])
    sde = torch.tensor([False, True, False, True, True])  # the edge into node 2 is an ODE step
    assert base_mask(parent, sde=sde, depth=depth, steps=3, decode="x0").tolist() == [False, True, False, False, False]
    assert base_mask(parent, sde=sde, depth=depth, steps=3, decode="final").tolist() == [False, True, False, True, True]
    with pytest.raises(ConfigError, match="x0, final"):
        base_mask(parent, sde=sde, depth=depth, steps=3, decode="latent")


def test_width_none_keeps_everything():
    parent, depth, tree, value, leaf_adv = batch(1)
    assert bool(width_mask(PruneConfig(), parent, depth, tree, value, leaf_adv).all())


def test_parent_top1_keeps_the_better_child_of_each_last_split_parent():
    parent, depth, tree, value, leaf_adv = batch(1)
    keep = width_mask(PruneConfig(width="parent-top1"), parent, depth, tree, value, leaf_adv)
    assert bool(keep[depth <= 9].all())  # above the last split: untouched
    heads = torch.nonzero(depth == 10).flatten()  # the 16 last-split children
    assert int(keep[heads].sum()) == 8
    assert int((keep & leaves_of(parent)).sum()) == 8
    for p in torch.unique(parent[heads]):
        a, b = torch.nonzero(parent == p).flatten().tolist()
        best = a if value[a] >= value[b] else b
        assert keep[best] and not keep[a + b - best]
    for h in heads.tolist():  # whole chains kept or dropped
        chain = [h]
        while (parent == chain[-1]).any():
            chain.append(int(torch.nonzero(parent == chain[-1])[0]))
        assert len(chain) == 11 and len({bool(keep[n]) for n in chain}) == 1


def test_parent_top1_tie_goes_to_lowest_id():
    parent, depth, tree, _, leaf_adv = batch(1)
    keep = width_mask(PruneConfig(width="parent-top1"), parent, depth, tree, torch.zeros(parent.numel()), leaf_adv)
    heads = torch.nonzero(depth == 10).flatten()
    for p in torch.unique(parent[heads]):
        a, b = torch.nonzero(parent == p).flatten().tolist()
        assert keep[min(a, b)] and not keep[max(a, b)]


@pytest.mark.parametrize("n_trees,frac,b", [(1, 0.25, 4), (2, 0.25, 8), (1, 0.01, 1), (2, 0.1, 3)])
def test_extreme_keeps_best_and_worst_leaves_of_the_batch(n_trees, frac, b):
    parent, depth, tree, value, leaf_adv = batch(n_trees, seed=n_trees)
    keep = width_mask(PruneConfig(width="extreme", extreme_frac=frac), parent, depth, tree, value, leaf_adv)
    assert bool(keep[depth <= 9].all())
    heads = torch.nonzero(depth == 10).flatten()
    assert int(keep[heads].sum()) == 2 * b  # 2b chains below the last split
    leaves = torch.nonzero(leaves_of(parent)).flatten()
    order = leaves[torch.argsort(leaf_adv[leaves])]
    want = set(order[:b].tolist()) | set(order[-b:].tolist())
    assert set(torch.nonzero(keep & leaves_of(parent)).flatten().tolist()) == want
    for h in heads.tolist():
        assert bool(keep[h]) == (leaf_of_chain(parent, h) in want)


def test_tree_without_split_is_untouched():
    parent = torch.tensor([-1, 0, 1, 2])
    depth = torch.tensor([0, 1, 2, 3])
    tree = torch.zeros(4, dtype=torch.long)
    leaf_adv = torch.tensor([math.nan, math.nan, math.nan, 0.3])
    for width in ("parent-top1", "extreme"):
        assert bool(width_mask(PruneConfig(width=width), parent, depth, tree, torch.zeros(4), leaf_adv).all())


def test_depth_window_slides_toward_shallower_depths_and_stops():
    cfg = PruneConfig(depth_window=4, depth_start=15, depth_every=30, depth_direction=-1, depth_stop=9)
    assert depth_window(cfg, 0) == [15, 16, 17, 18]
    assert depth_window(cfg, 29) == [15, 16, 17, 18]
    assert depth_window(cfg, 30) == [14, 15, 16, 17]
    assert depth_window(cfg, 179) == [10, 11, 12, 13]
    assert depth_window(cfg, 180) == [9, 10, 11, 12]
    assert depth_window(cfg, 10_000) == [9, 10, 11, 12]


def test_depth_window_slides_toward_deeper_depths_and_stops():
    cfg = PruneConfig(depth_window=3, depth_start=5, depth_every=10, depth_direction=1, depth_stop=12)
    assert depth_window(cfg, 0) == [5, 6, 7]
    assert depth_window(cfg, 10) == [6, 7, 8]
    assert depth_window(cfg, 50) == [10, 11, 12]
    assert depth_window(cfg, 10_000) == [10, 11, 12]


def test_depth_window_off():
    assert depth_window(PruneConfig(), 100) == []


def test_prune_combines_base_width_depth_and_stops_after_active_until():
    parent, depth, tree, value, leaf_adv = batch(1)
    sde = torch.ones(parent.numel(), dtype=torch.bool)
    base = base_mask(parent, sde=sde, depth=depth, steps=20, decode="x0")
    cfg = PruneConfig(width="parent-top1", depth_window=4, depth_start=15, active_until=0.5)
    width = width_mask(cfg, parent, depth, tree, value, leaf_adv)
    on = prune(
        cfg,
        base,
        parent=parent,
        depth=depth,
        tree=tree,
        value=value,
        leaf_adv=leaf_adv,
        iteration=50,
        max_iterations=100,
    )
    in_window = (depth >= 14) & (depth <= 17)  # iteration 50: moved by one depth
    assert on.tolist() == (base & width & ~in_window).tolist()
    assert not bool(on[in_window].any()) and not bool(on[depth == 20].any())
    off = prune(
        cfg,
        base,
        parent=parent,
        depth=depth,
        tree=tree,
        value=value,
        leaf_adv=leaf_adv,
        iteration=51,
        max_iterations=100,
    )
    assert off.tolist() == base.tolist()


@pytest.mark.parametrize(
    "kw",
    [
        {"width": "top1"},
        {"depth_direction": 0},
        {"extreme_frac": 0.0},
        {"depth_every": 0},
        {"depth_window": -1},
        {"active_until": -0.1},
    ],
)
def test_config_errors(kw):
    with pytest.raises(ConfigError) as err:
        PruneConfig(**kw).validate()
    assert "\n" not in str(err.value)
