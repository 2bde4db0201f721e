"""Files of `treegrpo eval`: a folder of images to score, and the results it writes.

An image folder is scored with an image -> prompt map, by default DIR/prompts.json, else
DIR/prompts.csv (or the file given as --prompts). An entry may also be a video: an animated GIF, a folder of
frames or a clip file (.mp4, .webm, .mov; report/media.py), scored frame by frame by the image metrics:
    prompts.json   {"0001.png": "a red circle", "sub/0002.png": "two blue squares", ...}
    prompts.csv    a header row with the columns `image` and `prompt` (others are ignored)
Paths are relative to the folder and stay inside it (no absolute path, no '..', no link that resolves
outside); every listed image must exist and have at most preflight.MAX_IMAGE_PIXELS pixels (checked
from the headers of all of them before any is decoded); unlisted files are ignored.

Outputs under --out DIR:
    results.json          the summary (the same object `--json` prints)
    results.csv           one row per image: source (model | baseline), index, prompt_id, sample or
                          file, prompt, one column per metric
    samples.png           the first 16 images, captioned with their prompt and first metric
    samples-baseline.png  the same for the baseline
A non-empty --out folder must hold only these files (an earlier eval's, which are replaced). results.json,
the record of the others, is removed first and written last: a folder without it is an eval that did not
finish, and the same command replaces it.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import TreegrpoError
from ..plots import image_grid, save_png
from ..store import faults
from ..store.safeio import contained, loads_json, read_text
from ..store.shards import INDEX, atomic_write
from ..store.trees import IMAGES, open_trees
from ..training.sampling import Chunk
from .media import check_media, read_media

GRID_IMAGES = 16  # images in the sample grid of each source
GRID_PIXELS = 128  # grid images are scaled to about this many pixels on their long side
OUTPUTS = ("results.json", "results.csv", "samples.png", "samples-baseline.png")  # what --out gets


@dataclass
class Source:
    """Where one set of images comes from: `chunks()` streams them, `total` counts them."""

    label: str
    total: int
    chunks: Callable[[], Iterator[Chunk]]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scored:
    rows: list[dict[str, Any]]  # per image: its keys, prompt and one column per metric
    scores: dict[str, Tensor]  # metric -> [N] float32
    grid: Tensor | None  # [k <= GRID_IMAGES, 3, H, W] uint8
    grid_captions: list[str]


# --- an image folder -------------------------------------------------------------------------


def prompt_map(folder: Path, given: Path | None = None) -> tuple[Path, list[tuple[Path, str]]]:
    """(the map file, [(image path, prompt)]) of an image folder."""
    path = given or next((folder / n for n in ("prompts.json", "prompts.csv") if (folder / n).is_file()), None)
    if path is None:
        raise TreegrpoError(
            f"{folder}: no prompts.json or prompts.csv mapping image files to prompts "
            "(or pass --prompts MAP.json|MAP.csv)"
        )
    if not path.is_file():
        raise TreegrpoError(f"prompt map not found: {path}")
    if path.suffix == ".json":
        pairs = _json_pairs(path)
    elif path.suffix == ".csv":
        pairs = _csv_pairs(path)
    else:
        raise TreegrpoError(f"{path}: the prompt map of --images must be a .json or .csv file")
    if not pairs:
        raise TreegrpoError(f"{path}: no images listed")
    out = [(_inside(folder, name, path), prompt) for name, prompt in pairs]
    missing = [p for p, _ in out if not (p.is_file() or p.is_dir())]
    if missing:
        raise TreegrpoError(f"{path}: {len(missing)} listed images do not exist (e.g. {missing[0]})")
    return path, out


def _inside(folder: Path, name: str, map_path: Path) -> Path:
    """folder / name for an image path of a prompt map: relative, without '..', resolving inside folder."""
    rel = Path(name)
    if not name or "\x00" in name or rel.is_absolute() or ".." in rel.parts:
        raise TreegrpoError(
            f"{map_path}: {name!r} is outside {folder} (image paths are relative to the folder, without '..')"
        )
    path = folder / rel
    if os.path.lexists(path):  # a missing one is named with the others
        contained(folder, path, f"{map_path}: {name!r}")
        if path.resolve() == folder.resolve():
            raise TreegrpoError(f"{map_path}: {name!r} is the image folder itself, not a file in it")
    return path


def is_eval_output(folder: Path) -> bool:
    """A folder that holds only the files `treegrpo eval --out` writes (and the temporary files of a killed one)."""
    return all(p.name in OUTPUTS or _eval_temp(p.name) for p in folder.iterdir())


def _eval_temp(name: str) -> bool:
    """A temporary file of one of the outputs (atomic_write's `.NAME.XXXXXXXX.tmp`)."""
    return any(name.startswith(f".{o}.") and name.endswith(".tmp") for o in OUTPUTS)


def _json_pairs(path: Path) -> list[tuple[str, str]]:
    text = read_text(path, "prompt map")
    try:
        d = loads_json(text)
    except ValueError:
        raise TreegrpoError(f"{path}: not valid JSON") from None
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise TreegrpoError(f'{path}: expected an object {{"image.png": "prompt", ...}}')
    return sorted(d.items())


def _csv_pairs(path: Path) -> list[tuple[str, str]]:
    text = read_text(path, "prompt map")
    try:
        rows = list(csv.DictReader(io.StringIO(text)))
    except csv.Error as e:
        raise TreegrpoError(f"{path}: not a readable CSV file ({e})") from None
    if rows and not {"image", "prompt"} <= set(rows[0]):
        raise TreegrpoError(f"{path}: expected a header with the columns image and prompt")
    return [(r["image"], r["prompt"]) for r in rows if r.get("image")]


def image_folder(folder: Path, prompts_file: Path | None, batch: int) -> Source:
    """The images of a folder with their prompts, in chunks of at most `batch` images of one size."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TreegrpoError(f"{folder}: no such image folder")
    if prompts_file is None and (folder.parent / INDEX).is_file() and folder.name == IMAGES:
        open_trees(folder.parent, scores=False)  # a rollout's --save-images: refused while its rollout is unfinished
    map_path, pairs = prompt_map(folder, prompts_file)
    for path, _ in pairs:  # every header before any image is decoded or scored
        check_media(path)

    def chunks() -> Iterator[Chunk]:
        pending: list[tuple[Path, str, Tensor]] = []
        for path, prompt in pairs:
            x = read_media(path)  # [3, H, W], or [3, F, H, W] for a video
            if pending and (len(pending) == batch or pending[0][2].shape != x.shape):
                yield _chunk(pending, folder)
                pending = []
            pending.append((path, prompt, x))
        if pending:
            yield _chunk(pending, folder)

    return Source(str(folder), len(pairs), chunks, {"images": str(folder), "prompt_map": str(map_path)})


def _chunk(items: list[tuple[Path, str, Tensor]], folder: Path) -> Chunk:
    return Chunk(
        torch.stack([x for _, _, x in items]),
        [p for _, p, _ in items],
        [{"file": str(path.relative_to(folder))} for path, _, _ in items],
    )


# --- results ---------------------------------------------------------------------------------


def write_outputs(out: Path, summary: dict[str, Any], scored: dict[str, Scored]) -> list[str]:
    """results.json, results.csv and the sample grids under `out`; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").unlink(missing_ok=True)  # the record of the outputs goes first and comes back last
    for p in out.iterdir():
        if _eval_temp(p.name) and p.is_file():  # what a killed eval left
            p.unlink()
    files = [out / "results.json", out / "results.csv"]
    for name, s in scored.items():
        if s.grid is not None:
            path = out / ("samples.png" if name == "model" else f"samples-{name}.png")
            save_png(image_grid(_grid_size(s.grid), s.grid_captions, scale=_scale(s.grid)), path)
            files.append(path)
            faults.point("eval.file")
    atomic_write(out / "results.csv", _csv(scored).encode())
    faults.point("eval.file")
    body = {**summary, "files": [str(f) for f in files]}
    atomic_write(out / "results.json", (json.dumps(body, indent=1) + "\n").encode())
    return [str(f) for f in files]


def _csv(scored: dict[str, Scored]) -> str:
    rows = [{"source": name, **r} for name, s in scored.items() for r in s.rows]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _grid_size(x: Tensor) -> Tensor:
    """Shrink images larger than GRID_PIXELS on their long side (uint8 [k, 3, H, W] in and out; videos
    [k, 3, F, H, W] frame by frame)."""
    h, w = x.shape[-2:]
    if max(h, w) <= GRID_PIXELS:
        return x
    size = (max(1, h * GRID_PIXELS // max(h, w)), max(1, w * GRID_PIXELS // max(h, w)))
    flat = x.float().flatten(1, -3)  # [k, 3 (F), H, W]
    y = F.interpolate(flat, size=size, mode="bilinear", antialias=True, align_corners=False)
    return y.view(*x.shape[:-2], *size).clamp(0, 255).round().to(torch.uint8)


def _scale(x: Tensor) -> int:
    return max(1, GRID_PIXELS // max(x.shape[-2:]))
