"""`treegrpo eval --images` on videos (report/media.py): an animated GIF, a folder of frames and an .mp4 clip beside
a still image, each scored frame by frame by an image metric; sizes checked before decoding; bad videos are one line."""

import csv
import json

import numpy as np
import pytest
import torch
from clitools import one_line_error, run
from PIL import Image

from treegrpo_cli.report.media import read_media
from treegrpo_cli.rewards.base import get_reward, score_batch


def frame(level: int, size=(16, 12)) -> Image.Image:
    """A frame of one grey level with a bright square whose place moves with the level."""
    a = np.full((size[1], size[0], 3), level, np.uint8)
    a[2:6, level % 8 : level % 8 + 4] = 250
    return Image.fromarray(a)


def write_mp4(path, frames):
    import av

    with av.open(str(path), "w") as box:
        stream = box.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for im in frames:
            box.mux(stream.encode(av.VideoFrame.from_image(im)))
        box.mux(stream.encode())


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "media"
    d.mkdir()
    frame(40).save(d / "still.png")
    gif = [frame(v) for v in (20, 60, 100, 140)]
    gif[0].save(d / "clip.gif", save_all=True, append_images=gif[1:], duration=100, loop=0)
    (d / "frames").mkdir()
    for i, v in enumerate((30, 90, 150)):
        frame(v).save(d / "frames" / f"{i:04d}.png")
    write_mp4(d / "clip.mp4", [frame(v) for v in (10, 70, 130, 190, 220)])
    prompts = {"still.png": "a still", "clip.gif": "a gif", "frames": "some frames", "clip.mp4": "an mp4"}
    (d / "prompts.json").write_text(json.dumps(prompts))
    return d


def test_every_kind_of_video_reads_with_its_frames(folder):
    assert read_media(folder / "still.png").shape == (3, 12, 16)
    gif, frames, mp4 = (read_media(folder / n) for n in ("clip.gif", "frames", "clip.mp4"))
    assert gif.shape == (3, 4, 12, 16) and frames.shape == (3, 3, 12, 16) and mp4.shape == (3, 5, 12, 16)
    torch.testing.assert_close(frames[:, 1], torch.from_numpy(np.array(frame(90))).permute(2, 0, 1) / 255)
    grey = mp4[:, :, 8:, :].mean(dim=(0, 2, 3)) * 255  # the background, away from the square: lossy but close
    assert (grey - torch.tensor([10.0, 70, 130, 190, 220])).abs().max() < 6


def test_eval_scores_videos_frame_by_frame(folder, tmp_path):
    out = tmp_path / "ev"
    r = run("eval", "--images", folder, "--metric", "jpeg-compressibility", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    rows = {row["file"]: float(row["jpeg-compressibility"]) for row in csv.DictReader((out / "results.csv").open())}
    assert set(rows) == {"still.png", "clip.gif", "frames", "clip.mp4"}
    jpeg = get_reward("jpeg-compressibility")
    for name, prompt in (("clip.gif", "a gif"), ("frames", "some frames"), ("clip.mp4", "an mp4")):
        x = read_media(folder / name)  # [3, F, H, W]
        per_frame = jpeg(x.transpose(0, 1), [prompt] * x.shape[1])  # each frame as an image
        assert rows[name] == pytest.approx(float(per_frame.mean()), abs=1e-5)
        assert float(score_batch(jpeg, x[None], [prompt])) == pytest.approx(rows[name], abs=1e-5)
    assert (out / "samples.png").is_file()


@pytest.mark.slow
def test_bad_videos_are_one_line(folder, tmp_path):
    (folder / "frames" / "0003.png").write_bytes(b"")  # a frame that is no image
    one_line_error(
        run("eval", "--images", folder, "--metric", "jpeg-compressibility"), "0003.png", "not a readable image"
    )
    (folder / "frames" / "0003.png").unlink()
    frame(5, size=(8, 8)).save(folder / "frames" / "0003.png")  # frames of two sizes
    one_line_error(run("eval", "--images", folder, "--metric", "jpeg-compressibility"), "frames", "one size")
    (folder / "frames" / "0003.png").unlink()
    (folder / "clip.mp4").write_bytes(b"not a video at all")
    one_line_error(
        run("eval", "--images", folder, "--metric", "jpeg-compressibility"), "clip.mp4", "not a readable video"
    )
    (folder / "prompts.json").write_text(json.dumps({"still.png": "a still", "frames": "some frames"}))
    empty = folder / "frames"
    for f in empty.iterdir():
        f.unlink()
    one_line_error(run("eval", "--images", folder, "--metric", "jpeg-compressibility"), "no frames")
