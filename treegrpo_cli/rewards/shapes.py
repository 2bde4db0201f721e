"""The verifiable `shapes` reward (GenEval-style): parse the prompt, detect the shapes, score with partial credit.

The targets come from the prompt record's metadata when it has GenEval's `include` list (`from_meta`), else from
the prompt's text in the world's grammar: a user's own prompt file drives the verifier with its metadata.

Score of one image for a parsed prompt, in [0, 1]:
    (W_OBJECT * object + W_COUNT * count + W_SIZE * size + W_RELATION * relation) / (sum of the weights used)
    * EXTRA_DECAY ** (number of detected shapes whose colour and kind the prompt does not ask for)
per asked-for group of n objects (terms averaged over the groups of a relation):
    object    each of the n slots: 1 for a shape of the right colour AND kind, COLOUR_ONLY for a
              shape of the right colour and another kind (a shapeless blob earns nothing), 0 otherwise
    count     1 when exactly n shapes of that colour and kind are found, else 0
    size      (only when the prompt names a size) share of the n slots filled at the right size
    relation  (relations only) 1 when both objects are found and some pair of them stands in the
              asked relation: centroids at least REL_MARGIN px apart along the axis, and further
              along it than across it; 0 otherwise (also when an object is missing)
So a shape of the right colour alone earns 0.2 * 0.5 / 0.7 = 0.14 on "a red circle"; the right
object twice on "a red circle" earns 0.71; a flipped relation earns 0.70. Text outside the
grammar scores 0.
With the option kind = "soft" (`--reward-opt shapes.kind=soft`) a shape of the right colour and another
kind, or a blob, earns COLOUR_ONLY (none for a blob) + (1 - COLOUR_ONLY) * its soft fit to the asked kind
(world.detect.kind_fits: 1 inside the kind's acceptance box, decaying outside), so that almost-squares
score between circles and squares: a denser signal for RL, the same score for the world's own renders.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from ..engine.prompt import prompt_meta
from ..errors import ConfigError, shown
from ..world.detect import Det, detect
from ..world.shapes import COLOURS, KINDS, RELATIONS, SIZES, Group, Prompt, parse_prompt
from .base import register

W_OBJECT, W_COUNT, W_SIZE, W_RELATION = 0.5, 0.2, 0.15, 0.3
COLOUR_ONLY = 0.2
EXTRA_DECAY = 0.8
REL_MARGIN = 3.0
KIND_CREDITS = ("hard", "soft")


@lru_cache(maxsize=4096)
def _parse(text: str) -> Prompt | None:
    return parse_prompt(text)


def _group_terms(g: Group, dets: list[Det], soft: bool) -> tuple[float, float, float, list[Det]]:
    """(object, count, size) credit of one group and its matching detections."""
    match = [d for d in dets if d.colour == g.colour and d.kind == g.kind]
    found = min(len(match), g.count)
    near = sorted(
        (_near_credit(d, g.kind, soft) for d in dets if d.colour == g.colour and d.kind != g.kind), reverse=True
    )
    obj = (found + sum(near[: g.count - found])) / g.count
    count = float(len(match) == g.count)
    size = min(sum(d.size == g.size for d in match), g.count) / g.count if g.size else 0.0
    return obj, count, size, match


def _near_credit(d: Det, kind: str, soft: bool) -> float:
    """Object credit of a shape of the right colour but another kind (or a blob)."""
    colour = COLOUR_ONLY if d.kind != "blob" else 0.0
    return colour + (1 - COLOUR_ONLY) * d.fit(kind) if soft else colour


def relation_holds(a: Det, b: Det, relation: str) -> bool:
    """a REL b, from the centroids (y grows downwards)."""
    dx, dy = b.cx - a.cx, b.cy - a.cy
    along, across = {"left of": (dx, dy), "right of": (-dx, dy), "above": (dy, dx), "below": (-dy, dx)}[relation]
    return along >= REL_MARGIN and along > abs(across)


def score_detections(prompt: Prompt, dets: list[Det], soft: bool = False) -> float:
    """The score in [0, 1] of one image's detections for a parsed prompt (see the module docstring)."""
    terms = [_group_terms(g, dets, soft) for g in prompt.groups]
    n = len(terms)
    total = W_OBJECT * sum(t[0] for t in terms) / n + W_COUNT * sum(t[1] for t in terms) / n
    weight = W_OBJECT + W_COUNT
    if any(g.size for g in prompt.groups):
        total += W_SIZE * sum(t[2] for t in terms) / n
        weight += W_SIZE
    if prompt.relation is not None:
        ma, mb = terms[0][3], terms[1][3]
        total += W_RELATION * float(any(relation_holds(a, b, prompt.relation) for a in ma for b in mb))
        weight += W_RELATION
    extra = sum((d.colour, d.kind) not in prompt.pairs() for d in dets)
    return total / weight * EXTRA_DECAY**extra


