"""The moving-shapes video model (models/video_latent.py) and its pretraining (training/pretrain_video.py): clips
through the shipped image autoencoder frame by frame and back, the frame-stacked latent through the unchanged
engine, and a few pretraining steps that write loadable weights."""

import pytest
import torch

from treegrpo_cli.engine.rollout import TreeConfig, rollout
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.models.latent_file import load_weights
from treegrpo_cli.models.registry import TINY_SHAPES
from treegrpo_cli.models.video_latent import VideoLatentPolicy, new_video_model
from treegrpo_cli.rewards.motion import motion_scores
from treegrpo_cli.training.pretrain import PretrainConfig
from treegrpo_cli.training.pretrain_video import pretrain_video
from treegrpo_cli.world.motion import FRAMES, render_clips, split_motion_prompts


def shipped_ae():
    return load_weights(TINY_SHAPES)[1].requires_grad_(False).eval()


def test_clips_round_trip_through_the_image_autoencoder():
    """encode_images -> [B, 8 x 4, 8, 8], decode -> [B, 3, 8, 32, 32]: the world's clips come back close enough
    that the motion-shapes reward still gives them full marks."""
    policy = new_video_model(shipped_ae(), FRAMES, depth=1, dim=32)
    prompts = ["a red circle moving left", "two big blue squares moving up", "a green triangle moving down"]
    clips = render_clips(prompts, 0)
    z = policy.encode_images(clips)
    assert z.shape == (3, FRAMES * 4, 8, 8) and policy.latent_shape == (FRAMES * 4, 8, 8)
    back = policy.decode(z)
    assert back.shape == clips.shape
    assert float(motion_scores(back, prompts).min()) == 1.0
    # frame f of the clip is the latent's channels 4f .. 4f+3
    torch.testing.assert_close(policy.encode_images(clips[:, :, 3:4])[0], z[0, 12:16])


def test_the_video_latent_rolls_out_through_the_engine():
    policy = new_video_model(shipped_ae(), FRAMES, depth=1, dim=32)
    sde = FlowSDE(SamplerConfig(steps=3))
    tree, nfe = rollout(policy, ["a red circle moving left"], [0], sde, TreeConfig(split_steps=(0,), branch=2), seed=1)
    assert len(tree.leaves()) == 2 and nfe == 5
    assert policy.decode(tree.image_latent).shape == (2, 3, FRAMES, 32, 32)
    assert isinstance(policy.reference(), VideoLatentPolicy)


@pytest.mark.slow
def test_a_few_pretraining_steps_write_loadable_weights(tmp_path):
    rows = []
    cfg = PretrainConfig(steps=3, batch=4, eval_every=3, eval_steps=2, depth=1, dim=32, warmup=1)
    row = pretrain_video(cfg, shipped_ae(), tmp_path / "w.safetensors", rows.append)
    assert rows == [row] and row["step"] == 3 and row["clips"] == 12 and 0.0 <= row["test_reward"] <= 1.0
    net, ae, meta = load_weights(tmp_path / "w.safetensors")
    assert meta["frames"] == FRAMES and net.cfg.channels == FRAMES * 4 and "moving" in net.cfg.vocab
    assert len(split_motion_prompts()[2]) == 48


def test_the_clip_bank_renews_its_oldest_clips():
    """ClipBank: a refresh of n encodes n new clips over the oldest n (a ring); batches come from the whole bank;
    a bank of one batch gives exactly its clips."""
    from treegrpo_cli.training.pretrain_video import ClipBank

    policy = new_video_model(shipped_ae(), FRAMES, depth=1, dim=32)
    g = torch.Generator().manual_seed(0)
    bank = ClipBank(policy, split_motion_prompts()[0], 6, g)
    first = bank.latents.clone()
    bank.refresh(4)
    assert torch.equal(bank.latents[4:], first[4:]) and not torch.equal(bank.latents[:4], first[:4])
    bank.refresh(4)  # wraps round: 4, 5, then 0, 1
    assert bank.next == 2 and not torch.equal(bank.latents[4:], first[4:])
    caps, z = bank.sample(6)
    assert caps == bank.captions and torch.equal(z, bank.latents)
    caps, z = bank.sample(3)
    rows = [next(i for i in range(6) if torch.equal(bank.latents[i], r)) for r in z]
    assert caps == [bank.captions[i] for i in rows]


def test_prompt_lists_are_the_worlds_split():
    from treegrpo_cli.prompts import load_prompts

    pretrain, rl, test = split_motion_prompts()
    assert load_prompts("motion-pretrain") == pretrain and load_prompts("motion-train") == rl
    assert load_prompts("motion-test") == test and not set(rl) & set(test)


