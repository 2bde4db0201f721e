"""Figures drawn with Pillow only: line charts, scatter plots, side-by-side panels and captioned image grids.

Every function returns a PIL image; save_png writes one atomically. Non-finite data points are
skipped (a NaN breaks a line into segments), and nothing here prints.
"""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

from .store.shards import atomic_write

PAD = 4  # image_grid: pixels around every image
CAPTION_LINES = 3  # image_grid: the most lines of caption under an image
BACKGROUND = (255, 255, 255)
INK = (40, 40, 40)
GRID = (228, 228, 228)
PALETTE = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)

Series = dict[str, tuple[list[float], list[float]]]


@functools.lru_cache(maxsize=1)
def _font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default()


def _text(s: str) -> str:
    """Pillow's default FreeType font has a 2-pixel space, which reads as no space at its size: two of
    them. The bitmap fallback font (Pillow without FreeType) only encodes latin-1."""
    if isinstance(_font(), ImageFont.FreeTypeFont):
        return s.replace(" ", "  ")
    return s.encode("latin-1", "replace").decode("latin-1")


def _width(s: str) -> float:
    return _font().getlength(_text(s))


def line_height() -> int:
    return int(_font().getbbox("Ag")[3]) + 3


def caption_height() -> int:
    """Pixels reserved for the caption under every image of image_grid."""
    return CAPTION_LINES * line_height() + PAD


# --- line chart --------------------------------------------------------------------------------


def _nice_ticks(lo: float, hi: float, target: int = 5) -> tuple[float, float, list[float]]:
    """(axis low, axis high, ticks) with a 1/2/5 x 10^k step that covers [lo, hi]: of the steps that give at most
    target + 2 intervals, the one whose axis is tightest (0 to 10.3 runs 0 to 12 by 2, not 0 to 15 by 5)."""
    if hi - lo <= 0:
        d = abs(lo) * 0.05 or 1.0
        lo, hi = lo - d, hi + d
    mag = 10 ** math.floor(math.log10((hi - lo) / target))
    best: tuple[float, int, int] | None = None
    for step in (m * mag for m in (1, 2, 5, 10, 20)):
        a, b = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
        if b - a <= target + 2 and (best is None or (b - a) * step < (best[2] - best[1]) * best[0] - 1e-12):
            best = (step, a, b)
    assert best is not None  # 20 x mag gives at most target / 2 + 2 intervals
    step, a, b = best
    return a * step, b * step, [i * step for i in range(a, b + 1)]


def _integer_ticks(lo: float, hi: float, target: int = 5) -> tuple[float, float, list[float]]:
    """_nice_ticks on whole numbers only (iterations): a step of at least 1, no tick between two integers."""
    lo, hi = math.floor(lo), math.ceil(hi)
    hi = max(hi, lo + 1)
    a, b, ticks = _nice_ticks(lo, hi, target)
    if ticks[1] - ticks[0] >= 1:
        return a, b, ticks
    return lo, hi, [float(v) for v in range(lo, hi + 1)]


def _fmt(v: float, step: float) -> str:
    if abs(v) < step * 1e-6:
        v = 0.0
    if abs(v) >= 1e6 or step < 1e-5:
        return f"{v:.3g}"
    return f"{v:.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"


