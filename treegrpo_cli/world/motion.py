"""The moving-shapes world: the shapes world's objects travelling across short clips, the video sibling of
world/shapes.py.

A clip is FRAMES frames of the 32x32 world. Its prompt is a shapes-world single or count prompt (of one or two
objects: three big ones have no room to travel) followed by a direction: "a red circle moving left", "two big
blue squares moving up". Every object of the prompt moves in
that direction at SPEED px a frame (the whole travel, SPEED x (FRAMES - 1) px, stays inside the world); the
scene of the first frame is drawn as in the image world, with room left for the travel.

Caption noise, as web captions of clips have it: besides the image world's colour noise (a caption naming
orange or purple misnames that colour half the time), a caption saying "moving up" or "moving down" shows a
clip whose objects stand still half the time (MOTION_NOISE). A model that fits such data perfectly moves an
asked-for object up or down only about half the time: headroom that RL on the `motion-shapes` reward, which
checks the motion, has to fill.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .shapes import COLOURS as _COLOURS
from .shapes import (
    KINDS,
    NOISY_COLOURS,
    WORLD,
    Group,
    Obj,
    Prompt,
    as_generator,
    misname,
    parse_prompt,
    render,
    sample_scene,
)

FRAMES = 8  # frames of a clip
SPEED = 2  # px a frame: 14 px over a clip
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # (dx, dy), y down
NOISY_DIRECTIONS = ("up", "down")  # captions that show a still clip half the time
MOTION_NOISE = 0.5
MAX_COUNT = 2  # three big objects have no room to travel 14 px in a 32 px world


@dataclass(frozen=True)
class MotionPrompt:
    still: Prompt  # the scene of a frame: a single or count prompt of the image world
    direction: str  # a key of DIRECTIONS

    def text(self) -> str:
        return f"{self.still.text()} moving {self.direction}"


def parse_motion_prompt(text: str) -> MotionPrompt | None:
    """'<single or count prompt of one or two objects> moving <direction>' -> MotionPrompt; None otherwise."""
    head, sep, direction = text.strip().rpartition(" moving ")
    if not sep or direction not in DIRECTIONS:
        return None
    still = parse_prompt(head)
    if still is None or still.form == "relation" or still.groups[0].count > MAX_COUNT:
        return None
    return MotionPrompt(still, direction)


def all_motion_prompts() -> list[str]:
    """Every prompt of the grammar (648): the image world's singles and its counts of one or two, times 4
    directions."""
    sizes = (None, "small", "big")
    stills = [Prompt("single", (Group(c, k, s),)) for c in _COLOURS for k in KINDS for s in sizes]
    counts = range(1, MAX_COUNT + 1)
    stills += [Prompt("count", (Group(c, k, s, n),)) for n in counts for c in _COLOURS for k in KINDS for s in sizes]
    return [MotionPrompt(p, d).text() for p in stills for d in DIRECTIONS]


def sample_clip_scene(
    prompt: MotionPrompt | str, generator: torch.Generator | int | None = None, moving: bool = True
) -> tuple[list[Obj], tuple[int, int]]:
    """(the first frame's scene, the velocity in px a frame): the image world's placement with room for the
    whole travel, so every object stays inside the world in every frame."""
    p = parse_motion_prompt(prompt) if isinstance(prompt, str) else prompt
    if p is None:
        raise ValueError(f"not a moving-shapes prompt: {prompt!r}")
    dx, dy = DIRECTIONS[p.direction]
    travel = SPEED * (FRAMES - 1)
    scene = sample_scene(p.still, as_generator(generator), travel=(dx * travel, dy * travel))
    return scene, ((dx * SPEED, dy * SPEED) if moving else (0, 0))


def render_clip(scene: list[Obj], velocity: tuple[int, int], frames: int = FRAMES, size: int = WORLD) -> Tensor:
    """[3, frames, size, size] float32 in [0, 1]: frame f draws every object moved f x velocity."""
    vx, vy = velocity
    return torch.stack(
        [render([replace(o, cx=o.cx + f * vx, cy=o.cy + f * vy) for o in scene], size) for f in range(frames)], 1
    )


def render_clips(prompts: list[str], generator: torch.Generator | int | None = None, size: int = WORLD) -> Tensor:
    """[B, 3, FRAMES, size, size]: one clip per prompt, exactly as asked (no caption noise)."""
    gen = as_generator(generator)
    return torch.stack([render_clip(*sample_clip_scene(p, gen), size=size) for p in prompts])


def noisy_clip(prompt: str, generator: torch.Generator) -> Tensor:
    """[3, FRAMES, 32, 32]: a pretraining clip of `prompt` with the world's caption noise: every object of a noisy
    colour is drawn in a neighbouring hue with the image world's probability, and a noisy direction shows a still
    clip with probability MOTION_NOISE."""
    p = parse_motion_prompt(prompt)
    if p is None:
        raise ValueError(f"not a moving-shapes prompt: {prompt!r}")
    moving = not (p.direction in NOISY_DIRECTIONS and float(torch.rand((), generator=generator)) < MOTION_NOISE)
    scene, velocity = sample_clip_scene(p, generator, moving)
    return render_clip(misname(scene, generator), velocity)


def is_noisy_motion(text: str) -> bool:
    """Whether the pretraining data gets this caption wrong: a noisy colour or a noisy direction."""
    p = parse_motion_prompt(text)
    if p is None:
        return False
    return p.direction in NOISY_DIRECTIONS or any(g.colour in NOISY_COLOURS for g in p.still.groups)


def split_motion_prompts(test: int = 48, ordinary_share: float = 0.3) -> tuple[list[str], list[str], list[str]]:
    """(pretrain, rl_train, test): pretraining sees every prompt; test holds `test` noisy prompts (the first in
    SHA-1 order), never trained on by RL; rl_train the other noisy prompts plus ordinary ones making up
    ordinary_share. Each list in all_motion_prompts() order."""
    import hashlib

    pretrain = all_motion_prompts()
    order = {t: i for i, t in enumerate(pretrain)}
    key = lambda t: hashlib.sha1(t.encode()).hexdigest()  # noqa: E731
    noisy = sorted((t for t in pretrain if is_noisy_motion(t)), key=key)
    held, rl = noisy[:test], noisy[test:]
    rl += sorted((t for t in pretrain if not is_noisy_motion(t)), key=key)[
        : round(len(rl) * ordinary_share / (1 - ordinary_share))
    ]
    return pretrain, sorted(rl, key=order.__getitem__), sorted(held, key=order.__getitem__)
