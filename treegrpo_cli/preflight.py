"""Checks that run before any work: the device exists, an output folder can be written (and is not
someone else's non-empty folder), an image file is no larger than MAX_IMAGE_PIXELS (read from its header).

Each raises TreegrpoError with one line naming the offending value; none of them creates anything.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from .errors import TreegrpoError


def resolve_device(device: str) -> str:
    """--device as a torch device string: 'auto' is cuda:LOCAL_RANK (0 outside torchrun) when torch sees a GPU,
    else mps where a probe of the ops the engine uses runs, else cpu; 'cuda' under a launcher is the process's
    own GPU; anything else is checked as given (check_device)."""
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if device == "auto":
        if torch.cuda.is_available():
            return str(check_device(f"cuda:{local}"))
        return "mps" if _mps_works() else "cpu"
    if device == "cuda" and "LOCAL_RANK" in os.environ and torch.cuda.is_available():
        return f"cuda:{local}"
    return str(check_device(device))


def _mps_works() -> bool:
    """MPS is there and runs what the sampler runs (seeded normals, fp32 matmuls); else auto takes the CPU."""
    if not torch.backends.mps.is_available():
        return False
    try:
        gen = torch.Generator(device="mps").manual_seed(0)
        x = torch.randn(4, 4, device="mps", generator=gen)
        return bool(torch.isfinite(x @ x.T).all())
    except (RuntimeError, TypeError):
        return False


def check_device(device: str) -> torch.device:
    """A torch device that exists on this machine ('auto' resolved first)."""
    if device == "auto":
        return torch.device(resolve_device(device))
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise TreegrpoError(f"--device {device!r} is not a torch device (auto, cpu, cuda, cuda:1, mps, ...)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise TreegrpoError(
                f"--device {device}: this machine has no CUDA device (torch {torch.__version__}, "
                f"CUDA build {torch.version.cuda or 'none'}); use --device cpu (or auto)"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise TreegrpoError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise TreegrpoError(f"--device {device}: MPS is not available on this machine; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise TreegrpoError(f"--device {device}: unsupported device type {dev.type!r} (cpu, cuda or mps)")
    return dev


def check_writable_dir(path: Path, option: str) -> None:
    """`path` is a folder or can become one, and its nearest existing ancestor accepts new files."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TreegrpoError(f"{option} {path} exists and is not a folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise TreegrpoError(f"{option} {path}: {probe} is a file, not a folder")
    if not _accepts_files(probe):
        raise TreegrpoError(f"{option} {path}: cannot write under {probe} (permission denied or read-only)")


def _accepts_files(folder: Path) -> bool:
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:  # root ignores permission bits; a read-only mount does not
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_own_dir(path: Path, option: str, own: Callable[[Path], bool], what: str) -> None:
    """Never write into a non-empty folder the tool did not write (as `export` refuses): `path` is absent,
    empty, or `own(path)` says it is `what` (the command's own outputs, which it may replace)."""
    path = Path(path)
    try:
        foreign = path.is_dir() and any(p.name != ".lock" for p in path.iterdir()) and not own(path)  # a writer's lock
    except OSError as e:
        raise TreegrpoError(f"{option} {path}: cannot list it ({e.strerror or e})") from None
    if foreign:
        raise TreegrpoError(f"{option} {path} is not empty and is not {what}; choose a new or empty folder")


MAX_IMAGE_PIXELS = 4096 * 4096  # 2**24: larger image files are refused from their header, never decoded


def check_image(path: Path) -> tuple[int, int]:
    """(width, height) of an image file, read from its header without decoding it; one line when it is not
    a readable image or has more than MAX_IMAGE_PIXELS pixels (a decompression bomb)."""
    from PIL import Image, UnidentifiedImageError

    if not Path(path).is_file():
        raise TreegrpoError(f"{path}: not a regular file")
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # this check is stricter than Pillow's, and names the size
    try:
        with Image.open(path) as im:
            width, height = im.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise TreegrpoError(f"{path}: not a readable image ({e})") from None
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if width * height > MAX_IMAGE_PIXELS:
        raise TreegrpoError(
            f"{path}: {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS} (4096x4096) an image may have here; "
            "not decoded"
        )
    return width, height
