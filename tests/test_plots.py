"""Pillow-only figures: line charts, panels, captioned grids, atomic PNG writes."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from PIL import Image

from treegrpo_cli import plots


def variance(img: Image.Image) -> float:
    return float(np.asarray(img.convert("RGB"), dtype=np.float64).var())


def test_line_chart_size_and_content():
    xs = list(range(50))
    img = plots.line_chart(
        {"reward": (xs, [math.sin(x / 5) for x in xs]), "baseline": (xs, [0.1 * x for x in xs])},
        "Reward",
        "iteration",
        "mean reward",
        size=(500, 300),
    )
    assert img.size == (500, 300) and img.mode == "RGB"
    assert variance(img) > 0
    # both series colours appear somewhere on the canvas
    pixels = {c for _, c in img.getcolors(1 << 20)}
    assert plots.PALETTE[0] in pixels and plots.PALETTE[1] in pixels


@pytest.mark.parametrize(
    "series",
    [
        {"one": ([3.0], [1.5])},  # a single point
        {"flat": ([0, 1, 2], [2.0, 2.0, 2.0])},  # constant values
        {"zero": ([0, 1, 2], [0.0, 0.0, 0.0])},
        {"nan": ([0, 1, 2, 3, 4], [1.0, float("nan"), 2.0, float("inf"), 3.0])},
        {"all-nan": ([0, 1], [float("nan"), float("nan")])},
        {},
        {"tiny": ([0, 1], [1e-9, 2e-9]), "big": ([0, 1e7], [5e6, 1e6])},
    ],
)
def test_line_chart_degenerate_inputs(series):
    img = plots.line_chart(series, "t", "x", "y")
    assert img.size == (640, 400)
    assert variance(img) > 0


def test_line_chart_rejects_ragged_series():
    with pytest.raises(ValueError, match="ragged|x values"):
        plots.line_chart({"s": ([0, 1], [1.0])}, "t", "x", "y")


def test_side_by_side():
    a, b = Image.new("RGB", (30, 20), (255, 0, 0)), Image.new("RGB", (10, 40), (0, 0, 255))
    out = plots.side_by_side([a, b])
    assert out.size == (40, 40)
    assert out.getpixel((0, 0)) == (255, 0, 0) and out.getpixel((35, 39)) == (0, 0, 255)


@pytest.mark.parametrize(
    "b, ncol, expect", [(5, None, (3, 2)), (4, None, (2, 2)), (1, None, (1, 1)), (6, 6, (6, 1)), (3, 10, (3, 1))]
)
def test_image_grid_dimensions(b, ncol, expect):
    imgs = torch.rand(b, 3, 8, 6, generator=torch.Generator().manual_seed(0))
    caps = [f"prompt {i} " + "with a long caption that has to wrap " * 3 for i in range(b)]
    out = plots.image_grid(imgs, caps, ncol=ncol, scale=4)
    cols, rows = expect
    assert out.size == (cols * (6 * 4 + 2 * plots.PAD), rows * (8 * 4 + 2 * plots.PAD + plots.caption_height()))
    assert variance(out) > 0


def test_image_grid_pixels_and_uint8():
    imgs = torch.zeros(2, 3, 2, 2, dtype=torch.uint8)
    imgs[0, 0] = 255  # first image pure red
    imgs[1, 2, 0, 0] = 255
    out = plots.image_grid(imgs, ["red", "blue corner"], scale=3)
    p = plots.PAD
    assert out.getpixel((p, p)) == (255, 0, 0) and out.getpixel((p + 5, p + 5)) == (255, 0, 0)
    cw = 2 * 3 + 2 * p
    assert out.getpixel((cw + p + 2, p + 2)) == (0, 0, 255)  # upscaled nearest: a 3x3 block
    assert out.getpixel((cw + p + 3, p)) == (0, 0, 0)


def test_image_grid_float_nan_and_bad_input():
    imgs = torch.full((1, 3, 4, 4), float("nan"))
    assert plots.image_grid(imgs, [""]).size[0] == 4 * 4 + 2 * plots.PAD
    with pytest.raises(ValueError):
        plots.image_grid(torch.rand(2, 3, 4, 4), ["only one"])
    with pytest.raises(ValueError):
        plots.image_grid(torch.rand(3, 4, 4), ["x"])


def test_caption_wraps_to_at_most_three_lines():
    lines = plots._wrap("word " * 200 + "x" * 300, 40)
    assert 1 <= len(lines) <= plots.CAPTION_LINES and lines[-1].endswith("...")
    assert all(plots._width(line) <= 40 for line in lines)
    assert plots._wrap("y" * 30, 40)  # a long word is broken, not dropped


def test_save_png_is_atomic(tmp_path):
    img = plots.line_chart({"a": ([0, 1], [0, 1])}, "t", "x", "y", size=(200, 150))
    path = tmp_path / "sub" / "chart.png"
    plots.save_png(img, path)
    plots.save_png(img, path)  # overwrite in place
    assert os.listdir(tmp_path / "sub") == ["chart.png"]
    with Image.open(path) as back:
        assert back.size == (200, 150)
        assert np.array_equal(np.asarray(back.convert("RGB")), np.asarray(img))


def test_band_chart_and_point_chart():
    band = ([0.0, 1.0, 2.0], [0.2, 0.4, 0.5], [0.1, 0.3, 0.4], [0.3, 0.5, 0.6])
    img = plots.band_chart(
        {"a": band, "empty": ([], [], [], []), "dot": ([1.0], [0.3], [0.3], [0.3])},
        "t",
        "minutes",
        "reward",
        hline=0.45,
        hline_label="target",
    )
    pixels = {c for _, c in img.getcolors(1 << 20)}
    assert plots.PALETTE[0] in pixels and plots.PALETTE[2] in pixels and variance(img) > 0
    with pytest.raises(ValueError, match="different lengths"):
        plots.band_chart({"a": ([0.0], [1.0], [], [])}, "t", "x", "y")
    img = plots.point_chart({"a": (1.0, 2.0), "b": (float("nan"), 1.0), "c": (3.0, 0.5)}, "t", "x", "y")
    pixels = {c for _, c in img.getcolors(1 << 20)}
    assert plots.PALETTE[0] in pixels and plots.PALETTE[2] in pixels
    assert plots.point_chart({}, "t", "x", "y").size == (640, 400)


def test_a_video_grid_draws_each_clip_as_a_strip_of_frames():
    import torch

    from treegrpo_cli.plots import clip_strips, image_grid

    clips = torch.zeros(2, 3, 17, 4, 6)
    for f in range(17):
        clips[:, :, f] = f / 16
    strips = clip_strips(clips)  # 8 evenly spaced frames: 0, 2, 5, 7, 9, 11, 14, 16
    assert strips.shape == (2, 3, 4, 8 * 6)
    firsts = strips[0, 0, 0, ::6] * 16
    assert firsts.round().tolist() == [0, 2, 5, 7, 9, 11, 14, 16]
    grid = image_grid(clips, ["a", "b"], scale=1)
    one = image_grid(strips[:1], ["a"], scale=1)
    assert grid.size[0] == one.size[0] and grid.size[1] == 2 * one.size[1]  # one clip a row


def test_integer_ticks_are_whole_numbers():
    for lo, hi in ((0, 3), (0, 0), (2, 2), (0, 7.5), (0, 1000)):
        a, b, ticks = plots._integer_ticks(lo, hi)
        assert all(t == int(t) for t in ticks) and len(set(ticks)) == len(ticks) >= 2
        assert a <= lo and b >= hi


@pytest.mark.parametrize(
    "lo, hi, want",
    [
        (0, 10.3, [0, 2, 4, 6, 8, 10, 12]),  # not 0..15 by 5: a third of the chart empty
        (0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1]),
        (0, 62, [0, 10, 20, 30, 40, 50, 60, 70]),
        (0.5448, 0.9857, [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
        (-0.17, 0.14, [-0.2, -0.15, -0.1, -0.05, 0, 0.05, 0.1, 0.15]),
    ],
)
def test_nice_ticks_cover_the_values_with_the_tightest_axis(lo, hi, want):
    a, b, ticks = plots._nice_ticks(lo, hi)
    assert ticks == pytest.approx(want) and (a, b) == pytest.approx((want[0], want[-1]))


def reward_run(folder, evals):
    from treegrpo_cli.training import runplots

    rows = [
        {"iteration": i, "reward_mean": 0.3 + 0.04 * i, "reward_std": 0.1, "wall": 20.0 * (i + 1)} for i in range(6)
    ]
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    runplots.reward_plot(folder)
    return Image.open(folder / "reward.png").convert("RGB")


def test_reward_png_has_the_heldout_curves_the_std_band_and_two_titles(tmp_path):
    evals = [
        {"iteration": 0, "wall": 0.0, "reward_mean": 0.3, "raw/reward_mean": 0.3},
        {"iteration": 6, "wall": 130.0, "reward_mean": 0.4, "raw/reward_mean": 0.6},
    ]
    img = reward_run(tmp_path / "ema", evals)
    assert img.size == (2 * 640, 400)
    colours = {c for _, c in img.getcolors(1 << 20)}
    assert {plots.PALETTE[0], plots.PALETTE[1], plots.PALETTE[2]} <= colours  # training, EMA, trained weights
    band = tuple(round(255 + (c - 255) * 60 / 255) for c in plots.PALETTE[0])  # the std band over white
    assert any(all(abs(a - b) <= 2 for a, b in zip(c, band, strict=True)) for c in colours)
    pixels = np.asarray(img)
    assert not np.array_equal(pixels[:20, :640], pixels[:20, 640:])  # each panel its own title
    img = reward_run(tmp_path / "plain", [{"iteration": 0, "reward_mean": 0.3}, {"iteration": 6, "reward_mean": 0.5}])
    colours = {c for _, c in img.getcolors(1 << 20)}
    assert plots.PALETTE[1] in colours and plots.PALETTE[2] not in colours  # no EMA: one held-out curve


def test_before_after_titles_carry_each_sides_heldout_mean(tmp_path, monkeypatch):
    from treegrpo_cli.training import grids

    (tmp_path / "samples").mkdir()
    for step in (0, 3):
        Image.new("RGB", (40, 20), (90, 90, 90)).save(tmp_path / "samples" / f"step-{step}.png")
    (tmp_path / "eval.jsonl").write_text(
        json.dumps({"iteration": 0, "reward_mean": 0.25})
        + "\n"
        + json.dumps({"iteration": 3, "reward_mean": 0.5})
        + "\n"
    )
    titles = []
    monkeypatch.setattr(grids, "headed", lambda image, lines: titles.append(lines) or plots.headed(image, lines))
    assert grids.before_after(tmp_path, 3) == tmp_path / "before_after.png"
    assert titles == [
        ["before: the base model", "held-out mean reward 0.2500"],
        ["after 3 iterations", "held-out mean reward 0.5000"],
    ]
    # a title wider than its picture widens the canvas instead of being cut off
    wide = plots.headed(Image.new("RGB", (10, 10)), ["held-out mean reward -0.7617"])
    assert wide.width > plots._width("held-out mean reward -0.7617")
