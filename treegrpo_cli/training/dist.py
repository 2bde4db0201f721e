"""Data parallelism over torch.distributed: join the process group from the environment, shard the
prompts of an iteration, gather what must be global, sum gradients.

Launch with torchrun (`torchrun --nproc-per-node N -m treegrpo_cli train ...`, `srun ... torchrun
--nnodes ...`), `accelerate launch`, or `treegrpo train --nproc-per-node N` (cli/launch.py): every
launcher sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. nccl on CUDA, gloo on the CPU.

Every rank rolls out a contiguous slice of the iteration's prompts (whole trees: a tree's noise
depends on (seed, prompt id, tree, path), never on the rank). The cheap parts that must see the
whole batch (rewards and the tree structure for the advantages, the minibatch plan, the metrics)
are all-gathered, so every rank computes the same advantages as one process would; gradients are
summed over ranks before every optimizer step (the loss is divided by the global edge count), so
the weights stay identical on every rank without DDP's per-backward hooks, and ranks with different
numbers of chunks never wait on each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist

from ..errors import ConfigError

TIMEOUT_S = float(os.environ.get("TREEGRPO_DIST_TIMEOUT", "300"))


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


SINGLE = Dist()


def from_env(timeout_s: float = TIMEOUT_S) -> Dist:
    """Join the process group the launcher describes (or none: one process)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    if not tdist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        tdist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return Dist(tdist.get_rank(), tdist.get_world_size())


def shutdown() -> None:
    """Destroy the group, without waiting: after a successful run the caller barriers first (a rank that
    tears gloo down while a peer is still in its last collective can abort the peer); after an error a
    barrier would hang (the peers are in another collective)."""
    if tdist.is_initialized():
        tdist.destroy_process_group()


def scaled_prompts(n: int, world: int) -> int:
    """rollout.num_prompts for `world` processes: n when they divide it, else the next multiple of world (so a
    command written for one GPU runs as it is on eight: at least one prompt a process)."""
    return -(-n // world) * world


def shard(n: int, d: Dist) -> slice:
    """This rank's contiguous part of n items (n divisible by the world size)."""
    if n % d.world:
        raise ConfigError(f"rollout.num_prompts = {n} must be divisible by the {d.world} processes")
    k = n // d.world
    return slice(d.rank * k, (d.rank + 1) * k)


def gather(obj: Any, d: Dist) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank (CPU tensors and plain Python values)."""
    if not d.active:
        return [obj]
    out: list[Any] = [None] * d.world
    tdist.all_gather_object(out, obj)
    return out


def sum_gradients(params: list[torch.nn.Parameter], d: Dist) -> None:
    """Sum every parameter's gradient over the ranks (one flat all-reduce; a missing grad counts as 0)."""
    if not d.active:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    tdist.all_reduce(flat)
    a = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[a : a + n].view_as(g).to(g.dtype)
        a += n


def barrier(d: Dist) -> None:
    if d.active:
        tdist.barrier()


# --- FSDP2: the denoiser sharded over the ranks (train.parallel = "fsdp") -------------------------


def shard_module(root: torch.nn.Module, bf16_compute: bool = False) -> None:
    """fully_shard every block of root's ModuleLists (the transformer's layers), then root itself:
    each rank keeps 1/world of the weights, gradients and optimizer state; a block's weights are
    gathered for its forward and backward only. bf16_compute (CUDA): gathered and computed in bf16,
    gradients reduced in fp32, master weights fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # MixedPrecisionPolicy(): fully_shard's default, no casts
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16_compute
        else MixedPrecisionPolicy()
    )
    for module in list(root.children()):
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                if any(p.requires_grad for p in block.parameters()):
                    fully_shard(block, mp_policy=mp)
    fully_shard(
        root, reshard_after_forward=True, mp_policy=mp
    )  # so that root.parameters() are the shards between forwards


def clip_sharded_gradients(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """clip_grad_norm_ for sharded gradients: the norm of the whole gradient (the local shards' squares
    summed over the ranks), every shard scaled by min(1, max_norm / norm); returns the norm before."""
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    sq = torch.stack([g.detach().float().pow(2).sum() for g in local]).sum() if local else torch.zeros(())
    tdist.all_reduce(sq)
    norm = float(sq.sqrt())
    coef = min(1.0, max_norm / (norm + 1e-6))
    if coef < 1.0:
        for g in local:
            g.mul_(coef)
    return norm


def shard_like(state: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors -> this rank's shards, placed as the same-named tensors of `like` are."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    out = {}
    for k, v in state.items():
        ref = like.get(k)
        out[k] = (
            distribute_tensor(v.detach().to(ref.device_mesh.device_type), ref.device_mesh, ref.placements)
            if isinstance(ref, DTensor)
            else v
        )
    return out


def shard_optimizer_state(state: dict[str, Any], params: list[torch.nn.Parameter]) -> dict[str, Any]:
    """A whole optimizer state_dict -> one whose per-parameter tensors are sharded like the parameters."""
    out = {"state": {}, "param_groups": state["param_groups"]}
    for i, s in state["state"].items():
        p = params[int(i)]
        like: dict[str, torch.Tensor] = {
            k: p for k, v in s.items() if isinstance(v, torch.Tensor) and v.shape == p.shape
        }
        out["state"][i] = shard_like(s, like)
    return out
