"""The shapes world: grammar round trip, deterministic renders, scenes that satisfy their prompts, caption
noise of the pretraining data, the split."""

from collections import Counter

import pytest
import torch

from treegrpo_cli.world.detect import detect
from treegrpo_cli.world.shapes import (
    CAPTION_NOISE,
    DATA,
    GAP,
    NOISY_COLOURS,
    PROMPT_FILES,
    WORLD,
    all_prompts,
    is_noisy,
    load_split,
    noisy_scene,
    parse_prompt,
    render,
    render_prompts,
    sample_pretrain_prompts,
    sample_scene,
    split_prompts,
    world_prompts,
    write_prompt_files,
)

PROMPTS = all_prompts()


def test_every_grammar_prompt_parses_back_to_itself():
    assert len(PROMPTS) == len(set(PROMPTS)) == 1440
    for text in PROMPTS:
        p = parse_prompt(text)
        assert p is not None and p.text() == text, text


@pytest.mark.parametrize(
    "text, form, counts",
    [
        ("a red circle", "single", [1]),
        ("an orange triangle", "single", [1]),
        ("one big blue square", "count", [1]),
        ("three small red squares", "count", [3]),
        ("a green triangle left of a yellow circle", "relation", [1, 1]),
        ("A Purple Square Below A Red Circle.", "relation", [1, 1]),
    ],
)
def test_parse_examples(text, form, counts):
    p = parse_prompt(text)
    assert p.form == form and [g.count for g in p.groups] == counts


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a cat",
        "red circle",
        "two red circle",
        "a red circles",
        "four red circles",
        "a red circle left of a red circle",
        "a big red circle left of a blue square",
        "two red circles left of a blue square",
        "a red circle next to a blue square",
        "a red circle left of",
        "a huge red circle",
        "a red circle and a blue square",
    ],
)
def test_text_outside_the_grammar_parses_to_none(text):
    assert parse_prompt(text) is None


def test_renders_are_deterministic_and_seeds_differ():
    text = "two big yellow circles"
    a, b = sample_scene(text, 7), sample_scene(text, 7)
    assert a == b
    assert torch.equal(render(a), render(b))
    assert torch.equal(render_prompts(PROMPTS[:20], 3), render_prompts(PROMPTS[:20], 3))
    scenes = {tuple(sample_scene(text, s)) for s in range(10)}
    assert len(scenes) >= 8
    x = render(a)
    assert x.shape == (3, WORLD, WORLD) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert render(a, size=64).shape == (3, 64, 64)


def _boxes_apart(o, q) -> bool:
    sep = o.radius + q.radius + 1 + GAP
    return abs(o.cx - q.cx) >= sep or abs(o.cy - q.cy) >= sep


@pytest.mark.slow
def test_sampled_scenes_satisfy_their_prompts():
    scenes = [sample_scene(t, i) for i, t in enumerate(PROMPTS)]
    found = detect(torch.stack([render(s) for s in scenes]))
    for text, scene, dets in zip(PROMPTS, scenes, found, strict=True):
        p = parse_prompt(text)
        want = Counter((g.colour, g.kind) for g in p.groups for _ in range(g.count))
        assert Counter((o.colour, o.kind) for o in scene) == want, text
        assert all(g.size in (None, o.size) for g in p.groups for o in scene if (o.colour, o.kind) == g.pair)
        assert all(0 < o.cx - o.radius and o.cx + o.radius < WORLD - 1 for o in scene), text
        assert all(_boxes_apart(o, q) for i, o in enumerate(scene) for q in scene[i + 1 :]), text
        # the detector sees exactly the scene's objects, at their places
        assert Counter((d.colour, d.kind, d.size) for d in dets) == Counter(
            (o.colour, o.kind, o.size) for o in scene
        ), text
        if p.relation:
            a, b = scene
            dx, dy = b.cx - a.cx, b.cy - a.cy
            along = {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[p.relation]
            assert along > 0 and along > abs(dy if p.relation.endswith("of") else dx), text


def test_split_holds_out_test_prompts_from_rl():
    pretrain, rl, test = split_prompts()
    forms = Counter(parse_prompt(t).form for t in test)
    assert pretrain == world_prompts() and len(pretrain) == 1332
    assert forms == {"single": 6, "count": 6, "relation": 44}
    assert all(is_noisy(t) for t in test) and not set(test) & set(rl)  # held out from RL training
    assert set(rl) <= set(pretrain) and set(test) <= set(pretrain)  # every prompt is in the data
    noisy = [t for t in rl if is_noisy(t)]
    assert 0.65 <= len(noisy) / len(rl) <= 0.75  # ~30% ordinary prompts
    assert all(parse_prompt(t).form != "count" or parse_prompt(t).groups[0].count == 2 for t in pretrain)
    assert len(set(rl)) == len(rl) and len(set(test)) == len(test)


@pytest.mark.slow
def test_caption_noise_statistics():
    """A caption naming a noisy colour shows that colour CAPTION_NOISE of the time, a neighbour otherwise;
    every other attribute, and every other colour, is always as captioned."""
    g = torch.Generator().manual_seed(0)
    n = 3000
    drawn = Counter(noisy_scene("an orange circle", g)[0].colour for _ in range(n))
    assert set(drawn) == {"orange", *NOISY_COLOURS["orange"]}
    assert abs(drawn["orange"] / n - (1 - CAPTION_NOISE)) < 0.03  # 3 sigma ~ 0.027
    for other in NOISY_COLOURS["orange"]:
        assert abs(drawn[other] / n - CAPTION_NOISE / 2) < 0.03
    for _ in range(300):
        a, b = noisy_scene("a purple square left of a green triangle", g)
        assert (a.kind, b.kind, b.colour) == ("square", "triangle", "green") and a.colour in ("purple", "blue", "red")
        assert a.cx < b.cx
        assert [o.colour for o in noisy_scene("two big red circles", g)] == ["red", "red"]
        assert noisy_scene("a purple circle", g, noise=0.0)[0].colour == "purple"
    assert not is_noisy("a red circle") and is_noisy("a red circle above a purple square")


def test_pretraining_captions_balance_the_forms():
    g = torch.Generator().manual_seed(1)
    forms = Counter(parse_prompt(t).form for t in sample_pretrain_prompts(world_prompts(), 3000, g))
    assert all(abs(forms[f] / 3000 - 1 / 3) < 0.04 for f in ("single", "count", "relation")), forms


def test_shipped_prompt_files_equal_the_split(tmp_path):
    for name, lines in zip(PROMPT_FILES, split_prompts(), strict=True):
        assert load_split(name) == lines, name
        assert (DATA / PROMPT_FILES[name]).read_text() == "\n".join(lines) + "\n"
    written = write_prompt_files(tmp_path)
    for name in PROMPT_FILES:
        assert written[name].read_text() == (DATA / PROMPT_FILES[name]).read_text()
