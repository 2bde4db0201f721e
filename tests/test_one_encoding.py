"""Every reward is handed one encoding of a picture, the uint8 image as float in [0, 1] (rewards.base.reward_images):
the same tensor whether the picture is scored in training (the online loop's leaves; the staged `score` scores the
same uint8 from a tree folder), by the held-out evaluation (and the sample grids and `treegrpo eval`, which score
through the same sampling.score), by a dynamic tree's judge or by a `serve-reward` server."""

import threading

import torch

from treegrpo_cli.config import RewardConfig
from treegrpo_cli.engine.rollout import TreeConfig
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.rewards.base import reward_images, score_leaves
from treegrpo_cli.rewards.remote import RemoteReward, make_server
from treegrpo_cli.store.trees import to_uint8
from treegrpo_cli.training import sampling
from treegrpo_cli.training.heldout import heldout_reward
from treegrpo_cli.training.overlap import rollout_and_score

PROMPTS = ["a red circle", "two blue squares", "a green triangle"]
SEED = 7


class Recorder:
    """A reward that keeps every tensor it is handed and scores each image by its mean."""

    name = "recorder"

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        self.seen.append(images.clone())
        return images.float().mean(dim=(1, 2, 3))


def _seen(reward: Recorder) -> torch.Tensor:
    return torch.cat(reward.seen)


def test_a_reward_sees_the_same_tensor_in_training_and_in_held_out_evaluation(tiny_policy):
    """The online loop's rollout-and-score and the held-out evaluation draw the same ODE picture from one seed (one
    chain per prompt, no noise after the root): the reward is handed the same tensor and gives the same scores."""
    sde = FlowSDE(SamplerConfig(steps=2))
    train, held = Recorder(), Recorder()
    tree_cfg = TreeConfig(sde_steps=(), trees_per_prompt=1)
    ids = list(range(len(PROMPTS)))
    kw = dict(earlier=[], sde=sde, cfg=tree_cfg, seed=SEED, max_batch=64, chunks=1)
    out = rollout_and_score(tiny_policy, PROMPTS, ids, rewards={"r": train}, **kw)
    row = heldout_reward(tiny_policy, sde, PROMPTS, {"r": held}, {"r": 1.0}, samples=1, seed=SEED)
    a, b = _seen(train), _seen(held)
    assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    assert row["rewards/r/mean"] == float(out.scores["r"].mean())
    decoded = sampling.decode(tiny_policy, out.tree)  # what evaluation decodes: float, between the uint8 steps
    assert torch.equal(a, to_uint8(decoded).float() / 255.0) and not torch.equal(a, decoded.clamp(0, 1))


def test_stored_leaves_a_grid_a_judge_and_a_reward_server_hand_over_that_tensor(tiny_policy):
    """The same leaves scored as uint8 (a tree folder's; the staged `score`), as a float decode (sample grids,
    `treegrpo eval`), by the judge of a dynamic tree (x0-predictions) and through a reward server."""
    sde = FlowSDE(SamplerConfig(steps=2))
    tree, _, _ = next(sampling.sample_trees(tiny_policy, sde, PROMPTS, SEED))
    stored, grid, judged, served = Recorder(), Recorder(), Recorder(), Recorder()
    score_leaves({"r": stored}, sampling.leaf_images(tiny_policy, tree), PROMPTS)
    sampling.score({"r": grid}, sampling.Chunk(sampling.decode(tiny_policy, tree), PROMPTS, [{}] * len(PROMPTS)))
    judge = sampling.make_judge(TreeConfig(dynamic="reward"), RewardConfig(names=("r",)), tiny_policy, {"r": judged})
    assert judge is not None
    judge(tree.image_latent, PROMPTS)
    server = make_server({"r": served})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/r"
        sampling.score({url: RemoteReward(url)}, sampling.Chunk(sampling.decode(tiny_policy, tree), PROMPTS, []))
    finally:
        server.shutdown()
    want = _seen(stored)
    for other in (grid, judged, served):
        assert torch.equal(_seen(other), want)


def test_the_encoding_is_the_stored_uint8_and_a_no_op_on_what_it_gives():
    """Float images are rounded through uint8 (as tree folders store them); uint8 and its float (an image file read
    as x / 255: `treegrpo eval --images`) give the same tensor, and encoding twice changes nothing."""
    u8 = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(2, 3, 16, 16).contiguous()
    assert torch.equal(reward_images(u8), reward_images(u8.float() / 255))
    assert torch.equal(reward_images(reward_images(u8)), reward_images(u8))
    x = torch.rand(2, 3, 4, 5, 6) * 1.2 - 0.1  # videos too, out-of-range values clamped
    assert torch.equal(reward_images(x), to_uint8(x).float() / 255.0)
