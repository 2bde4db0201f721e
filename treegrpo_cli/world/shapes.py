"""The shapes world: scenes of one to three flat shapes, a small prompt grammar, a renderer, prompt splits.

Scenes are drawn in a 32x32 world: 6 colours x 3 kinds (circle, square, upright triangle) x 2 sizes
(radius 4 or 6 px: the half-side of a 9 or 13 px bounding box) on a light grey background; centres lie
on a grid of step 2 px, and the bounding boxes of two shapes are always at least 2 px apart.

Grammar (lower-case, no trailing period; size words are optional and leave the size free when absent):
    single    "a red circle", "a big blue square", "an orange triangle"
    count     "one red circle", "two yellow circles", "three small red squares"
    relation  "a green triangle left of a yellow circle" (left of, right of, above, below; the two
              objects differ in colour or kind and carry no size word)

Data and split. The world's data uses singles, "two" counts and relations (world_prompts). Its
captions are imperfect, as web captions are: a caption that names ORANGE or PURPLE misnames the colour
of each such object half the time (CAPTION_NOISE), the image showing red or yellow for orange, blue or
red for purple (NOISY_COLOURS). A model that fits this data perfectly draws an asked-for orange or
purple object only about half the time, so more pretraining cannot close the gap, while the `shapes`
reward asks for the prompt exactly: the headroom RL has to fill. Every prompt appears in pretraining.
    test      56 prompts naming a noisy colour (6 singles, 6 counts, 44 relations), never trained on by RL
    rl_train  the other noisy singles and counts, 120 other noisy relations, plus ordinary prompts
              making up 30% of the list
Samples are taken in the order of the SHA-1 of the prompt text, so the split is stable everywhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

WORLD = 32  # side of the world in pixels
COLOURS: dict[str, tuple[int, int, int]] = {  # RGB 0-255; pairwise distance >= 90, >= 170 from background
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 90, 220),
    "yellow": (235, 215, 40),
    "purple": (150, 60, 190),
    "orange": (245, 125, 20),
}
BACKGROUND = (215, 215, 215)
KINDS = ("circle", "square", "triangle")
SIZES = {"small": 4, "big": 6}  # radius in px: bounding box side 2r+1 = 9 or 13
RELATIONS = ("left of", "right of", "above", "below")
COUNT_WORDS = {1: "one", 2: "two", 3: "three"}
GRID, MARGIN, GAP = 2, 1, 2  # centre grid step, border margin, min gap between boxes
REL_SLACK = 4  # max offset across the axis of a relation, px
# Caption noise of the pretraining data: a caption naming one of these colours shows, with probability
# CAPTION_NOISE, an object of a neighbouring hue instead (the caption misnames it)
NOISY_COLOURS = {"orange": ("red", "yellow"), "purple": ("blue", "red")}
CAPTION_NOISE = 0.5
DATA = Path(__file__).resolve().parents[1] / "data"
PROMPT_FILES = {"pretrain": "shapes_pretrain.txt", "rl_train": "shapes_train.txt", "test": "shapes_test.txt"}


@dataclass(frozen=True)
class Obj:
    kind: str
    colour: str
    size: str  # "small" | "big"
    cx: int  # centre, world pixels (x right, y down)
    cy: int

    @property
    def radius(self) -> int:
        return SIZES[self.size]


Scene = list[Obj]


@dataclass(frozen=True)
class Group:
    """count objects of one colour and kind; size None = free."""

    colour: str
    kind: str
    size: str | None = None
    count: int = 1

    @property
    def pair(self) -> tuple[str, str]:
        return (self.colour, self.kind)


@dataclass(frozen=True)
class Prompt:
    form: str  # "single" | "count" | "relation"
    groups: tuple[Group, ...]  # one group, or two for a relation (groups[0] REL groups[1])
    relation: str | None = None

    def text(self) -> str:
        if self.form == "relation":
            a, b = self.groups
            return f"{_phrase(a, 'single')} {self.relation} {_phrase(b, 'single')}"
        return _phrase(self.groups[0], self.form)

    def pairs(self) -> set[tuple[str, str]]:
        return {g.pair for g in self.groups}


def _phrase(g: Group, form: str) -> str:
    words = [w for w in (g.size, g.colour) if w] + [g.kind + ("s" if g.count > 1 else "")]
    head = COUNT_WORDS[g.count] if form == "count" else ("an" if words[0][0] in "aeiou" else "a")
    return " ".join([head] + words)


# ---- grammar ------------------------------------------------------------------------------------


def all_prompts() -> list[str]:
    """Every prompt of the grammar (1440), in a fixed order: singles, counts, relations."""
    pairs = [(c, k) for c in COLOURS for k in KINDS]
    sizes = (None, "small", "big")
    out = [Prompt("single", (Group(c, k, s),)) for c, k in pairs for s in sizes]
    out += [Prompt("count", (Group(c, k, s, n),)) for n in COUNT_WORDS for c, k in pairs for s in sizes]
    out += [Prompt("relation", (Group(*a), Group(*b)), r) for a in pairs for b in pairs if a != b for r in RELATIONS]
    return [p.text() for p in out]


def parse_prompt(text: str) -> Prompt | None:
    """The Prompt a grammar text says, or None for text outside the grammar (case and a final '.' are forgiven)."""
    if not isinstance(text, str):
        return None
    toks = text.strip().lower().rstrip(".").split()
    first = _parse_phrase(toks, 0)
    if first is None:
        return None
    g1, form, i = first
    if i == len(toks):
        return Prompt(form, (g1,))
    if form != "single" or g1.size is not None:
        return None
    rel = next((r for r in RELATIONS if toks[i : i + len(r.split())] == r.split()), None)
    if rel is None:
        return None
    second = _parse_phrase(toks, i + len(rel.split()))
    if second is None or second[1] != "single" or second[0].size is not None or second[2] != len(toks):
        return None
    if second[0].pair == g1.pair:
        return None
    return Prompt("relation", (g1, second[0]), rel)


def _parse_phrase(toks: list[str], i: int) -> tuple[Group, str, int] | None:
    """'a [size] colour kind' or 'COUNT [size] colour kind(s)' at toks[i:] -> (group, form, next index)."""
    counts = {w: n for n, w in COUNT_WORDS.items()}
    if i >= len(toks) or toks[i] not in ("a", "an", *counts):
        return None
    form, n = ("single", 1) if toks[i] in ("a", "an") else ("count", counts[toks[i]])
    i += 1
    size = toks[i] if i < len(toks) and toks[i] in SIZES else None
    i += size is not None
    if i + 1 >= len(toks):
        return None
    colour, noun = toks[i], toks[i + 1]
    kind = noun[:-1] if n > 1 else noun
    if colour not in COLOURS or kind not in KINDS or noun != kind + ("s" if n > 1 else ""):
        return None
    return Group(colour, kind, size, n), form, i + 2


# ---- scenes and rendering -----------------------------------------------------------------------


def _parsed(text: str) -> Prompt:
    """The Prompt of a text known to be in the grammar (the world's own prompt lists)."""
    p = parse_prompt(text)
    if p is None:
        raise ValueError(f"not a shapes-world prompt: {text!r}")
    return p


def as_generator(seed: torch.Generator | int | None) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return seed
    g = torch.Generator()
    g.manual_seed(0 if seed is None else int(seed))
    return g


def sample_scene(
    prompt: Prompt | str, generator: torch.Generator | int | None = None, travel: tuple[int, int] = (0, 0)
) -> Scene:
    """A random scene that satisfies the prompt (free sizes and positions drawn from generator). travel (x, y):
    every object also fits when moved by it (the moving-shapes world's clips; (0, 0) in the image world)."""
    p = parse_prompt(prompt) if isinstance(prompt, str) else prompt
    if p is None:
        raise ValueError(f"not a shapes-world prompt: {prompt!r}")
    gen = as_generator(generator)
    specs = []  # (colour, kind, size) per object, groups in order
    for g in p.groups:
        for _ in range(g.count):
            size = g.size or ("small", "big")[int(torch.randint(2, (1,), generator=gen))]
            specs.append((g.colour, g.kind, size))
    centres = _place([SIZES[s] for _, _, s in specs], p.relation, gen, travel=travel)
    return [Obj(k, c, s, x, y) for (c, k, s), (x, y) in zip(specs, centres, strict=True)]


def _place(
    radii: list[int],
    relation: str | None,
    gen: torch.Generator,
    tries: int = 256,
    rounds: int = 2048,
    travel: tuple[int, int] = (0, 0),
) -> list[tuple[int, int]]:
    """Centres for objects of these radii, boxes GAP apart; objects 0 REL 1 when relation is given; every box
    also inside the world when moved by travel (x, y)."""
    tx, ty = travel
    gx = [torch.arange(r + MARGIN + max(0, -tx), WORLD - MARGIN - r - max(0, tx), GRID) for r in radii]
    gy = [torch.arange(r + MARGIN + max(0, -ty), WORLD - MARGIN - r - max(0, ty), GRID) for r in radii]
    for _ in range(rounds):
        # cx, cy [tries, k]: candidate layouts, the first valid one wins
        cx = torch.stack([g[torch.randint(len(g), (tries,), generator=gen)] for g in gx], 1)
        cy = torch.stack([g[torch.randint(len(g), (tries,), generator=gen)] for g in gy], 1)
        ok = torch.ones(tries, dtype=torch.bool)
        for i in range(len(radii)):
            for j in range(i + 1, len(radii)):
                sep = radii[i] + radii[j] + 1 + GAP
                ok &= ((cx[:, i] - cx[:, j]).abs() >= sep) | ((cy[:, i] - cy[:, j]).abs() >= sep)
        if relation is not None:
            ok &= _relation_ok(cx, cy, radii, relation)
        if ok.any():
            t = int(ok.nonzero()[0])
            return [(int(cx[t, j]), int(cy[t, j])) for j in range(len(radii))]
    raise RuntimeError(f"no layout found for radii {radii} and relation {relation!r}")


def _relation_ok(cx: Tensor, cy: Tensor, radii: list[int], relation: str) -> Tensor:
    """Object 0 REL object 1, clearly: separated along the axis, within REL_SLACK across it."""
    sep = radii[0] + radii[1] + 1 + GAP
    dx, dy = cx[:, 1] - cx[:, 0], cy[:, 1] - cy[:, 0]  # from object 0 to object 1
    along, across = {"left of": (dx, dy), "right of": (-dx, dy), "above": (dy, dx), "below": (-dy, dx)}[relation]
    return (along >= sep) & (across.abs() <= REL_SLACK)


def render(scene: Scene, size: int = WORLD) -> Tensor:
    """[3, size, size] float32 in [0, 1]; hard-edged shapes, the same pixels for the same scene."""
    u = (np.arange(size) + 0.5) * WORLD / size - 0.5  # pixel centres in world coordinates
    x, y = np.meshgrid(u, u)  # [size, size], x along columns
    img = np.empty((size, size, 3), dtype=np.float32)
    img[:] = np.array(BACKGROUND, dtype=np.float32) / 255.0
    for o in scene:
        img[_mask(o, x, y)] = np.array(COLOURS[o.colour], dtype=np.float32) / 255.0
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def _mask(o: Obj, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    h = o.radius + 0.5  # half-side of the box, to pixel edges
    dx, dy = x - o.cx, y - o.cy
    if o.kind == "circle":
        return dx * dx + dy * dy <= h * h
    if o.kind == "square":
        return (np.abs(dx) <= h) & (np.abs(dy) <= h)
    t = (dy + h) / (2 * h)  # triangle: 0 at the apex row, 1 at the base
    return (t >= 0) & (t <= 1) & (np.abs(dx) <= t * h)


def render_prompts(prompts: list[str], generator: torch.Generator | int | None = None, size: int = WORLD) -> Tensor:
    """[B, 3, size, size]: one random scene per prompt, drawn in order from one generator."""
    gen = as_generator(generator)
    return torch.stack([render(sample_scene(p, gen), size) for p in prompts])


# ---- caption noise, pretraining data and prompt splits -----------------------------------------


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def world_prompts() -> list[str]:
    """The prompts of the world's data (a subset of the grammar): singles, "two" counts and relations."""
    out = []
    for t in all_prompts():
        p = _parsed(t)
        if p.form != "count" or p.groups[0].count == 2:
            out.append(t)
    return out


def is_noisy(text: str) -> bool:
    """Whether a prompt names a colour whose captions the pretraining data gets wrong (NOISY_COLOURS)."""
    p = parse_prompt(text)
    return p is not None and any(g.colour in NOISY_COLOURS for g in p.groups)


def noisy_scene(
    prompt: Prompt | str, generator: torch.Generator | int | None = None, noise: float = CAPTION_NOISE
) -> Scene:
    """A pretraining example for this caption: a scene that satisfies it, except that every object of a
    NOISY_COLOURS colour is, with probability `noise`, drawn in one of that colour's neighbours instead
    (the caption misnames it, as web captions misname hues)."""
    gen = as_generator(generator)
    return misname(sample_scene(prompt, gen), gen, noise)


def misname(scene: Scene, gen: torch.Generator, noise: float = CAPTION_NOISE) -> Scene:
    """The scene with every object of a NOISY_COLOURS colour drawn, with probability `noise`, in one of that
    colour's neighbours (one draw per such object, in order, from gen)."""
    out = []
    for o in scene:
        if o.colour in NOISY_COLOURS and float(torch.rand((), generator=gen)) < noise:
            options = NOISY_COLOURS[o.colour]
            o = replace(o, colour=options[int(torch.randint(len(options), (), generator=gen))])
        out.append(o)
    return out


@lru_cache(maxsize=8)
def _by_form(prompts: tuple[str, ...]) -> dict[str, list[str]]:
    """The prompts grouped by form (parsed once per list: pretraining draws a batch every step)."""
    by_form: dict[str, list[str]] = {}
    for t in prompts:
        by_form.setdefault(_parsed(t).form, []).append(t)
    return by_form


def sample_pretrain_prompts(prompts: list[str], n: int, generator: torch.Generator) -> list[str]:
    """n pretraining captions: a form drawn uniformly (single, count, relation), then a prompt of it."""
    by_form = _by_form(tuple(prompts))
    forms = sorted(by_form)
    f = torch.randint(len(forms), (n,), generator=generator).tolist()
    u = torch.rand(n, generator=generator, dtype=torch.float64).tolist()
    return [by_form[forms[i]][int(x * len(by_form[forms[i]]))] for i, x in zip(f, u, strict=True)]


def render_pretrain_batch(
    prompts: list[str], generator: torch.Generator, noise: float = CAPTION_NOISE, size: int = WORLD
) -> Tensor:
    """[B, 3, size, size]: one pretraining image per caption, with caption noise."""
    return torch.stack([render(noisy_scene(p, generator, noise), size) for p in prompts])


def split_prompts(
    test_counts: tuple[int, int, int] = (6, 6, 44), ordinary_share: float = 0.3, rl_relations: int = 120
) -> tuple[list[str], list[str], list[str]]:
    """(pretrain, rl_train, test) prompt lists, each in all_prompts() order (see the module docstring).

    pretrain: every world prompt. test: test_counts (singles, counts, relations) of the prompts that name
    a noisy colour, the first in SHA-1 order of each form. rl_train: rl_relations of the remaining noisy
    relations and every remaining noisy single and count, plus ordinary prompts making up ordinary_share."""
    pretrain = world_prompts()
    noisy = sorted((t for t in pretrain if is_noisy(t)), key=_hash)
    forms = {t: _parsed(t).form for t in noisy}
    test: list[str] = []
    for form, n in zip(("single", "count", "relation"), test_counts, strict=True):
        test += [t for t in noisy if forms[t] == form][:n]
    held = set(test)
    rest = [t for t in noisy if t not in held]
    rl = [t for t in rest if forms[t] != "relation"] + [t for t in rest if forms[t] == "relation"][:rl_relations]
    n_ordinary = round(len(rl) * ordinary_share / (1 - ordinary_share))
    rl += sorted((t for t in pretrain if not is_noisy(t)), key=_hash)[:n_ordinary]
    order = {t: i for i, t in enumerate(all_prompts())}
    return pretrain, sorted(rl, key=order.__getitem__), sorted(test, key=order.__getitem__)


def write_prompt_files(directory: Path | str | None = None) -> dict[str, Path]:
    """Write the three split lists (one prompt a line) to directory (default: the package data)."""
    d = Path(directory) if directory is not None else DATA
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, lines in zip(PROMPT_FILES, split_prompts(), strict=True):
        out[key] = d / PROMPT_FILES[key]
        out[key].write_text("\n".join(lines) + "\n")
    return out


def load_split(name: str) -> list[str]:
    """The shipped prompt list 'pretrain', 'rl_train' or 'test'."""
    return [t for t in (DATA / PROMPT_FILES[name]).read_text().splitlines() if t.strip()]
