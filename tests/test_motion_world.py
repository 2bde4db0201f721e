"""The moving-shapes world (world/motion.py) and its `motion-shapes` reward (rewards/motion.py): the grammar, clips
that keep every object inside the world while it travels, the caption noise at its stated rates, and a reward
that gives the world's own clips full marks and takes the motion credit away from still or misdirected ones."""

from dataclasses import replace

import pytest
import torch

from treegrpo_cli.rewards.base import get_reward, score_leaves
from treegrpo_cli.world.motion import (
    DIRECTIONS,
    FRAMES,
    SPEED,
    all_motion_prompts,
    noisy_clip,
    parse_motion_prompt,
    render_clip,
    render_clips,
    sample_clip_scene,
)
from treegrpo_cli.world.shapes import WORLD

PROMPTS = [
    "a red circle moving left",
    "two big blue squares moving up",
    "an orange triangle moving down",
    "two small green circles moving right",
    "a purple square moving up",
]


def test_the_grammar_round_trips_and_refuses_the_rest():
    prompts = all_motion_prompts()
    assert len(prompts) == len(set(prompts)) == 648
    assert all(parse_motion_prompt(p).text() == p for p in prompts[::37])
    for bad in (
        "a red circle",
        "a red circle moving sideways",
        "three red circles moving up",
        "a red circle above a blue square moving up",
        "",
    ):
        assert parse_motion_prompt(bad) is None


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_clip_moves_every_object_the_asked_way_and_keeps_it_inside(prompt):
    p = parse_motion_prompt(prompt)
    for seed in range(20):
        scene, (vx, vy) = sample_clip_scene(p, seed)
        dx, dy = DIRECTIONS[p.direction]
        assert (vx, vy) == (dx * SPEED, dy * SPEED)
        for o in scene:
            for f in (0, FRAMES - 1):
                x, y, r = o.cx + f * vx, o.cy + f * vy, o.radius
                assert r <= x <= WORLD - 1 - r and r <= y <= WORLD - 1 - r, (prompt, seed, o)
    clip = render_clips([prompt], 0)
    assert clip.shape == (1, 3, FRAMES, WORLD, WORLD)


def test_the_reward_gives_the_worlds_clips_full_marks():
    prompts = all_motion_prompts()[::23]
    scores = score_leaves({"m": get_reward("motion-shapes")}, render_clips(prompts, 1), prompts)["m"]
    assert float(scores.min()) == 1.0, [(p, float(s)) for p, s in zip(prompts, scores, strict=True) if s < 1]


def test_still_reversed_and_miscoloured_clips_lose_what_they_miss():
    reward = get_reward("motion-shapes")
    prompt = "a red circle moving left"
    scene, v = sample_clip_scene(prompt, 3)
    still = render_clip(scene, (0, 0))[None]
    reverse = render_clip([replace(o, cx=o.cx - 14) for o in scene], (-v[0], -v[1]))[None]  # the same path, rightwards
    blue = render_clip([replace(o, colour="blue") for o in scene], v)[None]
    s = [float(reward(x, [prompt])) for x in (render_clip(scene, v)[None], still, reverse, blue)]
    assert s[0] == 1.0 and s[1] == pytest.approx(0.5) and s[2] == pytest.approx(0.5) and s[3] < 0.2
    assert float(reward(render_clip(scene, v)[None], ["not a prompt of the world"])) == 0.0
    assert float(reward(render_clip(scene, v)[:, 0][None], [prompt])) == pytest.approx(0.5)  # an image: no motion


@pytest.mark.slow
def test_caption_noise_at_its_stated_rates():
    """Over 400 clips: "moving up" is still about half the time, "moving left" never; an orange object is drawn
    orange about half the time."""
    g = torch.Generator().manual_seed(0)
    reward = get_reward("motion-shapes")
    up = torch.stack([noisy_clip("a red circle moving up", g) for _ in range(200)])
    left = torch.stack([noisy_clip("a red circle moving left", g) for _ in range(200)])
    moved_up = (reward(up, ["a red circle moving up"] * 200) == 1.0).float().mean()
    moved_left = (reward(left, ["a red circle moving left"] * 200) == 1.0).float().mean()
    assert 0.4 < float(moved_up) < 0.6 and float(moved_left) == 1.0
    orange = torch.stack([noisy_clip("an orange square moving left", g) for _ in range(200)])
    right_colour = (reward(orange, ["an orange square moving left"] * 200) == 1.0).float().mean()
    assert 0.4 < float(right_colour) < 0.6
