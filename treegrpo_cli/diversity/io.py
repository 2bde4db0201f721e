"""Image sets for `treegrpo diversity`: a folder of image files, a folder of videos (GIFs, clip files), or the
leaf images (or clips) of a tree folder.

Both stream their images in chunks (`batches`), so features for thousands of images never need
every image in memory. A tree folder also names the tree of every leaf (`groups`): leaves of one
tree share their early noise, so the permutation test takes one leaf per tree.
`generate_set` rolls out a preset with the rollout library and opens the result.
Every image file's size is checked from its header (preflight.check_image) when a folder is opened,
before any image is decoded.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from ..config import load_config
from ..engine.rollout import Progress
from ..errors import TreegrpoError
from ..preflight import check_image
from ..prompts import load_prompts
from ..store.safeio import contained
from ..store.shards import INDEX, ShardStore
from ..store.trees import open_trees, read_tree_shard
from ..training.sampling import stream_seed
from ..training.stages import RolloutRequest, run_rollout

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
SET_FOLDERS = ("set-a", "set-b")  # under --out with --generate


class ImageSet(ABC):
    """N images of one size, a keep mask over them, and a group id per image."""

    kind = ""

    def __init__(self, source: Path, count: int, groups: Tensor):
        self.source, self.count = Path(source), count
        self.all_groups = groups  # [count] int64
        self.keep = torch.ones(count, dtype=torch.bool)  # [count]

    def __len__(self) -> int:
        return int(self.keep.sum())

    def groups(self) -> Tensor:
        """[len] int64: the group (tree) of every kept image."""
        return self.all_groups[self.keep]

    def keep_first(self, n: int) -> None:
        """Keep only the first n images (in storage order) of those kept."""
        idx = torch.nonzero(self.keep).flatten()
        self.keep[idx[n:]] = False

    def subsample(self, n: int, generator: torch.Generator) -> None:
        """Keep n random images of those kept (all of them when there are no more than n)."""
        idx = torch.nonzero(self.keep).flatten()
        if idx.numel() > n:
            self.keep[:] = False
            self.keep[idx[torch.randperm(idx.numel(), generator=generator)[:n]]] = True

    def describe(self) -> dict:
        return {"source": str(self.source), "kind": self.kind, "images": self.count, "used": len(self)}

    @abstractmethod
    def batches(self, size: int) -> Iterator[Tensor]:
        """Chunks of at most `size` kept images, [b, 3, H, W] uint8."""


class FolderImages(ImageSet):
    """The PNG/JPEG/WebP/BMP files of one folder (not its subfolders), sorted by name; every image
    is converted to RGB and resized (bicubic) to the size of the first one."""

    kind = "images"

    def __init__(self, folder: Path):
        self.files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        for f in self.files:  # a link to a file elsewhere is not read
            contained(folder, f, f"image folder {folder}")
        if not self.files:
            raise TreegrpoError(f"{folder}: no image files ({', '.join(IMAGE_SUFFIXES)}) and no {INDEX}")
        super().__init__(folder, len(self.files), torch.arange(len(self.files)))
        self.size = check_image(self.files[0])
        for f in self.files[1:]:  # every header before any image is decoded
            check_image(f)

    def batches(self, size: int) -> Iterator[Tensor]:
        files = [f for f, k in zip(self.files, self.keep.tolist(), strict=True) if k]
        for a in range(0, len(files), size):
            yield torch.stack([_to_tensor(_read(f), self.size) for f in files[a : a + size]])


class FolderVideos(ImageSet):
    """The videos of one folder, sorted by name: animated GIFs and clip files (.mp4 ...; report/media.py), one
    clip a batch (clips may differ in length and size; each is embedded on its own)."""

    kind = "videos"

    def __init__(self, folder: Path, files: list[Path]):
        from ..report.media import check_media

        self.files = files
        super().__init__(folder, len(files), torch.arange(len(files)))
        for f in files:  # every header before anything is decoded
            check_media(f)

    def batches(self, size: int) -> Iterator[Tensor]:
        from ..report.media import read_media

        for f, k in zip(self.files, self.keep.tolist(), strict=True):
            if k:
                x = read_media(f)  # [3, F, H, W] float in [0, 1]
                yield (x[:, None] if x.dim() == 3 else x)[None]  # [1, 3, F, H, W]


def _videos(folder: Path) -> list[Path]:
    """The GIFs and clip files of a folder (not subfolders: a folder of folders is not read as frame folders)."""
    from ..report.media import CLIP_SUFFIXES

    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix.lower() in (*CLIP_SUFFIXES, ".gif"))
    return [contained(folder, f, f"video folder {folder}") for f in files]


def _read(path: Path) -> Image.Image:
    check_image(path)
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise TreegrpoError(f"{path}: not a readable image ({e})") from None


def _to_tensor(im: Image.Image, size: tuple[int, int]) -> Tensor:
    if im.size != size:
        im = im.resize(size, Image.Resampling.BICUBIC)
    return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)  # [3, H, W] uint8


class TreeImages(ImageSet):
    """The decoded leaf images of a tree folder written by `treegrpo rollout`. Opening reads every
    shard once (checking its sha256) to count leaves and name their trees; `batches` reads them
    again one shard at a time."""

    kind = "trees"

    def __init__(self, folder: Path):
        self.store = open_trees(folder)
        self.shards = self.store.names("trees")
        if not self.shards:
            raise TreegrpoError(f"{folder}: the tree folder holds no tree shards")
        counts, groups = [], []
        for name in self.shards:
            s = read_tree_shard(self.store, name)
            leaves = s.tree.leaves()
            counts.append(int(leaves.numel()))
            groups.append(s.tree_offset + s.tree.tree[leaves])  # [L] global tree id
        self.counts = counts
        super().__init__(folder, sum(counts), torch.cat(groups))

    def batches(self, size: int) -> Iterator[Tensor]:
        start = 0
        for name, n in zip(self.shards, self.counts, strict=True):
            keep = self.keep[start : start + n]
            start += n
            if not keep.any():
                continue
            images = read_tree_shard(self.store, name).leaf_image[keep]  # [k, 3, H, W] uint8
            yield from images.split(size)


def open_images(path: Path) -> ImageSet:
    """A tree folder (it has an index.json) or a folder of image files."""
    path = Path(path)
    if not path.is_dir():
        raise TreegrpoError(f"{path}: no such folder")
    if (path / INDEX).is_file():
        return TreeImages(path)
    videos = _videos(path)
    if videos and not any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.iterdir()):
        return FolderVideos(path, videos)
    return FolderImages(path)


def check_set_folder(path: Path, overwrite: bool, option: str) -> None:
    """Before anything is generated: `path` is new, empty, or (with overwrite) a tree folder with an intact
    index; never someone else's non-empty folder."""
    ShardStore.check_target(Path(path), overwrite, option)


