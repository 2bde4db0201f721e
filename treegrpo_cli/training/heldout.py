"""Held-out reward during training: the mean weighted reward of ODE samples of fixed test prompts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..engine.protocols import Kernel
from ..engine.rollout import Progress
from ..models.base import Policy
from ..rewards.base import Reward, weighted_sum
from .guard import Watch
from .sampling import sample_scores


def heldout_reward(
    policy: Policy,
    sde: Kernel,
    prompts: list[str],
    rewards: dict[str, Reward],
    weights: dict[str, float],
    *,
    samples: int,
    seed: int,
    max_batch: int = 64,
    progress: Progress | None = None,
    watch: Watch | None = None,
) -> dict[str, Any]:
    """Mean (and standard error) of the weighted reward over prompts x samples ODE draws; `seed` is the
    stream's (sampling.stream_seed(run seed, "heldout")): `treegrpo eval` draws the same images. With a `watch`,
    the guard's monitors of the same images (monitor/... fields)."""
    see = watch.see if watch is not None else None
    scores = sample_scores(
        policy, sde, prompts, rewards, seed, samples=samples, max_batch=max_batch, progress=progress, see=see
    )  # {name: [samples * P]}
    total = weighted_sum(scores, weights)
    n = total.numel()
    out: dict[str, Any] = {
        "reward_mean": float(total.mean()),
        "reward_sem": float(total.std() / n**0.5) if n > 1 else 0.0,
        "prompts": len(prompts),
        "samples": samples,
    }
    out.update({f"rewards/{k}/mean": float(v.mean()) for k, v in scores.items()})
    if watch is not None:
        out.update(watch.row())
    return out


def heldout_row(
    policy: Policy,
    sde: Kernel,
    prompts: list[str],
    rewards: dict[str, Reward],
    weights: dict[str, float],
    *,
    ema: dict[str, torch.Tensor] | None,
    samples: int,
    seed: int,
    max_batch: int = 64,
    progress: Progress | None = None,
    watch: Callable[[], Watch] | None = None,
) -> dict[str, Any]:
    """The held-out reward of the weights `eval` and `export` use by default: the EMA where the run keeps one
    (then `raw/` fields score the trained weights), else the trained weights; `weights` says which. `watch` makes
    the guard's monitors, which watch the weights `eval` uses."""
    args = (policy, sde, prompts, rewards, weights)
    how: dict[str, Any] = {"samples": samples, "seed": seed, "max_batch": max_batch, "progress": progress}
    if ema is None:
        row = heldout_reward(*args, **how, watch=watch() if watch else None)
    else:
        raw = {f"raw/{k}": v for k, v in heldout_reward(*args, **how).items() if k.startswith(("reward_", "rewards/"))}
        with swapped_in(policy, ema):
            row = {**heldout_reward(*args, **how, watch=watch() if watch else None), **raw}
    row["weights"] = "ema" if ema is not None else "trained"
    return row


@contextmanager
def swapped_in(policy: Policy, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """`tensors` (e.g. the EMA) in the policy's trainable weights for the duration; the trained ones put back
    bit for bit after."""
    state = policy.trainable_state()  # detached views of the parameters (or of this rank's shards)
    kept = {k: v.clone() for k, v in state.items()}
    with torch.no_grad():
        try:
            for k, v in state.items():
                v.copy_(tensors[k])
            yield
        finally:
            for k, v in state.items():
                v.copy_(kept[k])
