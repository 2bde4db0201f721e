"""The shapes world: grammar round trip, deterministic renders, scenes that satisfy their prompts, the split."""

from collections import Counter

import pytest
import torch

from treegrpo_cli.world.detect import detect
from treegrpo_cli.world.shapes import (
    COLOURS, DATA, GAP, HELD_OUT, KINDS, PROMPT_FILES, WORLD, familiar_analogues, load_split, parse_prompt, render,
    render_prompts, sample_scene, split_prompts, all_prompts, write_prompt_files,
)

PROMPTS = all_prompts()


def test_every_grammar_prompt_parses_back_to_itself():
    assert len(PROMPTS) == len(set(PROMPTS)) == 1440
    for text in PROMPTS:
        p = parse_prompt(text)
        assert p is not None and p.text() == text, text


@pytest.mark.parametrize("text, form, counts", [
    ("a red circle", "single", [1]),
    ("an orange triangle", "single", [1]),
    ("one big blue square", "count", [1]),
    ("three small red squares", "count", [3]),
    ("a green triangle left of a yellow circle", "relation", [1, 1]),
    ("A Purple Square Below A Red Circle.", "relation", [1, 1]),
])
def test_parse_examples(text, form, counts):
    p = parse_prompt(text)
    assert p.form == form and [g.count for g in p.groups] == counts


@pytest.mark.parametrize("text", [
    "", "a cat", "red circle", "two red circle", "a red circles", "four red circles",
    "a red circle left of a red circle", "a big red circle left of a blue square",
    "two red circles left of a blue square", "a red circle next to a blue square", "a red circle left of",
    "a huge red circle", "a red circle and a blue square",
])
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


def test_sampled_scenes_satisfy_their_prompts():
    scenes = [sample_scene(t, i) for i, t in enumerate(PROMPTS)]
    found = detect(torch.stack([render(s) for s in scenes]))
    for text, scene, dets in zip(PROMPTS, scenes, found):
        p = parse_prompt(text)
        want = Counter((g.colour, g.kind) for g in p.groups for _ in range(g.count))
        assert Counter((o.colour, o.kind) for o in scene) == want, text
        assert all(g.size in (None, o.size) for g in p.groups for o in scene if (o.colour, o.kind) == g.pair)
        assert all(0 < o.cx - o.radius and o.cx + o.radius < WORLD - 1 for o in scene), text
        assert all(_boxes_apart(o, q) for i, o in enumerate(scene) for q in scene[i + 1:]), text
        # the detector sees exactly the scene's objects, at their places
        assert Counter((d.colour, d.kind, d.size) for d in dets) == Counter(
            (o.colour, o.kind, o.size) for o in scene), text
        if p.relation:
            a, b = scene
            dx, dy = b.cx - a.cx, b.cy - a.cy
            along = {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[p.relation]
            assert along > 0 and along > abs(dy if p.relation.endswith("of") else dx), text


def test_split_holds_out_pairs_from_pretraining():
    pretrain, rl, test = split_prompts()
    parsed = {t: parse_prompt(t) for t in PROMPTS}
    assert 300 <= len(pretrain) <= 800 and 60 <= len(rl) <= 150 and 48 <= len(test) <= 64
    seen = set().union(*(parsed[t].pairs() for t in pretrain))
    assert not seen & set(HELD_OUT)
    assert {c for c, _ in seen} == set(COLOURS) and {k for _, k in seen} == set(KINDS)
    novel = [t for t in rl if parsed[t].pairs() & set(HELD_OUT)]
    assert 0.6 <= len(novel) / len(rl) <= 0.8            # ~30% ordinary prompts
    assert all(parsed[t].pairs() & set(HELD_OUT) for t in test)
    assert not set(test) & set(pretrain) and not set(test) & set(rl)
    assert set(rl) - set(novel) <= set(pretrain)
    assert len(set(pretrain)) == len(pretrain) and len(set(rl)) == len(rl) and len(set(test)) == len(test)


def test_shipped_prompt_files_equal_the_split(tmp_path):
    for name, lines in zip(PROMPT_FILES, split_prompts()):
        assert load_split(name) == lines, name
        assert (DATA / PROMPT_FILES[name]).read_text() == "\n".join(lines) + "\n"
    written = write_prompt_files(tmp_path)
    for name in PROMPT_FILES:
        assert written[name].read_text() == (DATA / PROMPT_FILES[name]).read_text()


def test_familiar_analogues_swap_only_the_held_out_pairs():
    assert familiar_analogues("three big red squares") == ["three big red circles", "three big red triangles"]
    assert familiar_analogues("a red circle below a red square") == ["a red circle below a red triangle"]
    assert familiar_analogues("a red square below a green triangle") == [
        "a red circle below a green circle", "a red circle below a green square",
        "a red triangle below a green circle", "a red triangle below a green square"]
    assert familiar_analogues("a big orange square") == ["a big orange square"]   # nothing held out
    pretrain = set(load_split("pretrain"))
    for t in load_split("test"):
        same = parse_prompt(t)
        for a in familiar_analogues(t):
            q = parse_prompt(a)
            assert a in pretrain and q.form == same.form and q.relation == same.relation
            assert [(g.colour, g.size, g.count) for g in q.groups] == [(g.colour, g.size, g.count) for g in same.groups]
    with pytest.raises(ValueError, match="not a prompt"):
        familiar_analogues("a red hexagon")
