"""Hostile files: names read from the tool's own files (a tree folder's index.json, scores, a checkpoint's
manifest and shard indexes) stay inside their folder, and damaged ones are validated as a whole before use.
(Image folders, prompt maps and output folders: test_bad_input_outputs.py.)

Every refusal: a non-zero exit, exactly one line on stderr, no traceback, and nothing it was given (or
anything outside it) changed, created or deleted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from clitools import DIV, PIXEL, copy_trees, edit_json, refused, run

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two scored tree folders (other seeds) and a finished one-iteration run."""
    d = tmp_path_factory.mktemp("files-world")
    for name, seed in (("trees", 0), ("other", 7)):
        r = run("rollout", *PIXEL, "-n", 2, "--preset", "branch", "--seed", seed, "--out", d / name)
        assert r.exit_code == 0, r.output
        assert run("score", d / name).exit_code == 0
    r = run("train", *PIXEL, "--preset", "branch", "--iterations", 1, "--run-dir", d / "run")
    assert r.exit_code == 0, r.output
    return d


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
