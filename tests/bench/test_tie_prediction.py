"""bench/tie_prediction.py's counts on a hand-made tree: a stop is right when the two subtrees' leaves share one
reward; the base rate pairs each node with its frontier's first; a one-cluster frontier against its group tying."""

import torch
from benchmods import load
from treeshapes import structure


def _tree():
    # root 0 -> 1, 2 at step 1 (the split the heuristic reads); 1 -> 3, 4 and 2 -> 5, 6 (the leaves)
    return structure([-1, 0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2, 2, 2], [0] * 7, [0])


def test_leaf_reward_ranges_and_a_wrong_then_a_right_stop():
    tp = load("tie_prediction")
    tree = _tree()
    lo, hi = tp.outcome_ranges(tree, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    assert lo.tolist() == [0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0] and hi.tolist() == [1.0] * 6 + [0.0]
    calls, same = [(torch.zeros(2, 1), 1)], lambda x0, t: torch.tensor([0.5, 0.5])  # noqa: E731
    out: dict = {}
    tp.count(tree, calls, lo, hi, {0: False}, same, 0.0, out)  # node 2 stops behind node 1: its leaves differ
    assert out[1] == {"nodes": 2, "trees": 1, "stops": 1, "right": 0, "pairs": 1, "base": 0, "one": 1, "one_tied": 0}
    lo, hi = tp.outcome_ranges(tree, torch.ones(4))
    tp.count(tree, calls, lo, hi, {0: True}, same, 0.0, out)  # every leaf 1: the stop and the cluster are right
    assert out[1] == {"nodes": 4, "trees": 2, "stops": 2, "right": 1, "pairs": 2, "base": 1, "one": 2, "one_tied": 1}
    far = lambda x0, t: torch.tensor([0.0, 1.0])  # noqa: E731
    tp.count(tree, calls, lo, hi, {0: True}, far, 0.5, out)  # apart: no stop, two clusters; the pair still ties
    assert out[1] == {"nodes": 6, "trees": 3, "stops": 2, "right": 1, "pairs": 3, "base": 2, "one": 2, "one_tied": 1}
    assert tp.rates(out[1])["right_when_stopped"] == 0.5 and tp.rates(out[1])["base_rate"] == 2 / 3
