"""Trees, rewards and advantages on disk (see docs/format.md).

    trees-NNNNN       the Tree tensors + leaf_image [L, 3, H, W] uint8; meta: prompts, tree_offset, nfe
    rewards-NNNNN     reward/<name> [N] float32 (NaN on internal nodes), reward [N] (weighted sum)
    advantages-NNNNN  advantage [N], valid [N], trained [N], fused [N], leaf_advantage [N]

Scoring writes its own shards beside the trees, so it never rewrites latents.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..engine.tree import Tree
from ..errors import CorruptFileError
from .shards import ShardStore

KIND = "trees"


def shard_name(role: str, i: int) -> str:
    return f"{role}-{i:05d}"


def to_uint8(images: Tensor) -> Tensor:
    """[B, 3, H, W] float in [0, 1] -> uint8."""
    return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()


@dataclass
class TreeShard:
    index: int  # shard number
    tree: Tree
    leaf_image: Tensor  # [L, 3, H, W] uint8
    prompts: dict[int, str]  # prompt id -> text
    tree_offset: int  # global id of this shard's tree 0
    nfe: int  # model evaluations spent on this shard

    def leaf_prompts(self) -> list[str]:
        leaves = self.tree.leaves()
        return [self.prompts[int(p)] for p in self.tree.tree_prompt[self.tree.tree[leaves]]]


def write_tree_shard(store: ShardStore, s: TreeShard) -> None:
    tensors = dict(s.tree.tensors(), leaf_image=s.leaf_image)
    meta = {"prompts": {str(k): v for k, v in s.prompts.items()}, "tree_offset": s.tree_offset, "nfe": s.nfe}
    store.write(shard_name("trees", s.index), "trees", tensors, meta)


def read_tree_shard(store: ShardStore, name: str) -> TreeShard:
    tensors, meta = store.read(name)
    try:
        tree = Tree.from_tensors(tensors)
        prompts = {int(k): v for k, v in meta["prompts"].items()}
        return TreeShard(
            int(name.rsplit("-", 1)[1]),
            tree,
            tensors["leaf_image"],
            prompts,
            int(meta["tree_offset"]),
            int(meta["nfe"]),
        )
    except (KeyError, ValueError) as e:
        raise CorruptFileError(f"{store.root / name}.safetensors: not a tree shard ({e})") from None


def read_extra(store: ShardStore, role: str, index: int) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """The rewards or advantages shard that belongs to tree shard `index`, if written."""
    name = shard_name(role, index)
    return store.read(name) if name in store.index["shards"] else None


def open_trees(root: Path) -> ShardStore:
    return ShardStore.open(root, kind=KIND)
