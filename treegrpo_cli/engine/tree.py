"""The rollout tree as a struct of arrays.

A batch of trees is never a graph of node objects: it is a handful of flat tensors indexed by node
id. Nodes are stored breadth-first, depth by depth, so the frontier at denoising step i is one
contiguous index range and goes through the model in one batched forward.

Shapes (N nodes over all trees of the batch, L leaves, B trees, latent shape (C, H, W)):
    parent      [N]  int64    parent node id, -1 for a root
    depth       [N]  int64    denoising step of the node (root 0, leaves T)
    tree        [N]  int64    which tree of the batch the node belongs to
    child       [N]  int64    index among its siblings (0 for a root and on chains)
    sigma       [N]  float32  noise level at the node
    sde         [N]  bool     the edge into the node was a stochastic (SDE) step
    log_prob    [N]  float32  behaviour log-prob of the edge into the node (nan: root or ODE edge)
    seed        [N]  int64    the node's noise seed, a hash of (seed, prompt, tree, path)
    latent      [N, C, H, W]  float32 state at the node
    image_latent[L, C, H, W]  float32 what the decoder turns into each leaf's image
    tree_prompt [B]  int64    prompt id of each tree (trees of one prompt form a GRPO group)
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor


@dataclass
class Tree:
    parent: Tensor
    depth: Tensor
    tree: Tensor
    child: Tensor
    sigma: Tensor
    sde: Tensor
    log_prob: Tensor
    seed: Tensor
    latent: Tensor
    image_latent: Tensor
    tree_prompt: Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.parent.numel())

    @property
    def num_trees(self) -> int:
        return int(self.tree_prompt.numel())

    def is_leaf(self) -> Tensor:
        """[N] bool: nodes without children."""
        return leaf_mask(self.parent)

    def leaves(self) -> Tensor:
        """[L] int64: leaf node ids in storage order (the order of image_latent)."""
        return torch.nonzero(self.is_leaf(), as_tuple=False).flatten()

    def group(self) -> Tensor:
        """[N] int64: prompt id of every node (the GRPO group it belongs to)."""
        return self.tree_prompt[self.tree]

    def tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_tensors(cls, t: dict[str, Tensor]) -> Tree:
        missing = [f.name for f in fields(cls) if f.name not in t]
        if missing:
            raise KeyError(f"tree tensors missing: {', '.join(missing)}")
        return cls(**{f.name: t[f.name] for f in fields(cls)})


def cat_trees(trees: list[Tree]) -> Tree:
    """One batch from several: node ids, parents and tree ids are offset; order is kept."""
    parts: dict[str, list[Tensor]] = {f.name: [] for f in fields(Tree)}
    nodes = n_trees = 0
    for t in trees:
        for k, v in t.tensors().items():
            if k == "parent":
                v = torch.where(v >= 0, v + nodes, v)
            elif k == "tree":
                v = v + n_trees
            parts[k].append(v)
        nodes, n_trees = nodes + t.num_nodes, n_trees + t.num_trees
    return Tree(**{k: torch.cat(v) for k, v in parts.items()})


def leaf_mask(parent: Tensor) -> Tensor:
    """[N] bool: True where no node names this one as its parent."""
    has_child = torch.zeros(parent.numel(), dtype=torch.bool)
    kids = parent[parent >= 0]
    has_child[kids] = True
    return ~has_child