@pytest.mark.slow
def test_a_video_weights_file_trains_through_the_cli(tmp_path):
    """--model FILE of scripts/pretrain_shapes_video.py is a video model (frames in its metadata): train with the
    motion-shapes reward on the world's prompts writes the held-out curve and a before/after clip strip."""
    import json

    from clitools import run

    from treegrpo_cli.models.registry import load_policy

    cfg = PretrainConfig(steps=2, batch=4, eval_every=2, eval_steps=2, depth=1, dim=32, warmup=1)
    pretrain_video(cfg, shipped_ae(), tmp_path / "v.safetensors")
    policy = load_policy(str(tmp_path / "v.safetensors"))
    assert isinstance(policy, VideoLatentPolicy) and policy.frames == FRAMES
    sets = ["rollout.num_prompts=2", "train.eval_samples=1", "sampler.steps=4", "tree.split_steps=[0, 2]"]
    r = run(
        "train",
        "--model",
        tmp_path / "v.safetensors",
        "--preset",
        "tree-grpo",
        "--reward",
        "motion-shapes",
        "--prompts",
        "motion-train",
        "--iterations",
        2,
        "--run-dir",
        tmp_path / "run",
        "--json",
        *(x for s in [*sets, 'rollout.eval_prompts="motion-test"'] for x in ("--set", s)),
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iterations"] == 2 and (tmp_path / "run" / "before_after.png").is_file()


def test_missing_embedded_video_weights_is_one_line(tmp_path, monkeypatch):
    from clitools import one_line_error, run

    from treegrpo_cli.models import registry

    monkeypatch.setitem(registry.EMBEDDED, "tiny-shapes-video", (tmp_path / "none.safetensors", ""))
    r = run("train", "--model", "tiny-shapes-video", "--run-dir", tmp_path / "r")
    one_line_error(r, "model weights not found", "pretrain_shapes_video.py")


@pytest.mark.slow
def test_pretraining_goes_on_from_a_weights_file(tmp_path):
    """init=W (the equal-compute control's start): the DiT starts from W's weights and its autoencoder is W's."""
    cfg = PretrainConfig(steps=1, batch=4, eval_every=1, eval_steps=2, depth=1, dim=32, warmup=1)
    pretrain_video(cfg, shipped_ae(), tmp_path / "a.safetensors")
    a_net, a_ae, _ = load_weights(tmp_path / "a.safetensors")
    tiny_lr = PretrainConfig(steps=1, batch=4, eval_every=1, eval_steps=2, warmup=1, lr=1e-9, ema=0.0)
    pretrain_video(tiny_lr, None, tmp_path / "b.safetensors", init=tmp_path / "a.safetensors")
    b_net, b_ae, _ = load_weights(tmp_path / "b.safetensors")
    assert b_net.cfg == a_net.cfg  # not PretrainConfig's default depth and width: the file's
    for (k, v), w in zip(a_net.state_dict().items(), b_net.state_dict().values(), strict=True):
        torch.testing.assert_close(w, v, rtol=0, atol=1e-6, msg=k)
    assert all(torch.equal(v, b_ae.state_dict()[k]) for k, v in a_ae.state_dict().items())


@pytest.mark.slow
def test_shipped_video_weights_load_and_draw_moving_shapes():
    """tiny-shapes-video: the packaged weights (sha256 checked at load), built by the script's defaults on the
    image world's autoencoder; one ODE sample of each held-out prompt scores well above nothing (0.196 when
    shipped, from 0.01 at 500 steps; docs/world.md), which leaves RL most of the reward to gain."""
    from treegrpo_cli.models.registry import TINY_SHAPES_VIDEO, load_policy

    policy = load_policy("tiny-shapes-video")
    assert isinstance(policy, VideoLatentPolicy) and policy.frames == FRAMES and policy.name == "tiny-shapes-video"
    assert TINY_SHAPES_VIDEO.stat().st_size < 20 * 2**20
    net, ae, meta = load_weights(TINY_SHAPES_VIDEO)
    shipped_ae_state = shipped_ae().state_dict()
    assert all(torch.equal(v, shipped_ae_state[k]) for k, v in ae.state_dict().items())
    recipe = {k: v for k, v in meta["pretrain"].items() if k not in ("bank", "refresh")}
    assert recipe == {**vars(PretrainConfig()), "steps": 8000, "batch": 64, "eval_every": 500, "minutes": 85.0}
    assert (meta["pretrain"]["bank"], meta["pretrain"]["refresh"]) == (8192, 8) and meta["log"]["step"] == 8000
    test = split_motion_prompts()[2]
    ode = FlowSDE(SamplerConfig(steps=10))
    tree, _ = rollout(policy, test, list(range(len(test))), ode, TreeConfig(sde_steps=()), 3)
    assert 0.1 <= float(motion_scores(policy.decode(tree.image_latent), test).mean()) <= 0.5
