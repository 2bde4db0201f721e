"""Hostile files (issue 32, part A): names read from the tool's own files stay inside their folder,
damaged index.json / manifest.json / prompt maps are validated as a whole, images are size-checked
before decoding, and outputs never land in someone else's non-empty folder.

Every refusal: a non-zero exit, exactly one line on stderr, no traceback, and nothing it was given (or
anything outside it) changed, created or deleted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from clitools import PIXEL, one_line_error, run, write_pngs
from PIL import Image

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out

DIV = ["--features", "pixels", "--kid-subsets", 2, "--permutations", 0, "--by-image"]


def bomb_png(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A PNG whose header claims width x height pixels (its data is one row: a decompression bomb's header)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * (1 + 3 * width))) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two scored tree folders (other seeds), a finished one-iteration run, an image folder."""
    d = tmp_path_factory.mktemp("files-world")
    for name, seed in (("trees", 0), ("other", 7)):
        r = run("rollout", *PIXEL, "-n", 2, "--preset", "branch", "--seed", seed, "--out", d / name)
        assert r.exit_code == 0, r.output
        assert run("score", d / name).exit_code == 0
    r = run("train", *PIXEL, "--preset", "branch", "--iterations", 1, "--run-dir", d / "run")
    assert r.exit_code == 0, r.output
    write_pngs(d / "imgs", 3)
    write_pngs(d / "imgs2", 3, seed=5)
    return d


def entry(path: Path):
    """One path as it is: a link (its target, never followed), a folder, a file's sha1, or another kind."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return "dir"
    if path.is_file():
        return hashlib.sha1(path.read_bytes()).hexdigest()
    return ("special", stat.S_IFMT(path.lstat().st_mode)) if os.path.lexists(path) else None


def state(path: Path):
    """What a refused command must leave as it was: everything under a folder (as test_bad_input's
    snapshot, but links and FIFOs are recorded, not read), or one path."""
    if path.is_dir() and not path.is_symlink():
        return {str(p.relative_to(path)): entry(p) for p in sorted(path.rglob("*"))}
    return entry(path)


def refused(args: list, needles: list[str], *watch: Path):
    """Run `treegrpo args`: one line with every needle, no traceback, and every watched path unchanged."""
    before = [state(p) for p in watch]
    r = run(*args)
    one_line_error(r, *needles)
    assert "Traceback" not in r.output and "this is a bug" not in r.stderr  # bad input, not an internal error
    assert [state(p) for p in watch] == before, "a refused command changed its inputs or something outside"
    return r


def copy_trees(world: Path, tmp_path: Path, name: str = "trees") -> Path:
    folder = tmp_path / name
    shutil.copytree(world / name, folder)
    return folder


def edit_json(path: Path, fn: Callable[[dict], object]) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- index.json: shard names confined to the tree folder ---------------------------------------

OUTSIDE = {
    "dotdot": "../victim.safetensors",
    "absolute": "{victim}",
    "separator": "sub/victim.safetensors",
    "nested dotdot": "sub/../../victim.safetensors",
    "dotdot alone": "..",
    "another shard's file": "trees-00000.safetensors",
}


def _victims(tmp_path: Path, folder: Path) -> Path:
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"a file outside the tree folder")
    (folder / "sub").mkdir()
    (folder / "sub" / "victim.safetensors").write_bytes(b"a file in a subfolder")
    return victim


@pytest.mark.parametrize("kind", list(OUTSIDE))
def test_score_never_deletes_a_file_a_rewards_entry_names(world, tmp_path, kind):
    folder = copy_trees(world, tmp_path)
    victim = _victims(tmp_path, folder)
    name = OUTSIDE[kind].format(victim=victim)
    edit_json(folder / "index.json", lambda i: i["shards"]["rewards-00000"].update(file=name))
    refused(["score", folder], ["index.json", "rewards-00000", "file"], tmp_path)
    assert victim.is_file() and (folder / "trees-00000.safetensors").is_file()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "another shard's file"])
def test_rollout_overwrite_never_deletes_a_file_the_old_index_names(world, tmp_path, kind):
    folder = copy_trees(world, tmp_path)
    victim = _victims(tmp_path, folder)
    name = OUTSIDE[kind].format(victim=victim)
    edit_json(folder / "index.json", lambda i: i["shards"]["advantages-00000"].update(file=name))
    args = ["rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", folder, "--overwrite"]
    refused(args, ["index.json", "advantages-00000", "file"], tmp_path)


@pytest.mark.parametrize("damage", ["shards a string", "entry without sha256", "meta a list"])
def test_rollout_overwrite_refuses_a_damaged_old_index_and_deletes_nothing(world, tmp_path, damage):
    folder = copy_trees(world, tmp_path)
    edit, needles = DAMAGE[damage]
    edit_json(folder / "index.json", edit)
    args = ["rollout", *PIXEL, "-n", 1, "--preset", "branch", "--out", folder, "--overwrite"]
    refused(args, needles, tmp_path)


def test_score_refuses_a_shard_that_is_a_link_to_a_file_outside(world, tmp_path):
    """The link's target has the right bytes (the hash check passes); the name resolves outside."""
    folder = copy_trees(world, tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.move(folder / "rewards-00000.safetensors", outside)
    (folder / "rewards-00000.safetensors").symlink_to(outside)
    refused(["score", folder], ["index.json", "rewards-00000", "outside"], tmp_path)
    refused(["inspect", folder], ["index.json", "rewards-00000", "outside"], tmp_path)
    assert (folder / "rewards-00000.safetensors").is_symlink()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "/etc/passwd", "symlink", "separator"])
