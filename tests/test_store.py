import json

import pytest
import torch

from treegrpo_cli.errors import CorruptFileError, TreegrpoError
from treegrpo_cli.store.shards import INDEX, ShardStore


def test_round_trip_with_metadata(tmp_path):
    store = ShardStore.create(tmp_path / "d", "trees", {"seed": 3})
    t = {"a": torch.arange(6).view(2, 3), "b": torch.tensor([1.5, float("nan")])}
    store.write("trees-00000", "trees", t, {"prompts": {"0": "a cat"}, "n": 2})
    again = ShardStore.open(tmp_path / "d", kind="trees")
    got, meta = again.read("trees-00000")
    assert torch.equal(got["a"], t["a"]) and torch.isnan(got["b"][1])
    assert meta == {"prompts": {"0": "a cat"}, "n": 2}
    assert again.meta == {"seed": 3} and again.names("trees") == ["trees-00000"]


def test_flipped_byte_is_detected(tmp_path):
    store = ShardStore.create(tmp_path, "trees", {})
    store.write("x", "trees", {"a": torch.zeros(100)})
    f = tmp_path / "x.safetensors"
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="x.safetensors"):
        ShardStore.open(tmp_path).read("x")


def test_missing_and_foreign_folders(tmp_path):
    with pytest.raises(TreegrpoError, match="no such folder"):
        ShardStore.open(tmp_path / "nope")
    with pytest.raises(TreegrpoError, match="not a folder written by treegrpo"):
        ShardStore.open(tmp_path)
    (tmp_path / INDEX).write_text("{not json")
    with pytest.raises(CorruptFileError):
        ShardStore.open(tmp_path)
    (tmp_path / INDEX).write_text(json.dumps({"format": "treegrpo", "version": 99, "shards": {}}))
    with pytest.raises(CorruptFileError, match="version"):
        ShardStore.open(tmp_path)


def test_create_refuses_to_clobber(tmp_path):
    ShardStore.create(tmp_path, "trees", {})
    with pytest.raises(TreegrpoError, match="already"):
        ShardStore.create(tmp_path, "trees", {})
    ShardStore.create(tmp_path, "trees", {"x": 1}, overwrite=True)


def test_failed_write_leaves_old_shard_intact(tmp_path, monkeypatch):
    store = ShardStore.create(tmp_path, "trees", {})
    store.write("x", "trees", {"a": torch.ones(4)})
    import treegrpo_cli.store.shards as shards

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(shards.os, "replace", boom)
    with pytest.raises(OSError):
        store.write("x", "trees", {"a": torch.zeros(4)})
    monkeypatch.undo()
    got, _ = ShardStore.open(tmp_path).read("x")
    assert torch.equal(got["a"], torch.ones(4))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
