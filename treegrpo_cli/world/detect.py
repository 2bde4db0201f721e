"""A rule-based detector for the shapes world: pixels -> palette classes -> components -> shapes.

Every pixel goes to its nearest palette entry (the 6 colours or the background) when within
COLOUR_TOL of it; pixels far from everything count as background; one hole-filling pass gives a
pixel the colour of at least 3 of its 4 neighbours (robust to pixel noise). Same-colour pixels join into
4-connected components (label propagation with pointer jumping, batched in numpy: no scipy).
Components under MIN_AREA px are dropped; the rest are classified from their bounding box:
    fill = area / box area   square ~1.0, circle ~0.81-0.85, triangle ~0.5
    drop = (pixels below the box's middle row - pixels above it) / area: triangle ~0.5, else ~0
    size = longest box side: 9 px small, 13 px big (threshold BIG_SIDE)
Components that fit no kind (or are too large or too elongated) come back with kind "blob".
Geometry is measured in 32x32 world pixels whatever the image size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from .shapes import BACKGROUND, COLOURS, KINDS, WORLD

COLOUR_NAMES = tuple(COLOURS)
PALETTE = np.array([COLOURS[c] for c in COLOUR_NAMES] + [BACKGROUND], dtype=np.float32) / 255.0  # [7, 3]
COLOUR_TOL = 0.25  # max RGB distance (in [0, 1] units) to the nearest palette entry
MIN_AREA = 5  # world px; smaller components are noise
MAX_SIDE = 20  # world px; larger components are blobs, not shapes
BIG_SIDE = 11.0  # world px; boxes with a longer side are "big"
# each kind's acceptance box: fill in [lo, hi) and drop in (lo, hi); the box's aspect w / h in [lo, hi]
KIND_BOX = {
    "circle": ((0.70, 0.92), (-0.15, 0.15)),
    "square": ((0.92, 9.0), (-0.15, 0.15)),
    "triangle": ((0.35, 0.70), (0.25, 9.0)),
}
ASPECT_BOX = (0.7, 1.45)
SOFT_FILL, SOFT_DROP, SOFT_ASPECT = 0.04, 0.08, 0.15  # how fast a soft fit decays outside the boxes


@dataclass(frozen=True)
class Det:
    colour: str
    kind: str  # "circle" | "square" | "triangle" | "blob"
    size: str  # "small" | "big"
    cx: float  # centroid, world px (x right, y down)
    cy: float
    area: float  # world px
    fits: tuple[float, float, float] = (0.0, 0.0, 0.0)  # soft membership of each of KINDS in [0, 1]

    def fit(self, kind: str) -> float:
        return self.fits[KINDS.index(kind)] if kind in KINDS else 0.0


def classify_pixels(images: Tensor | np.ndarray) -> np.ndarray:
    """[B, 3, H, W] in [0, 1] -> [B, H, W] int8: colour index 0-5, or -1 for background and noise."""
    x = images.detach().float().cpu().numpy() if isinstance(images, Tensor) else np.asarray(images, np.float32)
    px = np.moveaxis(x, 1, -1)  # [B, H, W, 3]
    d2 = ((px[..., None, :] - PALETTE) ** 2).sum(-1)  # [B, H, W, 7]
    near = d2.argmin(-1)
    ok = (np.take_along_axis(d2, near[..., None], -1)[..., 0] <= COLOUR_TOL**2) & (near < len(COLOUR_NAMES))
    return _fill_holes(np.where(ok, near, -1).astype(np.int8))


def _fill_holes(cls: np.ndarray) -> np.ndarray:
    """One pass of hole filling: a pixel with at least 3 of its 4 neighbours of one colour takes that
    colour (mends pixels that noise pushed off their shape's colour; never erases a shape pixel)."""
    pad = np.pad(cls, ((0, 0), (1, 1), (1, 1)), constant_values=-1)
    nbrs = np.stack([pad[:, :-2, 1:-1], pad[:, 2:, 1:-1], pad[:, 1:-1, :-2], pad[:, 1:-1, 2:]])  # [4, B, H, W]
    out = cls.copy()
    for c in range(len(COLOUR_NAMES)):
        out[(nbrs == c).sum(0) >= 3] = c
    return out


def label_components(cls: np.ndarray) -> np.ndarray:
    """[B, H, W] classes -> [B, H, W] int64 labels: the smallest flat index of the pixel's 4-connected
    same-class component, or B*H*W for background."""
    B, H, W = cls.shape
    n = B * H * W
    fg = cls >= 0
    lab = np.where(fg, np.arange(n).reshape(B, H, W), n)
    join_x = fg[:, :, 1:] & (cls[:, :, 1:] == cls[:, :, :-1])  # pixel joined to its right neighbour
    join_y = fg[:, 1:, :] & (cls[:, 1:, :] == cls[:, :-1, :])  # pixel joined to the one below
    while True:
        new = lab.copy()
        m = np.where(join_x, np.minimum(lab[:, :, 1:], lab[:, :, :-1]), n)
        new[:, :, 1:] = np.minimum(new[:, :, 1:], m)
        new[:, :, :-1] = np.minimum(new[:, :, :-1], m)
        m = np.where(join_y, np.minimum(lab[:, 1:, :], lab[:, :-1, :]), n)
        new[:, 1:, :] = np.minimum(new[:, 1:, :], m)
        new[:, :-1, :] = np.minimum(new[:, :-1, :], m)
        flat = np.append(new.ravel(), n)
        new = flat[flat[new]]  # pointer jumping, twice
        if np.array_equal(new, lab):
            return lab
        lab = new


def _component_stats(cls: np.ndarray, lab: np.ndarray) -> dict[str, np.ndarray]:
    """Per component (one row each): image, colour, area, centroid, box, pixels above/below the box middle."""
    b, y, x = np.nonzero(cls >= 0)
    roots, inv = np.unique(lab[b, y, x], return_inverse=True)
    k = len(roots)
    area = np.bincount(inv, minlength=k).astype(np.float64)
    box = np.stack([np.full(k, 1 << 30), np.full(k, 1 << 30), np.full(k, -1), np.full(k, -1)])
    np.minimum.at(box[0], inv, x)
    np.minimum.at(box[1], inv, y)
    np.maximum.at(box[2], inv, x)
    np.maximum.at(box[3], inv, y)
    mid = (box[1] + box[3])[inv]  # twice the middle row
    return {
        "image": roots // (cls.shape[1] * cls.shape[2]),  # a root is its component's first pixel
        "colour": cls.ravel()[roots],
        "area": area,
        "cx": np.bincount(inv, x, minlength=k) / np.maximum(area, 1),
        "cy": np.bincount(inv, y, minlength=k) / np.maximum(area, 1),
        "w": (box[2] - box[0] + 1).astype(np.float64),
        "h": (box[3] - box[1] + 1).astype(np.float64),
        "below": np.bincount(inv, 2 * y > mid, minlength=k),
        "above": np.bincount(inv, 2 * y < mid, minlength=k),
    }


def _box_features(
    area: np.ndarray, w: np.ndarray, h: np.ndarray, below: np.ndarray, above: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fill of the bounding box, drop = share of mass below minus above the centre row, aspect w / h)."""
    return area / (w * h), (below - above) / np.maximum(area, 1), w / h


def classify_kind(area: np.ndarray, w: np.ndarray, h: np.ndarray, below: np.ndarray, above: np.ndarray) -> np.ndarray:
    """Kind names [K] from box width/height and pixel counts, all in world px: the kind whose
    KIND_BOX holds the component, else "blob"."""
    fill, drop, aspect = _box_features(area, w, h, below, above)
    inside = [
        (fill >= f0) & (fill < f1) & (drop > d0) & (drop < d1) for (f0, f1), (d0, d1) in (KIND_BOX[k] for k in KINDS)
    ]
    kind = np.select(inside, list(KINDS), "blob")
    bad = (aspect < ASPECT_BOX[0]) | (aspect > ASPECT_BOX[1]) | (np.maximum(w, h) > MAX_SIDE)
    return np.where(bad, "blob", kind)


def _outside(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.maximum(lo - v, 0) + np.maximum(v - hi, 0)


def kind_fits(area: np.ndarray, w: np.ndarray, h: np.ndarray, below: np.ndarray, above: np.ndarray) -> np.ndarray:
    """[K, 3] soft membership of each component in each of KINDS: 1 inside the kind's box (KIND_BOX,
    ASPECT_BOX), exp(-d^2/2) outside, d the distance to the box in units of SOFT_FILL, SOFT_DROP and
    SOFT_ASPECT; 0 for components larger than MAX_SIDE."""
    fill, drop, aspect = _box_features(area, w, h, below, above)
    d_aspect = _outside(aspect, *ASPECT_BOX) / SOFT_ASPECT
    out = []
    for kind in KINDS:
        (f0, f1), (d0, d1) = KIND_BOX[kind]
        d2 = (_outside(fill, f0, f1) / SOFT_FILL) ** 2 + (_outside(drop, d0, d1) / SOFT_DROP) ** 2 + d_aspect**2
        out.append(np.exp(-d2 / 2))
    return np.where((np.maximum(w, h) > MAX_SIDE)[:, None], 0.0, np.stack(out, 1))


def detect(images: Tensor | np.ndarray) -> list[list[Det]]:
    """[B, 3, H, W] in [0, 1] -> for each image, its shapes (components of >= MIN_AREA world px)."""
    cls = classify_pixels(images)
    B, H, W = cls.shape
    sx, sy = WORLD / W, WORLD / H  # image px -> world px
    s = _component_stats(cls, label_components(cls))
    area, w, h = s["area"] * sx * sy, s["w"] * sx, s["h"] * sy
    keep = area >= MIN_AREA
    below, above = s["below"] * sx * sy, s["above"] * sx * sy
    kind, fits = classify_kind(area, w, h, below, above), kind_fits(area, w, h, below, above)
    big = np.maximum(w, h) > BIG_SIDE
    cx, cy = (s["cx"] + 0.5) * sx - 0.5, (s["cy"] + 0.5) * sy - 0.5
    out: list[list[Det]] = [[] for _ in range(B)]
    for i in np.nonzero(keep)[0]:
        out[int(s["image"][i])].append(
            Det(
                COLOUR_NAMES[int(s["colour"][i])],
                str(kind[i]),
                "big" if big[i] else "small",
                float(cx[i]),
                float(cy[i]),
                float(area[i]),
                (float(fits[i, 0]), float(fits[i, 1]), float(fits[i, 2])),  # one per KINDS
            )
        )
    return out
