"""The `shapes` reward: high on the world's own renders, low on other prompts, noise and blanks, partial credit."""

import random

import pytest
import torch

from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.world.shapes import Obj, all_prompts, render, render_prompts

PROMPTS = all_prompts()
reward = get_reward("shapes")


def _sample(n: int, seed: int) -> list[str]:
    return random.Random(seed).sample(PROMPTS, n)


def score(scene: list[Obj], prompt: str) -> float:
    return float(reward(render(scene)[None], [prompt])[0])


def test_registered_and_shaped():
    assert reward.name == "shapes"
    out = reward(render_prompts(PROMPTS[:4], 0), PROMPTS[:4])
    assert out.shape == (4,) and out.dtype == torch.float32


@pytest.mark.slow
def test_own_renders_score_high():
    prompts = _sample(200, 0)
    s = reward(render_prompts(prompts, 1), prompts)
    assert s.mean() >= 0.95 and s.min() >= 0.9


def test_renders_of_other_prompts_score_low():
    prompts = _sample(200, 0)
    rng = random.Random(1)
    others = [rng.choice([q for q in PROMPTS if q != p]) for p in prompts]
    assert reward(render_prompts(others, 2), prompts).mean() <= 0.3


def test_blank_and_noise_images_score_near_zero():
    prompts = _sample(64, 3)
    gen = torch.Generator().manual_seed(0)
    for fill in (0.0, 1.0, 0.5, 215 / 255):
        assert reward(torch.full((64, 3, 32, 32), fill), prompts).max() == 0
    assert reward(torch.rand(64, 3, 32, 32, generator=gen), prompts).mean() < 0.05
    red = torch.tensor([220, 40, 40]) / 255.0  # a whole image of one colour is no shape
    assert reward(red[None, :, None, None].expand(2, 3, 32, 32), ["a red square"] * 2).max() == 0


