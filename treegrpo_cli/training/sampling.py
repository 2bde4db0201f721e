"""Sampling and scoring: prompts -> samples -> decoded images -> reward scores. The one path of the held-out
evaluation during training (heldout.py), the run's sample grids (grids.py), `treegrpo eval`
(report/evaluate.py) and the trees `diversity --generate` writes (stages.run_rollout decodes with leaf_images).

Seeds: every stream of noise these commands draw is named in SEEDS, and a stream's seed is
mix_seed(seed, SEEDS[stream]). Sample j of prompt p (its place in the prompt list) starts from the root noise
of tree j of prompt p, mix_seed(stream seed, p, j) (engine/rollout.py), whatever the batch: so
`treegrpo eval --checkpoint RUN --seed S` samples the noises of the run's held-out evaluation when S is the
run's seed, and a model and its baseline see the same noises (a paired comparison).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..config import RewardConfig
from ..engine.dynamic import Judge
from ..engine.protocols import Kernel
from ..engine.rollout import Progress, TreeConfig, mix_seed, rollout
from ..engine.tree import Tree
from ..models.base import Policy
from ..rewards.base import (
    FrameStrided,
    Reward,
    check_rewards,
    get_reward,
    parse_reward_options,
    score_batch,
    weighted_sum,
)
from ..store.trees import to_uint8

SEEDS = {
    "heldout": 0x4E1D,  # the held-out evaluation of a run (eval.jsonl), and `treegrpo eval`
    "grid": 0xE7A1,  # the sample grids of a run (samples/step-N.png)
    "diversity": 0xD1F5,  # the prompts `diversity --generate` draws
}
BATCH = 16  # images sampled, decoded and scored at a time (`eval --batch`'s default, the held-out evaluation's)


def stream_seed(seed: int, stream: str) -> int:
    """The seed of one named stream (SEEDS) of a run or command seeded with `seed`."""
    return mix_seed(seed, SEEDS[stream])


@dataclass
class Chunk:
    images: Tensor  # [b, 3, (F,) H, W] float in [0, 1], CPU, as decoded (a reward sees them as reward_images does)
    prompts: list[str]  # [b]
    keys: list[dict[str, Any]]  # per image: prompt_id and sample, or file


def device_of(policy: Policy) -> torch.device:
    return next(iter(policy.trainable_parameters())).device


def decode(policy: Policy, tree: Tree) -> Tensor:
    """[L, 3, (F,) H, W] float32 on the CPU: the images of a tree batch's leaves as the policy decodes them."""
    with torch.no_grad():
        return policy.decode(tree.image_latent.to(device_of(policy))).float().cpu()


def leaf_images(policy: Policy, tree: Tree) -> Tensor:
    """[L, 3, (F,) H, W] uint8: the leaves' images as a user sees them and the rewards score them during
    training (the staged pipeline stores exactly these)."""
    with torch.no_grad():
        return to_uint8(policy.decode(tree.image_latent.to(device_of(policy))))


def sample_trees(
    policy: Policy,
    sde: Kernel,
    prompts: list[str],
    seed: int,
    *,
    samples: int = 1,
    batch: int = BATCH,
    max_batch: int = 64,
    stochastic: bool = False,
) -> Iterator[tuple[Tree, list[int], int]]:
    """(tree batch, prompt ids, sample j) of `samples` samples of every prompt, at most `batch` prompts a
    rollout: sample j of prompt p is the single-chain tree j of prompt p (root noise mix_seed(seed, p, j)).
    No noise after the root (the ODE) unless `stochastic` (the SDE at every step)."""
    tree_cfg = TreeConfig(sde_steps=None if stochastic else (), trees_per_prompt=1)
    for j in range(samples):
        for a in range(0, len(prompts), batch):
            ids = list(range(a, min(a + batch, len(prompts))))
            # the j earlier samples of these prompts, as if listed before: this rollout's trees are their j-th
            tree, _ = rollout(
                policy, [prompts[i] for i in ids], ids, sde, tree_cfg, seed, max_batch=max_batch, earlier_ids=ids * j
            )
            yield tree, ids, j


