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


def structure(parent, depth, tree, tree_prompt, sde=None, log_prob=None):
    """A Tree of a hand-made shape: its structure (parent, depth, tree, the trees' prompts, which edges are SDE:
    by default every edge, and their log-probs: by default 0), with zeros for the latents it does not need."""
    from treegrpo_cli.engine.tree import Tree, leaf_mask

    parent, depth = torch.as_tensor(parent), torch.as_tensor(depth)
    n, zeros = parent.numel(), torch.zeros(parent.numel())
    return Tree(
        parent=parent,
        depth=depth,
        tree=torch.as_tensor(tree),
        child=torch.zeros(n, dtype=torch.long),
        sigma=zeros,
        sde=depth > 0 if sde is None else torch.as_tensor(sde),
        log_prob=zeros if log_prob is None else torch.as_tensor(log_prob),
        seed=torch.zeros(n, dtype=torch.long),
        latent=zeros.view(n, 1),
        image_latent=torch.zeros(int(leaf_mask(parent).sum()), 1),
        tree_prompt=torch.as_tensor(tree_prompt),
    )