def test_mildly_noisy_renders_still_score_high():
    prompts = _sample(200, 4)
    x = render_prompts(prompts, 5)
    noisy = (x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    assert reward(noisy, prompts).mean() >= 0.9


def test_partial_credit_orders_the_attributes():
    one, two = Obj("circle", "red", "small", 8, 8), Obj("circle", "red", "small", 22, 8)
    assert score([one, two], "two red circles") == 1.0
    wrong_count = score([one], "two red circles")
    too_many = score([one, two], "a red circle")
    wrong_kind = score([Obj("square", "red", "small", 8, 8)], "a red circle")
    wrong_colour = score([Obj("circle", "blue", "small", 8, 8)], "a red circle")
    assert 0.3 < wrong_count < 1.0 and 0.3 < too_many < 1.0
    assert wrong_kind < 0.2 and wrong_colour < 0.05
    extra = score([one, Obj("triangle", "blue", "big", 22, 22)], "a red circle")
    assert 0.5 < extra < 1.0
    big = Obj("circle", "red", "big", 12, 12)
    assert score([big], "a big red circle") == 1.0 > score([one], "a big red circle") > wrong_kind


def test_flipped_relation_loses_the_relation_credit():
    a, b = Obj("triangle", "green", "small", 8, 16), Obj("circle", "yellow", "big", 22, 16)
    assert score([a, b], "a green triangle left of a yellow circle") == 1.0
    flipped = score([a, b], "a green triangle right of a yellow circle")
    assert 0.5 < flipped < 0.75
    assert score([a, b], "a yellow circle right of a green triangle") == 1.0
    assert score([a, b], "a green triangle above a yellow circle") == flipped  # sideways is not above
    assert score([a], "a green triangle left of a yellow circle") < 0.4  # missing object: no relation


def test_unparseable_prompts_score_zero():
    x = render_prompts(["a red circle"] * 3, 0)
    assert reward(x, ["a red cat", "", "a red circle"]).tolist() == [0.0, 0.0, 1.0]


def test_uint8_and_larger_images():
    prompts = _sample(16, 6)
    x = render_prompts(prompts, 7, size=64)
    assert reward(x, prompts).min() == 1.0
    assert reward((x * 255).round().to(torch.uint8), prompts).min() == 1.0


def test_a_batch_scores_each_image_as_it_would_alone():
    """Batching (and the vectorised detector behind it) changes no image's score; speed: bench/scoring.py."""
    prompts = _sample(64, 8)
    x = render_prompts(prompts, 9)
    x[::3] = torch.rand(x[::3].shape, generator=torch.Generator().manual_seed(0))  # some low scores too
    together = reward(x, prompts)
    alone = torch.cat([reward(x[i : i + 1], prompts[i : i + 1]) for i in range(len(prompts))])
    assert torch.equal(together, alone)
    assert together[1::3].min() > 0.9 and together[::3].max() < 0.3


def _red_block(h: int, w: int, cut: int) -> torch.Tensor:
    """A light grey 32x32 image with one red h x w rectangle whose bottom-right corner loses a
    staircase of `cut` pixels: cut 0 is a square, larger cuts move its fill towards a circle's."""
    img = torch.full((3, 32, 32), 215 / 255)
    red = torch.tensor([220, 40, 40]) / 255.0
    mask = torch.zeros(32, 32, dtype=torch.bool)
    mask[10 : 10 + h, 10 : 10 + w] = True
    for k in range(cut):
        mask[10 + h - 1 - k, 10 + w - cut + k : 10 + w] = False
    return torch.where(mask, red[:, None, None], img)


def test_soft_kind_credit_rises_towards_the_asked_kind():
    soft = get_reward("shapes", kind="soft")
    prompts = _sample(200, 0)
    x = render_prompts(prompts, 1)
    assert torch.equal(soft(x, prompts), reward(x, prompts))  # the world's own renders: unchanged
    images = torch.stack([_red_block(10, 10, c) for c in (0, 4, 5, 6)])  # fill 1.0, 0.90, 0.85, 0.79
    hard_s, soft_s = reward(images, ["a red square"] * 4), soft(images, ["a red square"] * 4)
    assert hard_s[0] == soft_s[0] == 1.0
    assert (soft_s[1:] >= hard_s[1:]).all() and (soft_s[1:] < 1).all()
    assert (soft_s.diff() < 0).all() and soft_s[1] > 2 * hard_s[1]  # the more cut away, the less credit


def test_soft_kind_option_is_checked_and_reaches_training():
    import pytest

    from treegrpo_cli.config import load_config
    from treegrpo_cli.errors import ConfigError
    from treegrpo_cli.training.trainer import Trainer

    with pytest.raises(ConfigError, match="shapes.kind"):
        get_reward("shapes", kind="fuzzy")
    cfg = load_config("branch", sets=['model="tiny-shapes"', 'reward.options=["shapes.kind=soft"]'])
    assert Trainer(cfg, "cpu").rewards["shapes"].soft


def test_videos_meet_image_rewards_frame_by_frame():
    """score_leaves on clips [L, 3, F, H, W]: every frame_stride-th frame scored with its clip's prompt, the mean
    per clip; a reward marked `video` gets the clips themselves."""
    import torch

    from treegrpo_cli.rewards.base import score_leaves

    class Brightness:
        name = "brightness"

        def __init__(self):
            self.seen = []

        def __call__(self, images, prompts):
            self.seen.append((tuple(images.shape), list(prompts)))
            return images.mean(dim=(1, 2, 3))

    clips = torch.zeros(2, 3, 5, 4, 4)
    for f in range(5):
        clips[0, :, f], clips[1, :, f] = f / 10, 1 - f / 10  # frame brightness 0.0 .. 0.4 and 1.0 .. 0.6
    r = Brightness()
    every = score_leaves({"b": r}, clips, ["p0", "p1"])["b"]
    torch.testing.assert_close(every, torch.tensor([0.2, 0.8]))
    assert r.seen[-1] == ((10, 3, 4, 4), ["p0"] * 5 + ["p1"] * 5)
    strided = score_leaves({"b": r}, clips, ["p0", "p1"], frame_stride=2)["b"]  # frames 0, 2, 4
    torch.testing.assert_close(strided, torch.tensor([0.2, 0.8]))
    assert r.seen[-1][0] == (6, 3, 4, 4)
    first_last = score_leaves({"b": r}, clips[:, :, [0, 4]], ["p0", "p1"])["b"]
    torch.testing.assert_close(first_last, torch.tensor([0.2, 0.8]))
    r.video = True
    score_leaves({"b": r}, clips, ["p0", "p1"])
    assert r.seen[-1][0] == (2, 3, 5, 4, 4)
    uint8 = score_leaves({"b": Brightness()}, (clips * 255).round().to(torch.uint8), ["p0", "p1"])["b"]
    torch.testing.assert_close(uint8, torch.tensor([0.2, 0.8]), atol=2e-3, rtol=0)