def test_inspect_refuses_a_trees_entry_outside_the_folder_by_name(world, tmp_path, kind):
    folder = copy_trees(world, tmp_path)
    outside = tmp_path / "x.safetensors"
    shutil.copy(folder / "trees-00000.safetensors", outside)  # the same bytes: the sha256 check would pass
    if kind == "symlink":
        (folder / "trees-00000.safetensors").unlink()
        (folder / "trees-00000.safetensors").symlink_to(outside)
    else:
        name = {"dotdot": "../x.safetensors", "absolute": str(outside), "/etc/passwd": "/etc/passwd"}.get(kind)
        if kind == "separator":
            (folder / "sub").mkdir()
            shutil.copy(outside, folder / "sub" / "x.safetensors")
            name = "sub/x.safetensors"
        edit_json(folder / "index.json", lambda i: i["shards"]["trees-00000"].update(file=name))
    for args in (["inspect", folder], ["inspect", folder, "--json"], ["diversity", folder, world / "other", *DIV]):
        r = refused(args, ["index.json", "trees-00000", "file"], tmp_path, world / "other")
        assert "sha256" not in r.stderr  # refused by its name, before any hash check


@pytest.mark.usefixtures("time_limit")  # a FIFO read would block
@pytest.mark.parametrize("kind", ["a link loop", "a folder", "a FIFO", "a link to /dev/zero"])
def test_a_shard_that_is_not_a_regular_file_is_one_line(world, tmp_path, kind):
    folder = copy_trees(world, tmp_path)
    shard = folder / "trees-00000.safetensors"
    shard.unlink()
    if kind == "a link loop":
        shard.symlink_to(shard)
    elif kind == "a folder":
        shard.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(shard)
    else:
        shard.symlink_to("/dev/zero")
    for args in (["inspect", folder], ["score", folder], ["diversity", folder, world / "other", *DIV]):
        refused(args, ["trees-00000"], tmp_path, world / "other")


# --- index.json: every field validated before use ----------------------------------------------


def _set(*keys, value):
    def edit(i):
        for k in keys[:-1]:
            i = i[k]
        i[keys[-1]] = value

    return edit


def _pop(*keys):
    def edit(i):
        for k in keys[:-1]:
            i = i[k]
        i.pop(keys[-1])

    return edit


