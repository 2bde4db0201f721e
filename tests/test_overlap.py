"""Scoring overlapped with the rollout (training/overlap.py): a chunked rollout makes the same trees as one
rollout (only their order in the batch is chunk by chunk), each leaf gets its own image's score, a reward that
fails on the worker thread fails the iteration, and the automatic chunk count."""

import threading

import pytest
import torch

from treegrpo_cli.engine.rollout import TreeConfig
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.training import overlap
from treegrpo_cli.training.overlap import chunk_count, rollout_and_score
from treegrpo_cli.training.sampling import leaf_images

PROMPTS = ["a red circle", "two blue squares", "a green triangle", "an orange star", "a purple circle"]


def _run(chunks: int, rewards, mine=(4, 0, 2, 0, 3), earlier=(1,)):
    policy = load_policy("pixel-tiny")
    sde = FlowSDE(SamplerConfig(steps=4))
    tree_cfg = TreeConfig(split_steps=(0, 2), branch=2, sde_steps=(0, 1, 2), trees_per_prompt=2)
    out = rollout_and_score(
        policy,
        PROMPTS,
        list(mine),
        earlier=list(earlier),
        sde=sde,
        cfg=tree_cfg,
        seed=7,
        max_batch=64,
        rewards=rewards,
        chunks=chunks,
    )
    return policy, out


def _by_tree(policy, tree):
    """{(prompt id, k-th tree of that prompt id in batch order): the tree's leaf images}"""
    images, leaf_tree = leaf_images(policy, tree), tree.tree[tree.leaves()]
    out, seen = {}, {}
    for t in range(tree.num_trees):
        p = int(tree.tree_prompt[t])
        k = seen[p] = seen.get(p, -1) + 1
        out[p, k] = images[leaf_tree == t]
    return out


def test_chunks_make_the_trees_of_one_rollout_and_score_each_leaf():
    reward = {"shapes": get_reward("shapes")}
    policy, one = _run(1, reward)
    _, three = _run(3, reward)  # chunks of 2, 2 and 1 prompts; prompt 0 twice, in two chunks
    assert one.tree.num_nodes == three.tree.num_nodes and one.nfe == three.nfe
    a, b = _by_tree(policy, one.tree), _by_tree(policy, three.tree)
    assert a.keys() == b.keys() and len(a) == 10
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert not torch.equal(a[0, 0], a[0, 1])  # a repeated prompt gets further trees, not the same ones again
    for out in (one, three):  # each leaf's score is its own image's
        images, tree = leaf_images(policy, out.tree), out.tree
        prompts = [PROMPTS[int(p)] for p in tree.tree_prompt[tree.tree[tree.leaves()]]]
        direct = reward["shapes"](images.float() / 255, prompts)
        torch.testing.assert_close(out.scores["shapes"], direct, rtol=0, atol=0)
        assert set(out.seconds) == {"rollout", "score", "score_busy"}


def test_a_reward_that_fails_on_the_worker_stops_the_iteration(monkeypatch):
    """Chunk 1's scoring fails on the worker while chunk 2 is rolled out: chunk 2 is not sent for scoring and
    chunk 3 is not rolled out; the error is the reward's own."""
    second, failed, rollouts, calls = threading.Event(), threading.Event(), [], []
    real = overlap.rollout

    def counted(*a, **k):
        rollouts.append(1)
        if len(rollouts) == 2:
            second.set()
        out = real(*a, **k)
        if len(rollouts) == 2:
            assert failed.wait(30)  # chunk 1's scoring has failed by the end of chunk 2's rollout
        return out

    def broken(images, prompts):
        calls.append(len(prompts))
        assert second.wait(30)  # fails while chunk 2 is rolled out
        failed.set()
        raise TreegrpoError("the reward server at http://127.0.0.1:1 is not answering")

    monkeypatch.setattr(overlap, "rollout", counted)
    with pytest.raises(TreegrpoError, match="not answering"):
        _run(3, {"broken": broken})
    assert len(rollouts) == 2 and len(calls) == 1


@pytest.mark.parametrize(
    ("setting", "names", "chunks"),
    [(0, ["shapes"], 1), (0, ["shapes", "http://127.0.0.1:8000/clip"], 4), (2, ["shapes"], 2), (1, ["https://h"], 1)],
)
def test_the_chunk_count(setting, names, chunks):
    assert chunk_count(setting, names) == chunks
