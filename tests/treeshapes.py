"""Tree shapes built by hand for the estimator and pruning tests."""

import torch


def dense_tree(steps=20, k=2, splits=(0, 3, 6, 9)):
    """(parent, depth) of one breadth-first tree: k children at each split step, else one."""
    parent, depth, frontier = [-1], [0], [0]
    for d in range(steps):
        nxt = []
        for node in frontier:
            for _ in range(k if d in splits else 1):
                nxt.append(len(parent))
                parent.append(node)
                depth.append(d + 1)
        frontier = nxt
    return torch.tensor(parent), torch.tensor(depth)
