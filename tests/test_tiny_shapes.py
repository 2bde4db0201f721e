"""The embedded default world: shipped weights load through the Policy protocol and draw shapes."""

import pytest
import torch
from typer.testing import CliRunner

from treegrpo_cli.cli.app import app
from treegrpo_cli.config import load_config
from treegrpo_cli.engine.rollout import TreeConfig, rollout
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.models.dit import DiTConfig, DiTPolicy, TinyDiT, num_params
from treegrpo_cli.models.registry import TINY_SHAPES, load_policy
from treegrpo_cli.rewards.shapes import shapes_scores
from treegrpo_cli.world.pretrain import load_weights, save_weights
from treegrpo_cli.world.shapes import load_split


def test_shipped_weights_load_and_are_small():
    assert TINY_SHAPES.is_file() and TINY_SHAPES.stat().st_size < 20 * 2**20
    policy = load_policy("tiny-shapes")
    assert isinstance(policy, DiTPolicy) and policy.latent_shape == (3, 32, 32)
    assert 0.5e6 < num_params(policy.net) < 3e6
    meta = load_weights(TINY_SHAPES)[1]
    assert "pretrain" in meta and "log" in meta


def test_shipped_model_draws_the_pretraining_world():
    """ODE samples of pretraining-style prompts score well above chance under the shapes reward."""
    policy = load_policy("tiny-shapes")
    prompts = load_split("pretrain")[::40][:16]
    tree, _ = rollout(policy, prompts, list(range(len(prompts))), FlowSDE(SamplerConfig(steps=20)),
                      TreeConfig(sde_steps=()), 5)
    scores = shapes_scores(policy.decode(tree.image_latent), prompts)
    assert scores.mean() > 0.5


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


def test_tiny_shapes_is_the_default_world():
    cfg = load_config("branch")
    assert cfg.model == "tiny-shapes" and cfg.reward.names == ("shapes",)
    assert cfg.rollout.prompts == "shapes-train" and cfg.rollout.eval_prompts == "shapes-test"


def test_missing_weights_is_one_line(tmp_path):
    r = CliRunner().invoke(app, ["rollout", "--model", str(tmp_path / "nope.safetensors"), "--out", tmp_path / "t"])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1 and "not found" in r.stderr
