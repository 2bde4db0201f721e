"""Reading what `eval --images` scores: an image, or a video as an animated GIF, a folder of frames, or a clip file.

    image            .png .jpg ... (anything Pillow opens)      -> [3, H, W]
    animated GIF     every frame, through Pillow                -> [3, F, H, W]
    frame folder     its images in name order (0001.png, ...)   -> [3, F, H, W]
    clip file        .mp4 .webm .mov .mkv .avi, through PyAV    -> [3, F, H, W]

PyAV (the `video` extra) decodes clip files: it binds FFmpeg's libraries in-process, ships them in its
wheels (no system FFmpeg, no subprocess), decodes frame by frame, and is what torchvision's own video reader
uses; GIFs and frame folders need nothing beyond Pillow. Sizes are checked before anything is decoded: at
most MAX_FRAMES frames of at most preflight.MAX_IMAGE_PIXELS pixels each (a clip's from its stream header).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageSequence, UnidentifiedImageError
from torch import Tensor

from ..errors import TreegrpoError
from ..preflight import MAX_IMAGE_PIXELS, check_image
from ..safeio import contained

CLIP_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".avi")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
MAX_FRAMES = 1024  # frames of one video


def check_media(path: Path) -> None:
    """One line when `path` is not a readable image or video within the size limits; nothing is decoded."""
    path = Path(path)
    if path.is_dir():
        frames = frame_files(path)
        for f in frames:
            check_image(f)
    elif path.suffix.lower() in CLIP_SUFFIXES:
        _clip_header(path)
    else:
        check_image(path)
        with Image.open(path) as im:
            n = int(getattr(im, "n_frames", 1))
        if n > MAX_FRAMES:
            raise TreegrpoError(f"{path}: {n} frames, more than the {MAX_FRAMES} a video may have here")


def read_media(path: Path) -> Tensor:
    """[3, H, W] for an image, [3, F, H, W] for a video; float in [0, 1]."""
    path = Path(path)
    check_media(path)
    if path.is_dir():
        return _stack([_rgb(Image.open(f), f) for f in frame_files(path)], path)
    if path.suffix.lower() in CLIP_SUFFIXES:
        return _read_clip(path)
    try:
        with Image.open(path) as im:
            if getattr(im, "n_frames", 1) > 1:
                return _stack([_rgb(frame, path) for frame in ImageSequence.Iterator(im)], path)
            return _rgb(im, path)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise TreegrpoError(f"{path}: not a readable image ({e})") from None


def frame_files(folder: Path) -> list[Path]:
    """A frame folder's images in name order; one line when it holds none or too many."""
    frames = sorted(p for p in folder.iterdir() if p.suffix.lower() in FRAME_SUFFIXES and p.is_file())
    for f in frames:  # a frame that is a link to a file elsewhere is not read
        contained(folder, f, f"frame folder {folder}")
    if not frames:
        raise TreegrpoError(f"{folder}: a frame folder with no frames ({', '.join(FRAME_SUFFIXES)})")
    if len(frames) > MAX_FRAMES:
        raise TreegrpoError(f"{folder}: {len(frames)} frames, more than the {MAX_FRAMES} a video may have here")
    return frames


def _rgb(im: Image.Image, path: Path) -> Tensor:
    try:
        arr = np.asarray(im.convert("RGB")).copy()
    except (OSError, ValueError, SyntaxError) as e:
        raise TreegrpoError(f"{path}: not a readable image ({e})") from None
    return torch.from_numpy(arr).permute(2, 0, 1).float() / 255  # [3, H, W]


def _stack(frames: list[Tensor], path: Path) -> Tensor:
    if len({f.shape for f in frames}) > 1:
        raise TreegrpoError(f"{path}: the frames of a video must all have one size")
    return torch.stack(frames, dim=1)  # [3, F, H, W]


def _av():
    try:
        import av
    except ImportError:
        raise TreegrpoError(
            "reading .mp4/.webm/.mov clips needs PyAV: pip install 'treegrpo[video]' (or give GIFs or frame folders)"
        ) from None
    return av


def _clip_header(path: Path) -> tuple[int, int, int]:
    """(frames, height, width) of a clip file's first video stream, from its header."""
    av = _av()
    try:
        with av.open(str(path)) as box:
            stream = next(s for s in box.streams if s.type == "video")
            frames, h, w = int(stream.frames or 0), int(stream.codec_context.height), int(stream.codec_context.width)
    except (av.FFmpegError, StopIteration, OSError, ValueError) as e:
        raise TreegrpoError(f"{path}: not a readable video ({type(e).__name__}: {e})") from None
    if h * w > MAX_IMAGE_PIXELS or frames > MAX_FRAMES:
        raise TreegrpoError(
            f"{path}: {frames} frames of {w}x{h} pixels, more than a video may have here "
            f"({MAX_FRAMES} frames of at most 4096x4096); not decoded"
        )
    return frames, h, w


def _read_clip(path: Path) -> Tensor:
    av = _av()
    frames = []
    try:
        with av.open(str(path)) as box:
            for frame in box.decode(video=0):
                frames.append(torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1).float() / 255)
                if len(frames) > MAX_FRAMES:
                    raise TreegrpoError(f"{path}: more than the {MAX_FRAMES} frames a video may have here")
    except av.FFmpegError as e:
        raise TreegrpoError(f"{path}: not a readable video ({e})") from None
    if not frames:
        raise TreegrpoError(f"{path}: a video with no frames")
    return _stack(frames, path)