def _finite(xs: list[float], ys: list[float]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive points where both coordinates are finite."""
    runs: list[list[tuple[float, float]]] = []
    cur: list[tuple[float, float]] = []
    for x, y in zip(xs, ys, strict=True):
        if math.isfinite(float(x)) and math.isfinite(float(y)):
            cur.append((float(x), float(y)))
        elif cur:
            runs, cur = runs + [cur], []
    return runs + [cur] if cur else runs


def _legend(draw: ImageDraw.ImageDraw, names: list[str], left: int, right: int, top: int) -> int:
    """Legend entries in rows from (left, top); returns the y below the legend."""
    x, y, lh = left, top, line_height()
    for i, name in enumerate(names):
        w = 18 + _width(name) + 14
        if x > left and x + w > right:
            x, y = left, y + lh
        colour = PALETTE[i % len(PALETTE)]
        draw.line([(x, y + lh // 2), (x + 14, y + lh // 2)], fill=colour, width=3)
        draw.text((x + 18, y), _text(name), fill=INK, font=_font())
        x += int(w)
    return y + lh if names else top


def _ylabel(img: Image.Image, label: str, x: int, ymid: int) -> None:
    tw, lh = int(_width(label)) + 2, line_height()
    strip = Image.new("RGB", (max(tw, 1), lh), BACKGROUND)
    ImageDraw.Draw(strip).text((0, 0), _text(label), fill=INK, font=_font())
    strip = strip.rotate(90, expand=True)
    img.paste(strip, (x, max(0, ymid - strip.height // 2)))


def _axes(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], xt: tuple, yt: tuple) -> None:
    """Grid lines, frame and tick labels; xt and yt are _nice_ticks results."""
    left, top, right, bottom = box
    lh = line_height()
    for v in xt[2]:
        px = left + (v - xt[0]) / (xt[1] - xt[0]) * (right - left)
        draw.line([(px, top), (px, bottom)], fill=GRID)
        s = _fmt(v, xt[2][1] - xt[2][0])
        draw.text((px - _width(s) / 2, bottom + 4), _text(s), fill=INK, font=_font())
    for v in yt[2]:
        py = bottom - (v - yt[0]) / (yt[1] - yt[0]) * (bottom - top)
        draw.line([(left, py), (right, py)], fill=GRID)
        s = _fmt(v, yt[2][1] - yt[2][0])
        draw.text((left - 5 - _width(s), py - lh / 2), _text(s), fill=INK, font=_font())
    draw.rectangle(box, outline=INK)


def _chart(size: tuple[int, int], title: str, names: list[str], xlabel: str, ylabel: str, xt: tuple, yt: tuple):
    """A blank chart: title, legend of `names`, axes with ticks xt/yt (_nice_ticks results) and labels.
    Returns the image, an RGBA draw on it and at(x, y) -> pixel position of a data point."""
    img = Image.new("RGB", size, BACKGROUND)
    draw = ImageDraw.Draw(img, "RGBA")
    w, h, lh = size[0], size[1], line_height()
    draw.text(((w - _width(title)) / 2, 6), _text(title), fill=INK, font=_font())
    ywidth = max(_width(_fmt(v, yt[2][1] - yt[2][0])) for v in yt[2])
    left, right = int(8 + lh + 6 + ywidth + 6), w - 14
    top = _legend(draw, names, left, right, 6 + lh + 4) + 6
    bottom = max(h - (8 + lh + 4 + lh + 4), top + 1)
    _axes(draw, (left, top, right, bottom), xt, yt)
    draw.text(((left + right - _width(xlabel)) / 2, h - 8 - lh), _text(xlabel), fill=INK, font=_font())
    _ylabel(img, ylabel, 8, (top + bottom) // 2)

    def at(x: float, y: float) -> tuple[float, float]:
        return (
            left + (x - xt[0]) / (xt[1] - xt[0]) * (right - left),
            bottom - (y - yt[0]) / (yt[1] - yt[0]) * (bottom - top),
        )

    return img, draw, at


def line_chart(
    series: Series,
    title: str,
    xlabel: str,
    ylabel: str,
    size: tuple[int, int] = (640, 400),
    integer_x: bool = False,
    y_span: tuple[float, float] | None = None,
) -> Image.Image:
    """One line per series (NaN points skipped), with ticks, axis labels, a title and a legend; integer_x: ticks
    on whole numbers only (iterations); y_span: the y axis covers at least this span (a share: 0 to 1)."""
    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r} has {len(xs)} x values and {len(ys)} y values")
    runs = {name: _finite(xs, ys) for name, (xs, ys) in series.items()}
    pts = [p for rs in runs.values() for r in rs for p in r]
    ticks = _integer_ticks if integer_x else _nice_ticks
    xt = ticks(min((p[0] for p in pts), default=0.0), max((p[0] for p in pts), default=1.0))
    ys = [p[1] for p in pts] + list(y_span or ())
    yt = _nice_ticks(min(ys, default=0.0), max(ys, default=1.0))
    img, draw, at = _chart(size, title, list(series), xlabel, ylabel, xt, yt)
    for i, rs in enumerate(runs.values()):
        _polyline(draw, [[at(*p) for p in r] for r in rs], PALETTE[i % len(PALETTE)])
    return img


def _polyline(draw: ImageDraw.ImageDraw, runs: list[list[tuple[float, float]]], colour) -> None:
    """Each run of pixel points as a line (a lone point as a dot)."""
    for xy in runs:
        if len(xy) == 1:
            draw.ellipse([xy[0][0] - 3, xy[0][1] - 3, xy[0][0] + 3, xy[0][1] + 3], fill=colour)
        else:
            draw.line(xy, fill=colour, width=2, joint="curve")


Band = tuple[list[float], list[float], list[float], list[float]]  # x, mean, low, high


def _dashed(draw: ImageDraw.ImageDraw, a: tuple[float, float], b: tuple[float, float], dash: int = 6) -> None:
    """A horizontal dashed line from a to b (same y)."""
    x = a[0]
    while x < b[0]:
        draw.line([(x, a[1]), (min(x + dash, b[0]), a[1])], fill=INK, width=1)
        x += 2 * dash


def band_chart(
    bands: dict[str, Band],
    title: str,
    xlabel: str,
    ylabel: str,
    hline: float | None = None,
    hline_label: str = "target",
    size: tuple[int, int] = (640, 400),
    marks: dict[str, list[tuple[float, float]]] | None = None,
    integer_x: bool = False,
) -> Image.Image:
    """One mean line per series over its shaded low-high band (e.g. min-max over seeds), an optional
    dashed horizontal line (a target) labelled hline_label, and optional marks: a ring at each measured
    (x, y) of a series (the line between two marks is drawn, not measured); integer_x: whole-number x ticks."""
    for name, b in bands.items():
        if len({len(v) for v in b}) != 1:
            raise ValueError(f"band {name!r} has x, mean, low and high of different lengths")
    marks = marks or {}
    xs = [x for b in bands.values() for x in b[0] if math.isfinite(x)]
    xs += [x for m in marks.values() for x, _ in m if math.isfinite(x)]
    ys = [y for b in bands.values() for v in b[1:] for y in v if math.isfinite(y)]
    ys += [y for m in marks.values() for _, y in m if math.isfinite(y)]
    ys += [hline] if hline is not None and math.isfinite(hline) else []
    xt = (_integer_ticks if integer_x else _nice_ticks)(min(xs, default=0.0), max(xs, default=1.0))
    yt = _nice_ticks(min(ys, default=0.0), max(ys, default=1.0))
    img, draw, at = _chart(size, title, list(bands), xlabel, ylabel, xt, yt)
    if hline is not None and math.isfinite(hline):
        (x0, y), (x1, _) = at(xt[0], hline), at(xt[1], hline)
        _dashed(draw, (x0, y), (x1, y))
        draw.text((x1 - 4 - _width(hline_label), y - line_height()), _text(hline_label), fill=INK, font=_font())
    for i, (x, mean, low, high) in enumerate(bands.values()):
        colour = PALETTE[i % len(PALETTE)]
        keep = [k for k in range(len(x)) if all(math.isfinite(v[k]) for v in (x, low, high))]
        if len(keep) > 1 and any(low[k] != high[k] for k in keep):
            draw.polygon(
                [at(x[k], high[k]) for k in keep] + [at(x[k], low[k]) for k in reversed(keep)], fill=colour + (60,)
            )
        _polyline(draw, [[at(*p) for p in r] for r in _finite(x, mean)], colour)
    for i, name in enumerate(bands):
        for mx, my in marks.get(name, []):
            if math.isfinite(mx) and math.isfinite(my):
                px, py = at(mx, my)
                draw.ellipse([px - 3, py - 3, px + 3, py + 3], outline=PALETTE[i % len(PALETTE)], width=1)
    return img


def point_chart(
    points: dict[str, tuple[float, float]], title: str, xlabel: str, ylabel: str, size: tuple[int, int] = (640, 400)
) -> Image.Image:
    """One labelled dot per name, in palette order (non-finite points skipped)."""
    ok = {n: p for n, p in points.items() if all(math.isfinite(float(v)) for v in p)}
    xt, yt = (_padded_ticks([p[k] for p in ok.values()]) for k in (0, 1))
    img, draw, at = _chart(size, title, list(points), xlabel, ylabel, xt, yt)
    for i, name in enumerate(points):
        if name in ok:
            px, py = at(*ok[name])
            draw.ellipse([px - 5, py - 5, px + 5, py + 5], fill=PALETTE[i % len(PALETTE)])
            left = px > (at(xt[0], 0)[0] + at(xt[1], 0)[0]) / 2  # labels point inwards
            tx = px - 8 - _width(name) if left else px + 8
            draw.text((tx, py - line_height() / 2), _text(name), fill=INK, font=_font())
    return img


def _padded_ticks(values: list[float]) -> tuple[float, float, list[float]]:
    """_nice_ticks over the values widened by a tenth of their span, so that no point sits on the frame."""
    lo, hi = min(values, default=0.0), max(values, default=1.0)
    d = (hi - lo) * 0.1 or abs(lo) * 0.05 or 1.0
    return _nice_ticks(lo - d, hi + d)


def scatter(
    xy: Tensor, is_a: Tensor, names: list[str], title: str, xlabel: str, ylabel: str, size: tuple[int, int] = (640, 480)
) -> Image.Image:
    """Points xy [N, 2], set A (is_a [N] bool) in the first palette colour and B in the second, half
    transparent and drawn in a shuffled (seeded) order so that neither set hides the other."""
    xt = _nice_ticks(float(xy[:, 0].min()), float(xy[:, 0].max()))
    yt = _nice_ticks(float(xy[:, 1].min()), float(xy[:, 1].max()))
    img, draw, at = _chart(size, title, names, xlabel, ylabel, xt, yt)
    r = 2 if xy.shape[0] > 500 else 3
    for i in torch.randperm(xy.shape[0], generator=torch.Generator().manual_seed(0)).tolist():
        px, py = at(float(xy[i, 0]), float(xy[i, 1]))
        draw.ellipse([px - r, py - r, px + r, py + r], fill=PALETTE[0 if is_a[i] else 1] + (140,))
    return img


# --- panels and grids --------------------------------------------------------------------------


def side_by_side(images: list[Image.Image]) -> Image.Image:
    """The images left to right, top-aligned, on a white canvas as tall as the tallest."""
    if not images:
        raise ValueError("side_by_side needs at least one image")
    out = Image.new("RGB", (sum(i.width for i in images), max(i.height for i in images)), BACKGROUND)
    x = 0
    for im in images:
        out.paste(im.convert("RGB"), (x, 0))
        x += im.width
    return out


def titled(image: Image.Image, title: str) -> Image.Image:
    """The image under a one-line title, with a white margin on its right."""
    out = Image.new("RGB", (image.width + 4 * PAD, image.height + line_height() + 4 * PAD), BACKGROUND)
    ImageDraw.Draw(out).text((PAD, PAD), _text(title), fill=INK, font=_font())
    out.paste(image.convert("RGB"), (0, line_height() + 3 * PAD))
    return out


def _wrap(caption: str, width: int) -> list[str]:
    """Greedy word wrap to `width` pixels (long words broken), at most CAPTION_LINES lines."""
    lines: list[str] = []
    for word in caption.split():
        cur = f"{lines[-1]} {word}" if lines else word
        if lines and _width(cur) <= width:
            lines[-1] = cur
            continue
        while _width(word) > width and len(word) > 1:
            cut = 1
            while _width(word[: cut + 1]) <= width:
                cut += 1
            lines.append(word[:cut])
            word = word[cut:]
        lines.append(word)
    if len(lines) > CAPTION_LINES:
        last = lines[CAPTION_LINES - 1]
        while last and _width(last + "...") > width:
            last = last[:-1]
        lines = lines[: CAPTION_LINES - 1] + [last + "..."]
    return lines


STRIP_FRAMES = 8  # frames of a clip drawn in a sample grid


def _to_uint8(images: Tensor) -> Tensor:
    """[B, H, W, 3] uint8 from [B, 3 or 1, H, W] float in [0, 1] or uint8."""
    x = images.detach().cpu()
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"image_grid expects images [B, 3, H, W]; got {tuple(x.shape)}")
    if x.dtype != torch.uint8:
        x = (torch.nan_to_num(x.float(), nan=0.0).clamp(0, 1) * 255).round().to(torch.uint8)
    return x.expand(-1, 3, -1, -1).permute(0, 2, 3, 1).contiguous()


def clip_strips(videos: Tensor, frames: int = STRIP_FRAMES) -> Tensor:
    """[B, 3, F, H, W] -> [B, 3, H, F' W]: each clip as a strip of up to `frames` evenly spaced frames, first and
    last included, left to right."""
    F = videos.shape[2]
    keep = torch.linspace(0, F - 1, min(frames, F)).round().long()
    x = videos[:, :, keep]  # [B, 3, F', H, W]
    return x.permute(0, 1, 3, 2, 4).reshape(x.shape[0], x.shape[1], x.shape[3], -1)


def image_grid(images: Tensor, captions: list[str], ncol: int | None = None, scale: int = 4) -> Image.Image:
    """A captioned grid: every image upscaled by `scale` (nearest), ncol default ceil(sqrt(B)); videos
    [B, 3, F, H, W] as clip strips, one clip a row by default."""
    if images.dim() == 5:
        images, ncol = clip_strips(images), ncol or 1
    pix = _to_uint8(images)
    b, h, w = pix.shape[0], pix.shape[1] * scale, pix.shape[2] * scale
    if b == 0 or len(captions) != b:
        raise ValueError(f"image_grid needs one caption per image; got {b} images, {len(captions)} captions")
    if scale < 1 or (ncol is not None and ncol < 1):
        raise ValueError("image_grid needs scale >= 1 and ncol >= 1")
    ncol = min(ncol or math.ceil(math.sqrt(b)), b)
    nrow = math.ceil(b / ncol)
    cw, ch = w + 2 * PAD, h + 2 * PAD + caption_height()
    out = Image.new("RGB", (ncol * cw, nrow * ch), BACKGROUND)
    draw = ImageDraw.Draw(out)
    for k in range(b):
        x, y = (k % ncol) * cw, (k // ncol) * ch
        im = Image.fromarray(pix[k].numpy(), "RGB").resize((w, h), Image.Resampling.NEAREST)
        out.paste(im, (x + PAD, y + PAD))
        for j, line in enumerate(_wrap(captions[k], w)):
            draw.text((x + PAD, y + 2 * PAD + h + j * line_height()), _text(line), fill=INK, font=_font())
    return out


def save_png(image: Image.Image, path: str | Path) -> None:
    """Write a PNG atomically: a temporary file in the same folder, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    atomic_write(path, buf.getvalue())


def headed(image: Image.Image, lines: list[str]) -> Image.Image:
    """The image under title lines, the canvas widened (white on the right) so that the longest line fits."""
    lh = line_height()
    width = max([image.width, *(int(_width(line)) + 2 * PAD for line in lines)]) + 4 * PAD
    out = Image.new("RGB", (width, image.height + len(lines) * lh + 4 * PAD), BACKGROUND)
    draw = ImageDraw.Draw(out)
    for k, line in enumerate(lines):
        draw.text((PAD, PAD + k * lh), _text(line), fill=INK, font=_font())
    out.paste(image.convert("RGB"), (0, len(lines) * lh + 3 * PAD))
    return out
