"""The update a run makes at the end of each iteration: one class per method family behind one interface.

    Credited      one iteration's trees, scored and credited: what an update trains on
    Ranks         what an update reaches the other processes through; OneProcess answers for a single one
    Context       what the run lends an update for one iteration: the policy, its optimizer, the kernel, ...
    Update        the interface: sampling(), learn(), follow(), state(), load(); extra_forwards
    UPDATES       train.objective -> its class; a method registers itself where it is written (register_update)

A new method is a new class registered under its objective (engine/grpo.py GRPOUpdate, engine/nft.py NFTUpdate),
never a new branch of the run: the trainer (training/trainer.py) calls the interface and nothing else. An update
owns its state beside the policy's (DiffusionNFT's old policy) and names the checkpoint tensors that hold it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .tree import Tree

if TYPE_CHECKING:
    from .protocols import Conditions, Kernel, Policy


@dataclass
class Credited:
    """One iteration's trees, scored and credited: what its update trains on and its metrics row reports."""

    tree: Tree  # this process's trees
    whole: Tree  # every process's trees, in rank order (one process: `tree`)
    starts: list[int]  # where each process's nodes start in `whole`, and where the last ends
    scores: dict[str, Tensor]  # {reward: [L]} the scores of `whole`'s leaves
    weights: dict[str, float]  # {reward: weight} they were credited with
    edge: Tensor  # [N] edge advantages of `whole`'s nodes
    trained: Tensor  # [N] bool: the edges a GRPO update trains
    leaf: Tensor  # [N] leaf advantages (an NFT update's)
    nfe: int  # model evaluations of the rollout, over every process
    sde_steps: tuple[int, ...] | None  # the stochastic steps of the trees (None: every step)


class Ranks(Protocol):
    """The other processes of a data-parallel run, as an update sees them (it never asks how many there are)."""

    rank: int

    def sum_gradients(self, params: list[nn.Parameter]) -> None:
        """Sum every parameter's gradient over the processes."""

    def gather(self, x: Tensor) -> Tensor:
        """x of every process, concatenated in rank order."""

    def plan(self, whole: Any, starts: list[int], it: int) -> Any:
        """GRPO's global minibatch plan of iteration `it` (whole: the every-process grpo.Batch) restricted to this
        process's nodes: a grpo.Parallel, or None for one process."""


class OneProcess:
    """Ranks of a single process: nothing to sum, gather or plan across."""

    rank = 0

    def sum_gradients(self, params: list[nn.Parameter]) -> None:
        pass

    def gather(self, x: Tensor) -> Tensor:
        return x

    def plan(self, whole: Any, starts: list[int], it: int) -> Any:
        return None


@dataclass
class Context:
    """What the run lends an update for one iteration."""

    policy: Policy
    opt: torch.optim.Optimizer
    sde: Kernel
    ref: Policy | None  # the KL reference (train.kl_beta > 0)
    ranks: Ranks
    gen: torch.Generator  # the iteration's minibatch order
    max_batch: int
    after_step: Callable[[], None]  # after each optimizer step (the run's step count and EMA)
    optimizer_steps: Callable[[], int]  # the run's optimizer steps so far
    progress: Callable[[str, int, int], None] | None = None


class Update(ABC):
    """One method family's update. `cfg` is the run's config (its sections: train, nft, ..., seed)."""

    objective: ClassVar[str]
    extra_forwards: int = 0  # forwards of the update's own beside each trained one (a class or an instance sets it)

    def __init__(self, cfg: Any, policy: Policy, sde: Kernel):
        self.cfg = cfg

    def sampling(self, params: list[nn.Parameter]) -> AbstractContextManager[None]:
        """The weights rollouts sample with while inside (default: the trained ones)."""
        return nullcontext()

    @abstractmethod
    def learn(self, c: Credited, cond: Conditions, it: int, ctx: Context) -> tuple[dict[str, Any], Tensor]:
        """Iteration `it`'s update of credited trees (cond: this process's trees' conditions): its metrics and the
        advantages it trained on (for the metrics row)."""

    def follow(self, params: list[nn.Parameter], ctx: Context) -> dict[str, Any]:
        """After the update and the run's EMA: the update's own state moves on; its metrics."""
        return {}

    def state(self, names: list[str]) -> dict[str, dict[str, Tensor]]:
        """Checkpoint tensor groups ({file stem: {trainable tensor name: tensor}}) of the update's own state."""
        return {}

    def load(self, groups: dict[str, dict[str, Tensor]], names: list[str], step: int) -> None:
        """The update's own state from a checkpoint's tensor groups (default: it keeps none)."""
        return None


UPDATES: dict[str, type[Update]] = {}


def register_update(cls: type[Update]) -> type[Update]:
    """A class decorator: the update of train.objective = cls.objective."""
    UPDATES[cls.objective] = cls
    return cls


def make_update(cfg: Any, policy: Policy, sde: Kernel) -> Update:
    """The update of the run's train.objective."""
    cls = UPDATES.get(cfg.train.objective)
    if cls is None:
        raise ConfigError(f"train.objective must be one of {', '.join(UPDATES)}; got {cfg.train.objective!r}")
    return cls(cfg, policy, sde)
