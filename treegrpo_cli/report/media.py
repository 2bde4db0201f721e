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
from ..store.safeio import contained

CLIP_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".avi")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
MAX_FRAMES = 1024  # frames of one video
MAX_VIDEO_BYTES = 4 << 30  # bytes of one video as float32 RGB (frames x height x width x 12)


def check_media(path: Path) -> None:
    """One line when `path` is not a readable image or video within the size limits: every frame's size
    and their total (frames x height x width, as the floats they become) before any frame is decoded."""
    path = Path(path)
    if path.is_dir():
        sizes = [check_image(f) for f in frame_files(path)]
        check_frames(path, len(sizes), max(w * h for w, h in sizes))
    elif path.suffix.lower() in CLIP_SUFFIXES:
        frames, h, w = _clip_header(path)
        check_frames(path, frames, h * w)
    else:
        check_image(path)
        check_frames(path, *_frame_sizes(path))


def check_frames(path: Path, frames: int, pixels: int) -> None:
    """One line when `frames` frames of `pixels` pixels each are more than a video may have here."""
    if frames > MAX_FRAMES:
        raise TreegrpoError(f"{path}: {frames} frames, more than the {MAX_FRAMES} a video may have here")
    need = frames * pixels * 3 * 4  # float32 RGB
    if need > MAX_VIDEO_BYTES:
        raise TreegrpoError(
            f"{path}: {frames} frames of {pixels:,} pixels would take {need / 2**30:.1f} GiB as floats, more than "
            f"the {MAX_VIDEO_BYTES / 2**30:.0f} GiB a video may take here; not decoded"
        )


def _frame_sizes(path: Path) -> tuple[int, int]:
    """(frames, pixels of the largest) of an image file, from its headers: a GIF's frames share its screen
    size; every other format's pages are looked at one by one (a TIFF's may each differ)."""
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # check_frames is the limit, and names the size
    try:
        with Image.open(path) as im:
            n = int(getattr(im, "n_frames", 1))
            if n > MAX_FRAMES:
                return n, 0
            if n == 1 or im.format == "GIF":
                return n, im.size[0] * im.size[1]
            largest = 0
            for k in range(n):
                im.seek(k)
                w, h = im.size
                if w * h > MAX_IMAGE_PIXELS:
                    raise TreegrpoError(f"{path}: frame {k} has {w}x{h} pixels, more than an image may have here")
                largest = max(largest, w * h)
            return n, largest
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        raise TreegrpoError(f"{path}: not a readable image ({e})") from None
    finally:
        Image.MAX_IMAGE_PIXELS = limit


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
    if h * w > MAX_IMAGE_PIXELS or frames > MAX_FRAMES:  # the stream's header; each frame is checked too
        raise TreegrpoError(
            f"{path}: {frames} frames of {w}x{h} pixels, more than a video may have here "
            f"({MAX_FRAMES} frames of at most 4096x4096); not decoded"
        )
    return frames, h, w


def _read_clip(path: Path) -> Tensor:
    av = _av()
    frames: list[Tensor] = []
    try:
        with av.open(str(path)) as box:
            for frame in box.decode(video=0):
                if frame.width * frame.height > MAX_IMAGE_PIXELS:  # its size from the frame, before converting
                    raise TreegrpoError(
                        f"{path}: frame {len(frames)} has {frame.width}x{frame.height} pixels, more than a video "
                        "frame may have here; not decoded further"
                    )
                if frames and (frame.height, frame.width) != tuple(frames[0].shape[1:]):
                    raise TreegrpoError(f"{path}: the frames of a video must all have one size")
                check_frames(path, len(frames) + 1, frame.width * frame.height)
                frames.append(torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1).float() / 255)
    except av.FFmpegError as e:
        raise TreegrpoError(f"{path}: not a readable video ({e})") from None
    if not frames:
        raise TreegrpoError(f"{path}: a video with no frames")
    return _stack(frames, path)
