"""Hostile files, round four: links one level down a folder the tool reads, text that would drive the terminal
or read as rich markup, JSON and TOML nested past any sense, and media whose headers pass and whose frames
explode. Each: one line and a non-zero exit (or, for names that are only odd, a run that works)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from clitools import PIXEL, bomb_png, one_line_error, run
from PIL import Image

from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.models.wan import first_frames
from treegrpo_cli.report.compare import latest_sample
from treegrpo_cli.report.media import check_media

FAST = [*PIXEL, "--set", "rollout.num_prompts=2", "--set", "train.eval_samples=0", "--set", "train.sample_every=1"]
DEEP = "[" * 100_000 + "]" * 100_000


def png(path: Path, size: int = 8, level: int = 90) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), (level, 255 - level, 30)).save(path)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tree folder and a finished one-iteration run (with sample grids)."""
    d = tmp_path_factory.mktemp("hostile-files")
    r = run("rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", d / "trees")
    assert r.exit_code == 0, r.output
    r = run("train", *FAST, "--preset", "branch", "--iterations", 1, "--run-dir", d / "run")
    assert r.exit_code == 0, r.output
    return d


def _copy(world: Path, tmp_path: Path, name: str) -> Path:
    shutil.copytree(world / name, tmp_path / name, symlinks=True)
    return tmp_path / name


# --- links one level down stay inside ---------------------------------------------------------------------


@pytest.mark.slow
def test_eval_refuses_a_frame_that_links_outside_its_folder(tmp_path):
    secret = png(tmp_path / "elsewhere" / "secret.png", level=200)
    folder = tmp_path / "imgs"
    png(folder / "clip" / "0000.png")
    os.symlink(secret, folder / "clip" / "0001.png")
    (folder / "prompts.json").write_text(json.dumps({"clip": "a red circle"}))
    r = run("eval", "--images", folder, "--metric", "jpeg-compressibility", "--out", tmp_path / "out")
    one_line_error(r, "0001.png", "resolves outside")
    assert not (tmp_path / "out" / "samples.png").exists()


def test_eval_refuses_a_frame_two_levels_down_that_links_outside(tmp_path):
    secret = png(tmp_path / "elsewhere" / "secret.png", level=200)
    folder = tmp_path / "imgs"
    png(folder / "a" / "clip" / "0000.png")
    os.symlink(secret, folder / "a" / "clip" / "0001.png")
    (folder / "prompts.json").write_text(json.dumps({"a/clip": "a red circle"}))
    one_line_error(run("eval", "--images", folder, "--metric", "jpeg-compressibility"), "resolves outside")


def test_a_frame_linking_inside_its_folder_is_read(tmp_path):
    folder = tmp_path / "clip"
    png(folder / "0000.png")
    os.symlink(folder / "0000.png", folder / "0001.png")
    check_media(folder)