DAMAGE = {
    "shards a string": (_set("shards", value="trees-00000"), ["index.json", "shards"]),
    "shards a list": (_set("shards", value=["trees-00000"]), ["index.json", "shards"]),
    "entry a string": (_set("shards", "trees-00000", value="trees-00000.safetensors"), ["index.json", "trees-00000"]),
    "entry without sha256": (_pop("shards", "trees-00000", "sha256"), ["index.json", "sha256"]),
    "entry sha256 a number": (_set("shards", "rewards-00000", "sha256", value=12), ["index.json", "sha256"]),
    "entry bytes a string": (_set("shards", "trees-00000", "bytes", value="389566"), ["index.json", "bytes"]),
    "entry file a number": (_set("shards", "trees-00000", "file", value=7), ["index.json", "file"]),
    "entry file empty": (_set("shards", "trees-00000", "file", value=""), ["index.json", "file"]),
    "entry role unknown": (_set("shards", "rewards-00000", "role", value="weights"), ["index.json", "role"]),
    "entry name a path": (
        lambda i: i["shards"].update({"../trees-00009": dict(i["shards"]["trees-00000"])}),
        ["index.json", "trees-00009"],
    ),
    "meta a list": (_set("meta", value=[]), ["index.json", "meta"]),
    "meta.config a string": (_set("meta", "config", value="branch"), ["index.json", "meta.config"]),
    "meta.config missing": (_pop("meta", "config"), ["index.json", "meta.config"]),
    "meta.iteration a word": (_set("meta", "iteration", value="zero"), ["index.json", "meta.iteration"]),
    "meta.scoring a string": (_set("meta", "scoring", value="yes"), ["index.json", "meta.scoring"]),
    "meta.model a string": (_set("meta", "model", value="pixel-tiny"), ["index.json", "meta.model"]),
    "meta.config.sampler a string": (_set("meta", "config", "sampler", value="ode"), ["sampler"]),
}

COMMANDS = {
    "inspect": ["inspect", "{f}"],
    "score": ["score", "{f}"],
    "train --trees": ["train", "--trees", "{f}", "--run-dir", "{t}/r"],
    "diversity": ["diversity", "{f}", "{other}", *DIV],
}


DAMAGE_CASES = [
    (damage, command)
    for damage in DAMAGE
    for command in COMMANDS
    if not (damage == "meta.config.sampler a string" and command == "diversity")  # it reads no config
]


@pytest.mark.parametrize(("damage", "command"), DAMAGE_CASES)
def test_a_damaged_index_is_one_line(world, tmp_path, damage, command):
    folder = copy_trees(world, tmp_path)
    edit, needles = DAMAGE[damage]
    edit_json(folder / "index.json", edit)
    fill = {"{f}": str(folder), "{t}": str(tmp_path), "{other}": str(world / "other")}
    args = [fill.get(str(a), str(a)).replace("{t}", str(tmp_path)) for a in COMMANDS[command]]
    refused(args, needles, tmp_path, world / "other")


@pytest.mark.parametrize("text", ["[]", '"index"', "null", '{"format": "treegrpo", "version": 1}'])
def test_an_index_that_is_not_an_object_of_shards_is_one_line(world, tmp_path, text):
    folder = copy_trees(world, tmp_path)
    (folder / "index.json").write_text(text)
    for args in (["inspect", folder], ["score", folder], ["train", "--trees", folder, "--run-dir", tmp_path / "r"]):
        refused(args, ["index.json"], tmp_path)


# --- scores copied in from another tree folder -------------------------------------------------


@pytest.mark.parametrize("what", ["rewards file", "rewards file and entry", "both files and entries"])
def test_train_trees_refuses_scores_copied_from_another_tree_folder(world, tmp_path, what):
    folder = copy_trees(world, tmp_path)
    roles = ["rewards"] if what.startswith("rewards") else ["rewards", "advantages"]
    theirs = json.loads((world / "other" / "index.json").read_text())["shards"]
    for role in roles:
        shutil.copy(world / "other" / f"{role}-00000.safetensors", folder / f"{role}-00000.safetensors")
        if "entr" in what:
            edit_json(
                folder / "index.json",
                lambda i, role=role: i["shards"].update({f"{role}-00000": theirs[f"{role}-00000"]}),
            )
    needles = ["rewards-00000", "corrupt"] if what == "rewards file" else ["00000", "trees"]
    refused(["train", "--trees", folder, "--run-dir", tmp_path / "r"], needles, tmp_path)
    refused(["inspect", folder], needles, tmp_path)