def shapes_scores(images: Tensor, prompts: list[str], soft: bool = False) -> Tensor:
    """images [B, 3, H, W] float in [0, 1] (uint8 accepted), prompts [B] -> scores [B] float32."""
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} images but {len(prompts)} prompts")
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float().clamp(0, 1)
    targets = [from_meta(prompt_meta(p), p) or _parse(p) for p in prompts]  # a record's metadata, else its text
    parsed = [(i, p) for i, p in enumerate(targets) if p is not None]  # prompts in the grammar
    keep = [i for i, _ in parsed]
    out = torch.zeros(len(prompts), dtype=torch.float32)
    if keep:
        for (i, p), dets in zip(parsed, detect(x[keep]), strict=True):
            out[i] = score_detections(p, dets, soft)
    return out


def from_meta(meta: dict[str, Any], text: str) -> Prompt | None:
    """The targets of a prompt record's GenEval-style metadata, or None when it has no `include`:
        {"include": [{"class": "circle", "color": "red", "count": 2, "size": "big"},
                     {"class": "square", "color": "blue", "position": ["left of", 0]}]}
    one or two objects (class: a kind of the world, color: one of its colours, count >= 1 (default 1), size
    optional); a second object's `position` [relation, 0] asks it to stand in that relation to the first
    (GenEval's form). GenEval's `exclude` is implied: the count term wants exactly `count`."""
    include = meta.get("include")
    if include is None:
        return None
    where = f"shapes reward: the metadata of prompt {shown(str(text), 80)}"
    if not isinstance(include, list) or not 1 <= len(include) <= 2:
        raise ConfigError(f"{where}: include must list one or two objects, got {shown(include, 120)}")
    groups = [_group(o, where) for o in include]
    position = include[1].get("position") if len(include) == 2 else None
    if position is None:
        return Prompt("count" if groups[0].count > 1 else "single", tuple(groups))
    if not (isinstance(position, list) and len(position) == 2 and position[0] in RELATIONS and position[1] == 0):
        raise ConfigError(f"{where}: position must be [one of {', '.join(RELATIONS)}, 0], got {shown(position)}")
    return Prompt("relation", (groups[1], groups[0]), position[0])  # the second object REL the first


def _group(obj: Any, where: str) -> Group:
    """One object of `include` as a Group of the world."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: each object of include must be an object, got {shown(obj, 80)}")
    kind, colour, count, size = obj.get("class"), obj.get("color"), obj.get("count", 1), obj.get("size")
    checks = [
        (kind in KINDS, f"class must be one of {', '.join(KINDS)}, got {shown(kind)}"),
        (colour in COLOURS, f"color must be one of {', '.join(COLOURS)}, got {shown(colour)}"),
        (type(count) is int and 1 <= count <= 9, f"count must be a whole number from 1 to 9, got {shown(count)}"),
        (size is None or size in SIZES, f"size must be one of {', '.join(SIZES)}, got {shown(size)}"),
    ]
    for ok, why in checks:
        if not ok:
            raise ConfigError(f"{where}: {why}")
    return Group(str(colour), str(kind), size, count)


class ShapesReward:
    """GenEval-style reward on the embedded shapes world: colour, kind, count, size and position."""

    name = "shapes"

    def __init__(self, kind: str = "hard"):
        if kind not in KIND_CREDITS:
            raise ConfigError(f"shapes.kind must be one of {', '.join(KIND_CREDITS)}; got {kind!r}")
        self.soft = kind == "soft"

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        return shapes_scores(images, prompts, self.soft)


register(ShapesReward.name, ShapesReward, options=("kind",))
