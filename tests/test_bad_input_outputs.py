"""Hostile image folders and output folders: a prompt map's names stay inside its folder, images are
size-checked from their headers before anything is decoded, a set is never compared with itself, eval's options
are checked before a model generates, and outputs never land in someone else's non-empty folder. Each refusal
is clitools.refused: one line, no traceback, its inputs and their surroundings left as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clitools import DIV, PIXEL, bomb_png, copy_trees, edit_json, refused, run, write_pngs
from PIL import Image

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A scored tree folder and two image folders."""
    d = tmp_path_factory.mktemp("outputs-world")
    r = run("rollout", *PIXEL, "-n", 2, "--preset", "branch", "--out", d / "trees")
    assert r.exit_code == 0, r.output
    assert run("score", d / "trees").exit_code == 0
    write_pngs(d / "imgs", 3)
    write_pngs(d / "imgs2", 3, seed=5)
    return d


# --- eval --images: the prompt map's names confined to the folder ------------------------------


def _map_outside(world: Path, tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / "imgs"
    shutil.copytree(world / "imgs", folder)
    outside = tmp_path / "outside.png"
    Image.new("RGB", (8, 8), "blue").save(outside)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text('{"config": {}}')
    if kind == "symlink":
        (folder / "link.png").symlink_to(outside)
        name = "link.png"
    elif kind == "symlinked subfolder":
        (tmp_path / "elsewhere").mkdir()
        shutil.copy(outside, tmp_path / "elsewhere" / "x.png")
        (folder / "sub").symlink_to(tmp_path / "elsewhere")
        name = "sub/x.png"
    else:
        name = {
            "../run/run.json": "../run/run.json",
            "dotdot png": "../outside.png",
            "absolute": str(outside),
            "nested dotdot": "sub/../../outside.png",
        }[kind]
        (folder / "sub").mkdir(exist_ok=True)
    edit_json(folder / "prompts.json", lambda d: d.update({name: "a blue square"}))
    return folder


MAP_OUTSIDE = ["../run/run.json", "dotdot png", "absolute", "nested dotdot", "symlink", "symlinked subfolder"]


@pytest.mark.parametrize("kind", MAP_OUTSIDE)
def test_eval_images_refuses_a_prompt_map_naming_a_file_outside(world, tmp_path, kind, monkeypatch):
    from treegrpo_cli.report import evaluate

    folder = _map_outside(world, tmp_path, kind)
    monkeypatch.setattr(evaluate, "score_source", lambda *a, **k: pytest.fail("scored before checking the map"))
    refused(["eval", "--images", folder, "--metric", "jpeg-compressibility"], ["prompts.json", "outside"], tmp_path)
    # the same folder as a baseline: refused before the model's images are scored
    args = ["eval", "--images", world / "imgs", "--baseline", folder, "--metric", "jpeg-compressibility"]
    refused(args, ["prompts.json", "outside"], tmp_path, world / "imgs")


def test_eval_images_refuses_a_csv_map_naming_a_file_outside(world, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(world / "imgs", folder)
    Image.new("RGB", (8, 8), "blue").save(tmp_path / "outside.png")
    (folder / "map.csv").write_text("image,prompt\n000.png,a\n../outside.png,b\n")
    args = ["eval", "--images", folder, "--prompts", folder / "map.csv", "--metric", "jpeg-compressibility"]
    refused(args, ["map.csv", "outside"], tmp_path)


def test_eval_images_reads_a_subfolder_inside(world, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(world / "imgs", folder)
    (folder / "sub").mkdir()
    Image.new("RGB", (8, 8), "blue").save(folder / "sub" / "x.png")
    edit_json(folder / "prompts.json", lambda d: d.update({"sub/x.png": "a blue square"}))
    r = run("eval", "--images", folder, "--metric", "jpeg-compressibility", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metrics"]["jpeg-compressibility"]["n"] == 4


# --- images: the size is checked from the header, before decoding ------------------------------


def _with_bomb(world: Path, tmp_path: Path, kind: str) -> tuple[Path, str]:
    folder = tmp_path / "imgs"
    shutil.copytree(world / "imgs", folder)
    if kind == "20000x20000 header":
        bomb_png(folder / "zz.png")
        size = "20000x20000"
    elif kind == "1x20000000 header":
        bomb_png(folder / "zz.png", 1, 20_000_000)
        size = "1x20000000"
    else:  # a real image just over the limit
        Image.new("L", (4097, 4097)).save(folder / "zz.png")
        size = "4097x4097"
    edit_json(folder / "prompts.json", lambda d: d.update({"zz.png": "a huge image"}))
    return folder, size


BOMBS = ["20000x20000 header", "1x20000000 header", "4097x4097 image"]


@pytest.mark.parametrize("kind", BOMBS)
def test_eval_images_refuses_an_oversized_image_before_decoding(world, tmp_path, kind, monkeypatch):
    from treegrpo_cli.report import evaluate

    folder, size = _with_bomb(world, tmp_path, kind)
    monkeypatch.setattr(evaluate, "score_source", lambda *a, **k: pytest.fail("scored before checking the sizes"))
    args = ["eval", "--images", folder, "--metric", "jpeg-compressibility"]
    refused(args, ["zz.png", size, "4096x4096"], tmp_path)
    args = ["eval", "--images", world / "imgs", "--baseline", folder, "--metric", "jpeg-compressibility"]
    refused(args, ["zz.png", size, "4096x4096"], tmp_path, world / "imgs")


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("kind", BOMBS)
def test_diversity_refuses_an_oversized_image_before_decoding(world, tmp_path, kind, first):
    folder, size = _with_bomb(world, tmp_path, kind)
    if first:
        (folder / "zz.png").rename(folder / "000-big.png")
    name = "000-big.png" if first else "zz.png"
    refused(["diversity", folder, world / "imgs2", *DIV], [name, size, "4096x4096"], tmp_path, world / "imgs2")
    refused(["diversity", world / "imgs2", folder, *DIV], [name, size, "4096x4096"], tmp_path, world / "imgs2")


@pytest.mark.parametrize("tool", ["eval", "diversity"])
def test_an_unreadable_image_is_one_line_before_any_work(world, tmp_path, tool, monkeypatch):
    from treegrpo_cli.report import evaluate

    folder = tmp_path / "imgs"
    shutil.copytree(world / "imgs", folder)
    (folder / "zz.png").write_bytes(b"\x89PNG\r\n\x1a\n not a png at all")
    edit_json(folder / "prompts.json", lambda d: d.update({"zz.png": "garbage"}))
    monkeypatch.setattr(evaluate, "score_source", lambda *a, **k: pytest.fail("scored before reading every header"))
    if tool == "eval":
        args = ["eval", "--images", world / "imgs", "--baseline", folder, "--metric", "jpeg-compressibility"]
    else:
        args = ["diversity", world / "imgs2", folder, *DIV]
    refused(args, ["zz.png", "not a readable image"], tmp_path, world / "imgs", world / "imgs2")


# --- diversity A A -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["same path", "trailing dot", "a link to it", "tree folder twice"])
def test_diversity_refuses_the_same_set_twice(world, tmp_path, kind):
    a = world / ("trees" if kind == "tree folder twice" else "imgs")
    b = {"trailing dot": a / ".", "a link to it": tmp_path / "link"}.get(kind, a)
    if kind == "a link to it":
        b.symlink_to(a)
    refused(["diversity", a, b, *DIV], ["twice"], tmp_path, a)


def test_diversity_generate_refuses_one_folder_for_both_sets(tmp_path, monkeypatch):
    from treegrpo_cli.diversity import io

    monkeypatch.setattr(io, "run_rollout", lambda *a, **k: pytest.fail("generated before checking the folders"))
    args = ["diversity", "--generate", tmp_path / "s", tmp_path / "s", "--model", "pixel-tiny", "--num", 30, *DIV]
    refused(args, ["twice"], tmp_path)


# --- eval: the baseline and the options checked before the model is generated or scored --------


@pytest.mark.parametrize("baseline", ["nope", "{t}/missing.safetensors", "{t}/not-a-run", "{t}/empty"])
def test_eval_checks_the_baseline_model_before_generating(tmp_path, monkeypatch, baseline):
    from treegrpo_cli.training import sampling

    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(sampling, "rollout", lambda *a, **k: pytest.fail("generated before checking the baseline"))
    name = baseline.replace("{t}", str(tmp_path))
    needle = Path(name).name
    args = ["eval", "--model", "pixel-tiny", "--baseline", name, "--metric", "jpeg-compressibility"]
    refused(args, [needle], tmp_path)


@pytest.mark.parametrize("where", ["model", "images"])
def test_eval_refuses_an_unknown_reward_dtype(world, tmp_path, monkeypatch, where):
    from treegrpo_cli.report import evaluate
    from treegrpo_cli.training import sampling

    monkeypatch.setattr(sampling, "rollout", lambda *a, **k: pytest.fail("generated before checking the dtype"))
    monkeypatch.setattr(evaluate, "score_source", lambda *a, **k: pytest.fail("scored before checking the dtype"))
    source = ["--model", "pixel-tiny"] if where == "model" else ["--images", world / "imgs"]
    args = ["eval", *source, "--metric", "jpeg-compressibility", "--reward-dtype", "banana"]
    refused(args, ["--reward-dtype", "banana", "float32", "bfloat16", "float16"], tmp_path, world / "imgs")


# --- outputs: never into a non-empty folder the tool did not write ----------------------------


def _foreign(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("months of work")
    (folder / "figures").mkdir()
    (folder / "figures" / "a.png").write_bytes(b"png")
    return folder


@pytest.mark.parametrize("overwrite", [False, True])
def test_rollout_refuses_a_foreign_non_empty_out(tmp_path, overwrite):
    folder = _foreign(tmp_path)
    args = ["rollout", *PIXEL, "-n", 1, "--out", folder] + (["--overwrite"] if overwrite else [])
    refused(args, ["--out", "mine", "not empty"], tmp_path)


def test_rollout_writes_into_an_empty_folder_and_overwrites_its_own(tmp_path):
    (tmp_path / "o").mkdir()
    assert run("rollout", *PIXEL, "-n", 1, "--out", tmp_path / "o").exit_code == 0
    refused(["rollout", *PIXEL, "-n", 1, "--out", tmp_path / "o"], ["--overwrite"], tmp_path)
    r = run("rollout", *PIXEL, "-n", 1, "--out", tmp_path / "o", "--overwrite")
    assert r.exit_code == 0, r.output


def test_eval_refuses_a_foreign_non_empty_out(tmp_path, monkeypatch):
    from treegrpo_cli.training import sampling

    folder = _foreign(tmp_path)
    monkeypatch.setattr(sampling, "rollout", lambda *a, **k: pytest.fail("generated before checking --out"))
    args = ["eval", "--model", "pixel-tiny", "--metric", "jpeg-compressibility", "--out", folder]
    refused(args, ["--out", "mine", "not empty"], tmp_path)


def test_eval_writes_again_into_its_own_out(world, tmp_path):
    args = ["eval", "--images", world / "imgs", "--metric", "jpeg-compressibility", "--out", tmp_path / "e"]
    assert run(*args).exit_code == 0
    r = run(*args)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("where", ["A", "out/set-a", "out"])
def test_diversity_generate_refuses_a_foreign_non_empty_folder(tmp_path, monkeypatch, where):
    from treegrpo_cli.diversity import io

    folder = _foreign(tmp_path)
    monkeypatch.setattr(io, "run_rollout", lambda *a, **k: pytest.fail("generated before checking the folders"))
    base = ["diversity", "--generate", "--model", "pixel-tiny", "--num", 30, "--overwrite", *DIV]
    if where == "A":
        args = [*base[:2], folder, tmp_path / "b", *base[2:]]
    elif where == "out/set-a":
        shutil.move(folder, tmp_path / "set-a")
        (tmp_path / "o").mkdir()
        shutil.move(tmp_path / "set-a", tmp_path / "o" / "set-a")
        args = [*base, "--out", tmp_path / "o"]
    else:
        args = [*base, "--out", folder]
    refused(args, ["not empty"], tmp_path)


def test_diversity_generate_refuses_an_existing_set_b_before_generating_set_a(world, tmp_path, monkeypatch):
    from treegrpo_cli.diversity import io

    b = copy_trees(world, tmp_path)
    monkeypatch.setattr(io, "run_rollout", lambda *a, **k: pytest.fail("generated before checking set B"))
    args = ["diversity", "--generate", tmp_path / "a", b, "--model", "pixel-tiny", "--num", 30, *DIV]
    refused(args, [str(b), "--overwrite"], tmp_path)


def test_diversity_refuses_a_foreign_non_empty_out(world, tmp_path):
    folder = _foreign(tmp_path)
    refused(["diversity", world / "imgs", world / "imgs2", *DIV, "--out", folder], ["--out", "not empty"], tmp_path)