def sample_chunks(
    policy: Policy,
    sde: Kernel,
    prompts: list[str],
    seed: int,
    *,
    samples: int = 1,
    batch: int = BATCH,
    max_batch: int = 64,
    stochastic: bool = False,
) -> Iterator[Chunk]:
    """sample_trees' images, decoded, a chunk of at most `batch` at a time (one chunk in memory)."""
    for tree, ids, j in sample_trees(
        policy, sde, prompts, seed, samples=samples, batch=batch, max_batch=max_batch, stochastic=stochastic
    ):
        yield Chunk(decode(policy, tree), [prompts[i] for i in ids], [{"prompt_id": i, "sample": j} for i in ids])


def score(rewards: dict[str, Reward], chunk: Chunk) -> dict[str, Tensor]:
    """{name: [b] float32 CPU}: every reward of a chunk's images, in the encoding the training leaves are scored in
    (score_batch: rewards.base.reward_images, the uint8 picture as float)."""
    return {n: score_batch(fn, chunk.images, chunk.prompts).float().cpu() for n, fn in rewards.items()}


def sample_scores(
    policy: Policy,
    sde: Kernel,
    prompts: list[str],
    rewards: dict[str, Reward],
    seed: int,
    *,
    samples: int = 1,
    batch: int = BATCH,
    max_batch: int = 64,
    progress: Progress | None = None,
    see: Callable[[Chunk], None] | None = None,
) -> dict[str, Tensor]:
    """{name: [samples * P]}: every reward of every ODE sample (sample_chunks' order: sample-major); `see` is shown
    each chunk of images once scored (the guard's monitors)."""
    out: dict[str, list[Tensor]] = {n: [] for n in rewards}
    total, done = samples * len(prompts), 0
    for chunk in sample_chunks(policy, sde, prompts, seed, samples=samples, batch=batch, max_batch=max_batch):
        for n, v in score(rewards, chunk).items():
            out[n].append(v)
        if see is not None:
            see(chunk)
        done += len(chunk.prompts)
        if progress:
            progress("sample", done, total)
    return {n: torch.cat(v) if v else torch.zeros(0) for n, v in out.items()}


def build_rewards(
    reward: RewardConfig,
    device: str = "cpu",
    *,
    names: list[str] | tuple[str, ...] | None = None,
    options: dict[str, dict[str, str]] | None = None,
    dtype: str | None = None,
) -> dict[str, Reward]:
    """The reward models of a [reward] config (or `names`, with the config's options of those it names) on
    `device`, in `dtype` (default float32); `options` ({name: {key: value}}) over the config's. Every name and
    option is checked before any model loads. Videos meet an image reward at every reward.frame_stride-th frame."""
    names = tuple(reward.names if names is None else names)
    opts = {n: o for n, o in parse_reward_options(reward.options).items() if n in names}
    for n, o in (options or {}).items():
        opts[n] = {**opts.get(n, {}), **o}
    check_rewards(names, opts)
    rewards = {n: get_reward(n, device=device, dtype=dtype, **opts.get(n, {})) for n in names}
    if reward.frame_stride != 1:
        return {n: FrameStrided(r, reward.frame_stride) for n, r in rewards.items()}
    return rewards


def make_judge(tree: TreeConfig, reward: RewardConfig, policy: Policy, rewards: dict[str, Reward]) -> Judge | None:
    """tree.dynamic = "reward": x0-predictions decoded and scored as the leaves are (the weighted sum of the run's
    rewards); None for any other tree."""
    if tree.dynamic != "reward":
        return None
    weights = reward.weight_map()

    def judge(x0: Tensor, prompts: list[str]) -> Tensor:
        with torch.no_grad():
            images = to_uint8(policy.decode(x0))  # scored as the leaves are (score_batch: reward_images)
        scores = {n: score_batch(fn, images, prompts).float().cpu() for n, fn in rewards.items()}
        return weighted_sum(scores, weights)

    return judge