def test_diversity_refuses_an_image_that_links_outside_its_folder(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for i in range(3):
        png(a / f"{i}.png", level=40 * i)
        png(b / f"{i}.png", level=40 * i + 5)
    os.symlink(png(tmp_path / "secret" / "s.png", level=250), a / "9.png")
    r = run("diversity", a, b, "--features", "pixels", "--kid-subsets", 2, "--permutations", 0)
    one_line_error(r, "9.png", "resolves outside")


def test_diversity_refuses_a_gif_that_links_outside_its_folder(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        frames = [Image.new("RGB", (8, 8), (v, 0, 0)) for v in (10, 90)]
        frames[0].save(folder / "0.gif", save_all=True, append_images=frames[1:])
    shutil.copy(a / "0.gif", tmp_path / "secret.gif")
    os.symlink(tmp_path / "secret.gif", a / "1.gif")
    r = run("diversity", a, b, "--features", "pixels", "--kid-subsets", 2, "--permutations", 0)
    one_line_error(r, "1.gif", "resolves outside")


@pytest.mark.slow
def test_compare_never_embeds_a_sample_grid_that_links_outside_the_run(world, tmp_path):
    run_dir = _copy(world, tmp_path, "run")
    secret = png(tmp_path / "secret.png", level=7)
    os.symlink(secret, run_dir / "samples" / "step-99.png")
    with pytest.raises(TreegrpoError, match="resolves outside"):
        latest_sample(run_dir)
    r = run("compare", run_dir, "--out", tmp_path / "cmp")
    one_line_error(r, "step-99.png", "resolves outside")
    assert not (tmp_path / "cmp" / "index.html").exists()


def test_policy_images_refuses_a_relative_image_that_links_outside(tmp_path):
    os.symlink(png(tmp_path / "secret.png"), tmp_path / "frames" / "0.png") if (
        tmp_path / "frames"
    ).mkdir() is None else None
    rows = tmp_path / "frames" / "clips.jsonl"
    rows.write_text(json.dumps({"prompt": "a bird", "image": "0.png"}) + "\n")
    with pytest.raises(TreegrpoError, match="resolves outside"):
        first_frames(str(rows), "wan-i2v")


@pytest.mark.parametrize("side", [20000, 11000])
def test_policy_images_refuses_an_image_too_large_before_decoding_it(tmp_path, side):
    bomb_png(tmp_path / "big.png", side, side)
    rows = tmp_path / "clips.jsonl"
    rows.write_text(json.dumps({"prompt": "a bird", "image": "big.png"}) + "\n")
    with pytest.raises(TreegrpoError, match=f"{side}x{side} pixels"):
        first_frames(str(rows), "wan-i2v")


def test_policy_images_nested_json_is_one_line(tmp_path):
    rows = tmp_path / "clips.jsonl"
    rows.write_text(DEEP + "\n")
    with pytest.raises(TreegrpoError, match="clips.jsonl:1"):
        first_frames(str(rows), "wan-i2v")


# --- text from files is shown, not sent; names are text, not markup -------------------------------------


@pytest.mark.slow
def test_inspect_shows_escape_sequences_in_a_crafted_command_instead_of_sending_them(world, tmp_path):
    trees = _copy(world, tmp_path, "trees")
    index = json.loads((trees / "index.json").read_text())
    index["meta"]["command"] = "\x1b]0;pwned\x07\x1b[2J[bold red]loud[/]"
    (trees / "index.json").write_text(json.dumps(index))
    r = run("inspect", trees)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "\\x1b]0;pwned\\x07" in r.stdout and "[bold red]loud[/]" in r.stdout


@pytest.mark.slow
def test_a_run_folder_named_like_markup_trains_and_resumes(tmp_path):
    folder = tmp_path / "r[/x]"
    r = run("train", *FAST, "--iterations", 1, "--run-dir", folder)
    assert r.exit_code == 0, r.output
    r = run("train", "--resume", folder, "--iterations", 2)
    assert r.exit_code == 0, r.output
    assert (folder / "samples" / "step-2.png").is_file()


def test_a_rollout_out_named_like_markup_is_printed_as_it_is(tmp_path):
    out = tmp_path / "t[bold]x[/bold]"
    r = run("rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", out)
    assert r.exit_code == 0, r.output
    assert "t[bold]x[/bold]" in r.stderr.replace("\n", "")


def test_a_compare_label_like_markup_is_printed_as_it_is(world, tmp_path):
    r = run("compare", world / "run", "--label", "[red]x[/red]", "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    assert "[red]x[/red]" in r.stdout


def test_an_error_line_with_markup_in_a_path_is_one_plain_line(tmp_path):
    one_line_error(run("inspect", tmp_path / "[/]nope"), "[/]nope")


# --- JSON and TOML: one reader with a depth limit ---------------------------------------------------------


def test_a_deeply_nested_config_file_is_one_line(tmp_path):
    (tmp_path / "c.toml").write_text("name = " + "[" * 100_000 + "]" * 100_000 + "\n")
    r = run("train", "--config", tmp_path / "c.toml", "--run-dir", tmp_path / "r")
    one_line_error(r, "c.toml", "nested deeper")
    assert r.exit_code == 2


def test_a_deeply_nested_set_is_one_line(tmp_path):
    r = run("train", "--set", "reward.names=" + "[" * 100_000, "--run-dir", tmp_path / "r")
    one_line_error(r, "nested deeper")
    assert r.exit_code == 2


@pytest.mark.slow
def test_a_huge_list_in_a_config_is_named_not_echoed(tmp_path):
    (tmp_path / "c.toml").write_text("[tree]\nbranch = [" + "1," * 300_000 + "]\n")
    r = run("train", "--config", tmp_path / "c.toml", "--run-dir", tmp_path / "r")
    one_line_error(r, "tree.branch", "300,000 entries")
    assert len(r.stderr) < 500


def test_a_huge_key_in_a_config_is_named_short(tmp_path):
    (tmp_path / "c.toml").write_text("k" * 1_000_000 + " = 1\n")
    r = run("train", "--config", tmp_path / "c.toml", "--run-dir", tmp_path / "r")
    one_line_error(r, "unknown config key 'kkk")
    assert len(r.stderr) < 500


def test_a_deeply_nested_index_json_is_one_line(world, tmp_path):
    trees = _copy(world, tmp_path, "trees")
    (trees / "index.json").write_text(DEEP)
    one_line_error(run("inspect", trees), "index.json", "nested deeper")
    one_line_error(run("score", trees), "index.json", "nested deeper")


@pytest.mark.parametrize(
    "name, needle",
    [("run.json", "run.json"), ("metrics.jsonl", "metrics.jsonl"), ("eval.jsonl", "eval.jsonl")],
)
def test_a_deeply_nested_run_file_is_one_line(world, tmp_path, name, needle):
    folder = _copy(world, tmp_path, "run")
    if name.endswith(".jsonl"):
        with open(folder / name, "a") as f:
            f.write(DEEP + "\n")
    else:
        (folder / name).write_text(DEEP)
    r = run("train", "--resume", folder, "--iterations", 2)
    one_line_error(r, needle)
    assert "this is a bug" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["trainer_state.json", "manifest.json"])
def test_a_deeply_nested_checkpoint_file_is_named(world, tmp_path, name):
    folder = _copy(world, tmp_path, "run")
    (folder / "checkpoints" / "step-1" / name).write_text(DEEP)
    r = run("train", "--resume", folder, "--iterations", 2)
    assert "this is a bug" not in r.stderr and "Traceback" not in r.output
    assert name in r.stderr or "step-1" in r.stderr


def test_a_deeply_nested_prompts_file_is_one_line(tmp_path):
    (tmp_path / "p.jsonl").write_text(DEEP + "\n")
    r = run("rollout", *PIXEL, "--prompts", tmp_path / "p.jsonl", "--out", tmp_path / "t")
    one_line_error(r, "p.jsonl:1", "not valid JSON")


def test_a_deeply_nested_prompt_map_is_one_line(tmp_path):
    png(tmp_path / "imgs" / "0.png")
    (tmp_path / "imgs" / "prompts.json").write_text(DEEP)
    r = run("eval", "--images", tmp_path / "imgs", "--metric", "jpeg-compressibility")
    one_line_error(r, "prompts.json", "not valid JSON")


# --- media: frames x height x width before any frame is decoded --------------------------------------------


def _gif(path: Path, frames: int, screen: int) -> Path:
    """A GIF of `frames` 4x4 frames whose logical screen claims screen x screen pixels (a few hundred bytes)."""
    images = [Image.new("P", (4, 4), i % 200) for i in range(frames)]
    images[0].save(path, save_all=True, append_images=images[1:], duration=10, optimize=False)
    raw = bytearray(path.read_bytes())
    raw[6:10] = struct.pack("<HH", screen, screen)
    path.write_bytes(bytes(raw))
    return path


def test_a_small_gif_of_many_huge_frames_is_refused_before_decoding(tmp_path):
    gif = _gif(tmp_path / "bomb.gif", 40, 4096)
    assert gif.stat().st_size < 50_000
    with pytest.raises(TreegrpoError, match="GiB"):
        check_media(gif)


def test_a_tiff_with_a_tiny_first_page_and_a_huge_second_is_refused(tmp_path):
    small, big = Image.new("L", (8, 8)), Image.new("L", (4200, 4200))
    small.save(tmp_path / "pages.tif", save_all=True, append_images=[big], compression="tiff_deflate")
    with pytest.raises(TreegrpoError, match="frame 1 has 4200x4200"):
        check_media(tmp_path / "pages.tif")


def test_a_frame_folder_of_many_large_frames_is_refused_from_the_headers(tmp_path):
    for i in range(30):
        bomb_png(tmp_path / "clip" / f"{i:04d}.png", 4096, 4096)
    with pytest.raises(TreegrpoError, match="GiB"):
        check_media(tmp_path / "clip")


class _Frame:
    def __init__(self, side: int):
        self.width = self.height = side

    def to_ndarray(self, format):  # noqa: A002 (PyAV's name)
        import numpy as np

        assert self.width <= 64, "a frame past the limit was converted"
        return np.zeros((self.height, self.width, 3), dtype=np.uint8)


class _Box:
    def __init__(self, sides):
        self.sides = sides

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def decode(self, video=0):
        return (_Frame(s) for s in self.sides)


class _FakeAV:
    class FFmpegError(Exception):
        pass

    def __init__(self, sides):
        self.sides = sides

    def open(self, path):
        return _Box(self.sides)


@pytest.mark.parametrize("big", [8192, 64])
def test_a_clip_whose_later_frames_are_larger_is_stopped_at_the_first_of_them(tmp_path, monkeypatch, big):
    """Its header says 16x16 (the first frames); frames past them are checked before they are converted."""
    from treegrpo_cli.report import media

    monkeypatch.setattr(media, "_av", lambda: _FakeAV([16] * 200 + [big] * 50))
    with pytest.raises(TreegrpoError, match="frame 200 has 8192x8192" if big > 64 else "one size"):
        media._read_clip(tmp_path / "x.mp4")
