"""The tiny DiT of the shapes world: weights files, loading through the Policy protocol, pretraining."""

import pytest
import torch
from typer.testing import CliRunner

from treegrpo_cli.cli.app import app
from treegrpo_cli.config import load_config
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.models.dit import DiTConfig, TinyDiT
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.world.pretrain import load_weights, save_weights


def test_weights_round_trip_and_bad_files(tmp_path):
    torch.manual_seed(0)
    net = TinyDiT(DiTConfig(dim=32, depth=1, heads=2))
    save_weights(tmp_path / "w.safetensors", net, {"note": "test"})
    again, meta = load_weights(tmp_path / "w.safetensors")
    assert meta == {"note": "test"} and again.cfg == net.cfg
    for k, v in net.state_dict().items():
        assert torch.equal(v, again.state_dict()[k])
    policy = load_policy(str(tmp_path / "w.safetensors"))
    x = torch.randn(2, 3, 32, 32)
    assert policy.velocity(x, torch.rand(2), policy.encode(["a red circle", "two blue squares"])).shape == x.shape
    with pytest.raises(TreegrpoError, match="not found"):
        load_policy(str(tmp_path / "missing.safetensors"))


def test_tiny_shapes_defaults_select_the_world():
    cfg = load_config("branch", sets=['model="tiny-shapes"'])
    assert cfg.reward.names == ("shapes",)
    assert cfg.rollout.prompts == "shapes-train" and cfg.rollout.eval_prompts == "shapes-test"


def test_pretraining_lowers_the_loss_and_writes_weights(tmp_path):
    from treegrpo_cli.world.pretrain import PretrainConfig, pretrain

    rows = []
    cfg = PretrainConfig(steps=12, batch=8, warmup=2, eval_every=12, eval_steps=2, lr=1e-3)
    last = pretrain(cfg, tmp_path / "w.safetensors", dit=DiTConfig(dim=32, depth=1, heads=2), log=rows.append)
    assert last["step"] == 12 and 0 <= last["test_reward"] <= 1
    net, meta = load_weights(tmp_path / "w.safetensors")
    assert meta["log"]["step"] == 12 and net.cfg.dim == 32


def test_missing_weights_is_one_line(tmp_path):
    r = CliRunner().invoke(app, ["rollout", "--model", str(tmp_path / "nope.safetensors"), "--out", tmp_path / "t"])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1 and "not found" in r.stderr