def is_report_folder(folder: Path) -> bool:
    """A folder that holds only what `treegrpo diversity --out` writes (report.json, embedding-*.png,
    set-a/, set-b/ and their temporary files)."""
    return all(
        p.name in ("report.json", *SET_FOLDERS)
        or (p.name.startswith("embedding-") and p.name.endswith(".png"))
        or (p.name.startswith(".") and p.name.endswith(".tmp"))
        for p in Path(folder).iterdir()
    )


def _generate_config(preset: str, model: str, seed: int, sets: tuple[str, ...]):
    return load_config(preset, None, [f'model="{model}"', f"seed={seed}", "tree.init_same_noise=false", *sets])


def generated_trees(preset: str, num: int, model: str = "tiny-shapes", sets: tuple[str, ...] = ()) -> int:
    """How many trees generate_set rolls out for `num` images (known before any model is loaded)."""
    cfg = _generate_config(preset, model, 0, sets)
    per_prompt = cfg.tree.leaves(cfg.sampler.steps) * cfg.tree.trees_per_prompt
    return math.ceil(num / per_prompt) * cfg.tree.trees_per_prompt


def generate_set(
    preset: str,
    out: Path,
    num: int,
    model: str = "tiny-shapes",
    seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
    command: str = "",
    progress: Progress | None = None,
    sets: tuple[str, ...] = (),
) -> ImageSet:
    """Roll out `preset` with `model` on enough prompts for `num` leaves of its tree as written, write the trees to
    `out` and return its first `num` leaf images (fewer where a dynamic rollout ended trees with fewer leaves).

    Prompts are drawn at random (with replacement) from the model's prompt list by the "diversity" seed
    stream (training/sampling.py); the trees are those `train` rolls out at iteration 0 with that seed. Two
    sets generated with different seeds hold i.i.d. trees and the tree permutation test is exact; sets
    that share their prompts make it conservative. Every tree gets its own root noise
    (tree.init_same_noise = false): the training trick would make all images share one. `sets`
    (key=value) override the preset last, e.g. tree.branch_noise="scaled"."""
    cfg = _generate_config(preset, model, seed, sets)
    per_prompt = cfg.tree.leaves(cfg.sampler.steps) * cfg.tree.trees_per_prompt
    pool = load_prompts(cfg.rollout.prompts)
    g = torch.Generator().manual_seed(stream_seed(seed, "diversity"))
    draw = torch.randint(len(pool), (math.ceil(num / per_prompt),), generator=g)
    req = RolloutRequest(
        cfg,
        [pool[i] for i in draw.tolist()],
        Path(out),
        draw.numel(),
        overwrite=overwrite,
        device=device,
        command=command,
    )
    run_rollout(req, lambda phase, done, total: progress(f"{preset}: {phase}", done, total) if progress else None)
    images = TreeImages(Path(out))
    images.keep_first(num)
    return images
