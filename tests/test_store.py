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


def test_checkpoints_are_written_in_shards_and_load_back(tmp_path):
    """A small shard limit splits the weights over several files with an index; every tensor, the EMA,
    the optimizer state and the RNG states come back equal; a damaged shard is refused by name."""
    import torch

    from treegrpo_cli.errors import CorruptFileError
    from treegrpo_cli.store.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

    g = torch.Generator().manual_seed(0)
    model = {f"w{i}": torch.randn(16, 16, generator=g) for i in range(5)}  # 1 KiB each
    params = [torch.nn.Parameter(v.clone()) for v in model.values()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    opt.step()
    ck = Checkpoint(
        step=3,
        model=model,
        ema={k: v * 2 for k, v in model.items()},
        optimizer=opt.state_dict(),
        rng={"torch": torch.get_rng_state()},
        state={"step": 3},
    )
    path = save_checkpoint(tmp_path / "ck", ck, keep_last=2, shard_bytes=2 * 1024)
    shards = sorted(p.name for p in path.glob("model-*.safetensors"))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    back = load_checkpoint(path)
    assert all(torch.equal(back.model[k], v) and torch.equal(back.ema[k], 2 * v) for k, v in model.items())
    assert torch.equal(back.rng["torch"], ck.rng["torch"]) and back.step == 3
    again = torch.optim.AdamW([torch.nn.Parameter(v.clone()) for v in model.values()], lr=1e-3)
    again.load_state_dict(back.optimizer)
    assert all(
        torch.equal(again.state_dict()["state"][i]["exp_avg"], opt.state_dict()["state"][i]["exp_avg"])
        for i in range(5)
    )
    blob = bytearray((path / shards[1]).read_bytes())
    blob[-1] ^= 1
    (path / shards[1]).write_bytes(bytes(blob))
    with pytest.raises(CorruptFileError, match="model-00002-of-00003"):
        load_checkpoint(path)


def test_checkpoints_of_the_single_file_format_still_load(tmp_path):
    import hashlib
    import json

    import torch
    from safetensors.torch import save_file

    from treegrpo_cli.store.checkpoint import load_checkpoint

    d = tmp_path / "step-1"
    d.mkdir()
    save_file({"w": torch.ones(2)}, str(d / "model.safetensors"))
    save_file({}, str(d / "optimizer.safetensors"))
    save_file({"torch": torch.get_rng_state()}, str(d / "rng.safetensors"))
    (d / "optimizer.json").write_text(json.dumps({"param_groups": [], "scalars": {}}))
    (d / "trainer_state.json").write_text(json.dumps({"step": 1}))
    files = ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "optimizer.json", "trainer_state.json"]
    (d / "manifest.json").write_text(json.dumps({f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in files}))
    ck = load_checkpoint(d)
    assert ck.step == 1 and torch.equal(ck.model["w"], torch.ones(2)) and ck.ema is None
