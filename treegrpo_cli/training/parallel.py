"""Data-parallel pieces of an iteration: the policy sharded (FSDP2), every rank's tree structure and scores
gathered into the whole batch, this rank's part of the global minibatch plan, and `Processes`, the ranks an
update reaches them through."""

from __future__ import annotations

import torch

from ..config import Config
from ..engine.grpo import Batch, Parallel, loss_denominators, minibatches, parent_chunk_count
from ..engine.tree import Tree, cat_trees
from ..errors import TreegrpoError
from ..models.base import Policy
from . import dist
from .dist import Dist
from .steps import update_generator


def shard_policy(policy: Policy, device: str) -> None:
    """FSDP2 over the policy's denoiser (train.parallel = "fsdp")."""
    root = getattr(policy, "net", None) or getattr(policy, "denoiser", None)
    if not isinstance(root, torch.nn.Module):
        raise TreegrpoError(
            f"train.parallel = fsdp needs a policy with one denoiser module; {type(policy).__name__} "
            "has none: use train.parallel = replicate"
        )
    if getattr(getattr(policy, "opts", None), "finetune", "full") != "full":
        raise TreegrpoError(
            "train.parallel = fsdp shards a fully fine-tuned model (--finetune full); a LoRA run keeps "
            "the frozen model whole on every process: use train.parallel = replicate"
        )
    dist.shard_module(root, str(device).startswith("cuda") and getattr(policy, "dtype", None) == torch.bfloat16)


def whole_batch(
    tree: Tree, scores: dict[str, torch.Tensor], d: Dist
) -> tuple[Tree, dict[str, torch.Tensor], list[int]]:
    """The structure of every rank's trees (no latents) concatenated in rank order, every leaf's scores,
    and where each rank's nodes start in it (and end: the last entry). One process: the tree itself."""
    if not d.active:
        return tree, scores, [0, tree.num_nodes]
    shape = {k: v for k, v in tree.tensors().items() if k not in ("latent", "image_latent")}
    parts = dist.gather((shape, scores), d)
    skeletons = [Tree(latent=torch.zeros(len(t["parent"]), 0), image_latent=torch.zeros(0, 0), **t) for t, _ in parts]
    whole = cat_trees(skeletons)
    all_scores = {n: torch.cat([sc[n] for _, sc in parts]) for n in scores}
    sizes = torch.tensor([len(t["parent"]) for t, _ in parts])
    return whole, all_scores, [0, *torch.cumsum(sizes, 0).tolist()]


def parallel_plan(whole: Batch, cfg: Config, it: int, starts: list[int], d: Dist, sharded: bool) -> Parallel:
    """The global minibatch plan restricted to this rank's nodes, with global loss divisors; for a sharded
    model also the chunk count every rank runs per step (the most any rank needs), divisors that undo
    the averaging of FSDP's reduce-scatter (a sum is wanted), and gradient clipping over the shards."""
    plan = minibatches(whole, cfg.train, update_generator(cfg, it))

    def part(mb: torch.Tensor, r: int) -> torch.Tensor:
        return mb[(mb >= starts[r]) & (mb < starts[r + 1])]

    mine = [part(mb, d.rank) - starts[d.rank] for mb in plan]

    def gather(x: torch.Tensor) -> torch.Tensor:
        return torch.cat(dist.gather(x, d))

    if not sharded:
        return Parallel(mine, loss_denominators(whole, cfg.train, plan), lambda ps: dist.sum_gradients(ps, d), gather)
    chunks = [
        max(parent_chunk_count(whole.tree.parent, part(mb, r), cfg.rollout.max_batch) for r in range(d.world))
        for mb in plan
    ]
    denominators = [x / d.world for x in loss_denominators(whole, cfg.train, plan)]
    return Parallel(
        mine,
        denominators,
        lambda ps: None,
        gather,
        chunks,  # FSDP reduce-scatters
        dist.clip_sharded_gradients,
    )


class Processes:
    """The other processes of a data-parallel run as an update reaches them (engine/update.py Ranks)."""

    def __init__(self, cfg: Config, d: Dist, sharded: bool):
        self.cfg, self.d, self.sharded, self.rank = cfg, d, sharded, d.rank

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        dist.sum_gradients(params, self.d)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(dist.gather(x, self.d))

    def plan(self, whole: Batch, starts: list[int], it: int) -> Parallel:
        return parallel_plan(whole, self.cfg, it, starts, self.d, self.sharded)
