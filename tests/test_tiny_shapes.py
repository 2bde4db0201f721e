"""The tiny DiT of the shapes world: weights files, loading through the Policy protocol, pretraining."""

from dataclasses import asdict

import pytest
import torch
from typer.testing import CliRunner

from treegrpo_cli.cli.app import app
from treegrpo_cli.config import load_config
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.models.dit import DiTConfig, TinyDiT
from treegrpo_cli.models.registry import TINY_SHAPES, load_policy
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
    for cfg in (load_config("branch", sets=['model="tiny-shapes"']), load_config(sets=['model="tiny-shapes"'])):
        assert cfg.model == "tiny-shapes" and cfg.reward.names == ("shapes",)
        assert cfg.rollout.prompts == "shapes-train" and cfg.rollout.eval_prompts == "shapes-test"
    assert load_config("branch", sets=['model="pixel"']).reward.names == ("jpeg-compressibility",)


def test_pretraining_lowers_the_loss_and_writes_weights(tmp_path):
    from treegrpo_cli.world.pretrain import PretrainConfig, pretrain

    rows = []
    cfg = PretrainConfig(steps=12, batch=8, warmup=2, eval_every=12, eval_steps=2, lr=1e-3)
    last = pretrain(cfg, tmp_path / "w.safetensors", dit=DiTConfig(dim=32, depth=1, heads=2), log=rows.append)
    assert last["step"] == 12 and 0 <= last["test_reward"] <= 1
    net, meta = load_weights(tmp_path / "w.safetensors")
    assert meta["log"]["step"] == 12 and net.cfg.dim == 32


def test_guidance_combines_the_prompt_and_the_empty_prompt():
    from treegrpo_cli.models.dit import DiTPolicy

    torch.manual_seed(0)
    net = TinyDiT(DiTConfig(dim=32, depth=1, heads=2, text_ada=True))
    for p in net.parameters():                          # leave the zero init, so the output depends on the input
        torch.nn.init.normal_(p, std=0.1)
    plain, guided = DiTPolicy(net.cfg, net), DiTPolicy(net.cfg, net, guidance=3.0)
    x, sigma = torch.randn(2, 3, 32, 32), torch.tensor([0.3, 0.8])
    cond = plain.encode(["a red circle", "two blue squares"])
    empty = plain.encode(["", ""])
    v_c, v_u = plain.velocity(x, sigma, cond), plain.velocity(x, sigma, empty)
    assert not torch.allclose(v_c, v_u)
    torch.testing.assert_close(guided.velocity(x, sigma, cond), v_u + 3.0 * (v_c - v_u), rtol=1e-4, atol=1e-5)
    assert (plain.evals_per_row, guided.evals_per_row) == (1, 2)
    assert guided.reference().guidance == 3.0


def test_unconditional_training_ignores_the_prompt():
    from treegrpo_cli.models.dit import DiTPolicy
    from treegrpo_cli.world.pretrain import flow_loss

    torch.manual_seed(0)
    net = TinyDiT(DiTConfig(dim=32, depth=1, heads=2, text_ada=True))
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.1)
    policy, images = DiTPolicy(net.cfg, net), torch.rand(4, 3, 32, 32)
    losses = {}
    for prompts in (["a red circle"] * 4, ["three big blue squares"] * 4):
        for uncond in (0.0, 1.0):
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                losses[prompts[0], uncond] = float(flow_loss(net, policy, prompts, images, g, 1.0, uncond))
    assert losses["a red circle", 1.0] == losses["three big blue squares", 1.0]
    assert losses["a red circle", 0.0] != losses["three big blue squares", 0.0]


def test_missing_weights_is_one_line(tmp_path):
    r = CliRunner().invoke(app, ["rollout", "--model", str(tmp_path / "nope.safetensors"), "--out", tmp_path / "t"])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1 and "not found" in r.stderr


def test_shipped_weights_load_and_draw_the_world():
    """The packaged weights load through the Policy protocol, carry their pretraining log, and their
    ODE samples of the held-out test prompts earn a clearly non-trivial `shapes` reward."""
    from treegrpo_cli.evaluate import heldout_reward
    from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
    from treegrpo_cli.rewards.base import get_reward
    from treegrpo_cli.world.pretrain import WORLD_DIT, PretrainConfig
    from treegrpo_cli.world.shapes import load_split

    policy = load_policy("tiny-shapes")
    assert policy.name == "tiny-shapes" and policy.latent_shape == (3, 32, 32)
    assert TINY_SHAPES.stat().st_size < 20 * 2**20
    net, meta = load_weights(TINY_SHAPES)
    assert net.cfg == WORLD_DIT                        # the script's defaults rebuild this architecture
    assert meta["pretrain"] == asdict(PretrainConfig())    # the script's defaults rebuild these weights
    assert policy.guidance == meta["guidance"] == PretrainConfig().guidance
    assert meta["log"]["step"] == meta["pretrain"]["steps"]
    assert 0.2 <= meta["heldout"]["test_reward"] <= 0.8   # the measured base reward leaves RL headroom
    r = heldout_reward(policy, FlowSDE(SamplerConfig()), load_split("test"), {"shapes": get_reward("shapes")},
                       {"shapes": 1.0}, 1, seed=3)
    assert 0.12 <= r["reward_mean"] <= 0.8, r
