"""Rollout and scoring of one iteration, overlapped: while chunk k+1 of the prompts is rolled out, chunk k's
leaves are scored on a worker thread. It pays when the reward's work happens elsewhere (a `serve-reward`
server in another process, on another GPU or machine): the rollout hides the scoring's wall-clock. With one
chunk it is the plain sequence, rollout then scoring.

The trees of a chunked rollout are those of one rollout (each prompt's trees come from its own seeds, the
earlier chunks' prompt ids passed on as in sharded rollouts); only their order in the batch is chunk by
chunk, so a run keeps its chunk count for life (it is part of the config).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from ..engine.dynamic import Judge, Shape
from ..engine.protocols import Policy
from ..engine.rollout import Progress, TreeConfig, rollout
from ..engine.tree import Tree, cat_trees
from ..rewards.base import score_leaves
from .sampling import leaf_images

MONITOR = "monitor/"  # a per-leaf monitor among the scores (trainer.py takes them out before credit)
LeafWatch = Callable[[torch.Tensor], dict[str, torch.Tensor]]  # leaf images [L, 3, (F,) H, W] uint8 -> {name: [L]}


@dataclass
class Scored:
    tree: Tree
    nfe: int
    scores: dict[str, torch.Tensor]  # {name: [L]} in the tree's leaf order
    seconds: dict[str, float] = field(default_factory=dict)  # rollout, score (exposed), score_busy
    dynamic: dict[str, int] = field(default_factory=dict)  # what the dynamic rollout did (engine.rollout's stats)


def chunk_count(setting: int, reward_names: list[str]) -> int:
    """rollout.score_overlap: 0 chooses 4 chunks when a reward is served over HTTP (its work is elsewhere,
    so the rollout hides it), else 1 (an in-process reward shares this process's cores and device)."""
    if setting > 0:
        return setting
    return 4 if any(n.startswith(("http://", "https://")) for n in reward_names) else 1


class ScoreTicks:
    """The score phase's progress over the chunks of an iteration: ("score", leaf scores done, leaf scores of the
    chunks rolled out so far), one leaf score being one leaf by one reward; safe from the scoring thread."""

    def __init__(self, progress: Progress | None):
        self.progress, self.done, self.total, self.lock = progress, 0, 0, threading.Lock()

    def chunk(self, leaves: int, rewards: int) -> Progress | None:
        """A chunk's own callback for score_leaves (cumulative per reward name), counted into the phase."""
        if self.progress is None:
            return None
        with self.lock:
            self.total += leaves * rewards
        last: dict[str, int] = {}

        def tick(phase: str, done: int, total: int) -> None:
            with self.lock:
                self.done += done - last.get(phase, 0)
                last[phase] = done
                cast(Progress, self.progress)("score", self.done, self.total)

        return tick


def _timed_score(
    rewards: dict[str, Any],
    images: torch.Tensor,
    prompts: list[str],
    progress: Progress | None = None,
    watch: LeafWatch | None = None,
) -> tuple[dict, float]:
    t = time.perf_counter()
    out = score_leaves(rewards, images, prompts, progress=progress)
    if watch is not None:  # the guard's image statistics of the same leaves, beside their scores
        out.update({MONITOR + k: v for k, v in watch(images).items()})
    return out, time.perf_counter() - t


def rollout_and_score(
    policy: Policy,
    prompts: list[str],  # every prompt of the run, by id
    mine: list[int],  # the prompt ids this process rolls out, in order
    *,
    earlier: list[int],  # the prompt ids of earlier ranks' shares
    sde: Any,
    cfg: TreeConfig,
    seed: int,
    max_batch: int,
    rewards: dict[str, Any],
    chunks: int,
    progress: Progress | None = None,
    shapes: list[Shape] | None = None,  # per prompt of `mine` (engine/dynamic.py); None: the config's tree
    judge: Judge | None = None,  # tree.dynamic = "reward": scores x0-predictions
    watch: LeafWatch | None = None,  # per-leaf monitors, returned among the scores as monitor/NAME
) -> Scored:
    size = max(1, -(-len(mine) // max(chunks, 1)))  # prompts per chunk
    starts = list(range(0, len(mine), size)) or [0]
    trees: list[Tree] = []
    pending: list[Future] = []
    nfe, stats = 0, dict[str, int]()
    t0 = time.perf_counter()
    pool = ThreadPoolExecutor(1, thread_name_prefix="treegrpo-score")
    ticks = ScoreTicks(progress)
    try:
        for a in starts:
            _raise_failed(pending)  # a chunk whose scoring failed stops the next ones' rollout and scoring
            ids = mine[a : a + size]
            tree, n = rollout(
                policy,
                [prompts[i] for i in ids],
                ids,
                sde,
                cfg,
                seed,
                max_batch=max_batch,
                progress=progress,
                earlier_ids=[*earlier, *mine[:a]],
                shapes=shapes[a : a + size] if shapes else None,
                judge=judge,
                stats=stats,
            )
            trees.append(tree)
            nfe += n
            leaf_prompts = [prompts[int(p)] for p in tree.tree_prompt[tree.tree[tree.leaves()]]]
            images = leaf_images(policy, tree)
            tick = ticks.chunk(len(leaf_prompts), len(rewards))
            if len(starts) == 1:  # no overlap: score here, as the plain sequence does
                pending.append(_done(_timed_score(rewards, images, leaf_prompts, tick, watch)))
            else:
                _raise_failed(pending)
                pending.append(pool.submit(_timed_score, rewards, images, leaf_prompts, tick, watch))
        t1 = time.perf_counter()
        results = [f.result() for f in pending]  # in order; the first error surfaces here
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after an error, chunks not yet scored are not sent
    t2 = time.perf_counter()
    scores = {n: torch.cat([r[n] for r, _ in results]) for n in results[0][0]} if results else {}
    busy = sum(s for _, s in results)
    whole = trees[0] if len(trees) == 1 else cat_trees(trees)
    if len(starts) == 1:  # the rollout phase did the scoring: split it back out
        return Scored(whole, nfe, scores, {"rollout": t1 - t0 - busy, "score": busy, "score_busy": busy}, stats)
    return Scored(whole, nfe, scores, {"rollout": t1 - t0, "score": t2 - t1, "score_busy": busy}, stats)


def _raise_failed(pending: list[Future]) -> None:
    for f in pending:
        if f.done() and f.exception() is not None:
            f.result()


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f
