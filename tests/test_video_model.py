"""The moving-shapes video model (models/video_latent.py) and its pretraining (training/pretrain_video.py): clips
through the shipped image autoencoder frame by frame and back, the frame-stacked latent through the unchanged
engine, and a few pretraining steps that write loadable weights."""

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