def test_train_trees_accepts_its_own_scores(world, tmp_path):
    folder = copy_trees(world, tmp_path)
    r = run("train", "--trees", folder, "--run-dir", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert run("inspect", folder).exit_code == 0


# --- checkpoints: manifest.json and the shard indexes ------------------------------------------


def _step(world: Path, tmp_path: Path) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    shutil.copytree(world / "run", run_dir)
    return run_dir, run_dir / "checkpoints" / "step-1"


def _manifest(step: Path, fn: Callable[[dict], object]) -> None:
    edit_json(step / "manifest.json", fn)


def _outside_manifest_entry(step: Path, tmp_path: Path, absolute: bool) -> None:
    outside = tmp_path / "outside.json"
    shutil.copy(step / "trainer_state.json", outside)
    name = str(outside) if absolute else "../../../outside.json"
    _manifest(step, lambda m: m.update({name: sha(outside)}))


def _weight_map_outside(step: Path, tmp_path: Path, absolute: bool) -> None:
    shard = next(step.glob("model-*.safetensors"))
    outside = tmp_path / "model-outside.safetensors"
    shutil.copy(shard, outside)
    name = str(outside) if absolute else "../../../model-outside.safetensors"
    edit_json(step / "model.index.json", lambda d: d.update(weight_map={k: name for k in d["weight_map"]}))
    _manifest(step, lambda m: m.update({"model.index.json": sha(step / "model.index.json")}))


def _link_outside(step: Path, tmp_path: Path, absolute: bool) -> None:
    shard = next(step.glob("model-*.safetensors"))
    outside = tmp_path / "model-outside.safetensors"
    shutil.move(shard, outside)
    shard.symlink_to(outside)


def _state(value) -> Callable[[Path, Path, bool], None]:
    def edit(step: Path, tmp_path: Path, absolute: bool) -> None:
        (step / "trainer_state.json").write_text(json.dumps(value))
        _manifest(step, lambda m: m.update({"trainer_state.json": sha(step / "trainer_state.json")}))

    return edit


CHECKPOINT_DAMAGE = {
    "manifest names ../": (lambda s, t, a: _outside_manifest_entry(s, t, False), ["manifest.json", "outside.json"]),
    "manifest names an absolute path": (
        lambda s, t, a: _outside_manifest_entry(s, t, True),
        ["manifest.json", "outside.json"],
    ),
    "weight_map names ../": (lambda s, t, a: _weight_map_outside(s, t, False), ["model.index.json", "outside"]),
    "weight_map names an absolute path": (
        lambda s, t, a: _weight_map_outside(s, t, True),
        ["model.index.json", "outside"],
    ),
    "shard a link outside": (_link_outside, ["manifest.json", "outside"]),
    "manifest a list": (
        lambda s, t, a: (s / "manifest.json").write_text('["model.index.json"]'),
        ["manifest.json"],
    ),
    "manifest hash a number": (
        lambda s, t, a: _manifest(s, lambda m: m.update({"trainer_state.json": 5})),
        ["manifest.json", "trainer_state.json"],
    ),
    "manifest without trainer_state.json": (
        lambda s, t, a: _manifest(s, lambda m: m.pop("trainer_state.json")),
        ["manifest.json", "trainer_state.json"],
    ),
    "trainer_state step a word": (_state({"step": "abc", "config": {}}), ["trainer_state.json", "step"]),
    "trainer_state a list": (_state([1, 2]), ["trainer_state.json"]),
    "weight_map a list": (
        lambda s, t, a: (
            (s / "model.index.json").write_text('{"weight_map": []}'),
            _manifest(s, lambda m: m.update({"model.index.json": sha(s / "model.index.json")})),
        ),
        ["model.index.json", "weight_map"],
    ),
}


@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGE))
def test_a_damaged_checkpoint_is_one_line(world, tmp_path, damage, monkeypatch):
    from treegrpo_cli.training import sampling

    run_dir, step = _step(world, tmp_path)
    edit, needles = CHECKPOINT_DAMAGE[damage]
    edit(step, tmp_path, False)
    monkeypatch.setattr(sampling, "rollout", lambda *a, **k: pytest.fail("generated from a damaged checkpoint"))
    refused(["eval", "--checkpoint", run_dir, "--metric", "jpeg-compressibility"], needles, tmp_path)
    # as a baseline it is refused before the model is generated
    args = ["eval", "--model", "pixel-tiny", "--baseline", run_dir, "--metric", "jpeg-compressibility"]
    refused(args, needles, tmp_path)


def test_an_intact_checkpoint_still_evaluates(world, tmp_path):
    run_dir, _ = _step(world, tmp_path)
    r = run("eval", "--checkpoint", run_dir, "--metric", "jpeg-compressibility", "--num-prompts", 2, "--json")
    assert r.exit_code == 0, r.output


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
