"""DiffusionNFT in the training loop (train.objective = "nft"): the leaves of this process's trees as NFT
samples, split into the iteration's optimizer steps the same way whatever the number of processes."""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import Config
from ..engine.grpo import canonical_key
from ..engine.nft import NFTBatch, optimality
from ..engine.protocols import Conditions
from .steps import Credited, update_generator


def nft_batch(cfg: Config, it: int, c: Credited, rank: int, cond: Conditions) -> NFTBatch:
    """This rank's leaves (rows of c.tree.image_latent) with their r (from c.leaf: every leaf's advantage, NaN
    elsewhere) and seeds, and the global step plan (cond: this rank's trees' conditions).

    The whole batch's leaves, ordered by their
    canonical key (tree, position in it: the same in one process or several), are drawn at random into
    nft.steps parts of equal size; each part is one optimizer step."""
    tree, whole, starts = c.tree, c.whole, c.starts
    leaves = whole.leaves()  # [L_all] global node ids, ascending
    keys = canonical_key(whole)[leaves]
    order = torch.argsort(keys)
    perm = torch.randperm(len(order), generator=update_generator(cfg, it))
    parts = [keys[order[p]] for p in torch.tensor_split(perm, cfg.nft.steps)]
    own = (leaves >= starts[rank]) & (leaves < starts[rank + 1])
    own_keys = keys[own]  # in the order of tree.leaves(): local ids ascending
    local_leaves = tree.leaves()
    dev = tree.image_latent.device
    return NFTBatch(
        x0=tree.image_latent.float(),
        cond={k: v[tree.tree[local_leaves].to(v.device)] for k, v in cond.items()},
        r=optimality(c.leaf[leaves[own]], cfg.nft).to(dev),
        keys=mix_keys(own_keys, it),
        groups=[torch.nonzero(torch.isin(own_keys, p)).flatten() for p in parts],
        denominators=[float(len(p)) for p in parts],
    )


def mix_keys(keys: Tensor, it: int) -> Tensor:
    """A sample's noise seed: its canonical key and the iteration (every iteration draws anew)."""
    return keys * 1_000_003 + it
