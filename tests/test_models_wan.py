"""Wan2.1 text-to-video (models/wan.py) on a tiny pipeline built from config (tests/tinypipes.py): rank-5 video
latents [B, C, F, h, w] through the unchanged engine: the ODE rollout ends where WanPipeline's own sampling ends, a
branching tree rolls out, a GRPO step trains LoRA and full weights, the LoRA exports and reloads into diffusers."""

import pytest
import torch
from clitools import one_line_error, run
from tinypipes import saved, tiny_wan

from treegrpo_cli.models.base import PolicyConfig


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    return saved(tmp_path_factory, {"wan": tiny_wan})["wan"]


# a 4-step tree of 9-frame 32 px clips on the tiny pipelines, for the CLI tests
TINY_CLIP_SETS = (
    "sampler.steps=4",
    "tree.split_steps=[0, 1]",
    "tree.branch=2",
    "policy.resolution=32",
    'policy.dtype="fp32"',
    "policy.frames=9",
)


def load(folder, **opts):
    from treegrpo_cli.models.registry import load_policy

    opts = {"dtype": "fp32", "resolution": 32, "max_sequence_length": 8, "frames": 9, **opts}
    return load_policy(str(folder), "cpu", PolicyConfig(**opts))


def euler(steps=4):
    from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig

    return FlowSDE(
        SamplerConfig(steps=steps, grid="flow-match-euler", shift=3.0, decode="final", noise="flow", eta=0.7)
    )


@pytest.mark.slow
def test_ode_rollout_equals_the_pipeline_sampling(wan_dir):
    """True CFG 5.0 against the empty negative prompt, the scheduler's Euler grid at shift 3: the engine's ODE
    rollout of a [4, 3, 4, 4] video latent ends where WanPipeline ends from the same noise."""
    from diffusers import DiffusionPipeline

    from treegrpo_cli.engine.rollout import TreeConfig, rollout

    policy = load(wan_dir)
    assert policy.latent_shape == (4, 3, 4, 4) and policy.evals_per_row == 2
    tree, _ = rollout(policy, ["a red cat"], [0], euler(), TreeConfig(sde_steps=()), seed=3)
    x0 = tree.latent[tree.depth == 0].clone()  # [1, 4, 3, 4, 4]
    pipe = DiffusionPipeline.from_pretrained(wan_dir, local_files_only=True)
    kw = dict(num_inference_steps=4, height=32, width=32, num_frames=9, max_sequence_length=8, guidance_scale=5.0)
    with torch.no_grad():
        theirs = pipe(prompt="a red cat", latents=x0, output_type="latent", **kw).frames.float()
    torch.testing.assert_close(tree.image_latent, theirs, rtol=0, atol=1e-4)
    assert (tree.image_latent - x0).abs().max() > 0.1
    video = policy.decode(tree.image_latent)
    assert video.shape == (1, 3, 9, 32, 32) and 0 <= float(video.min()) and float(video.max()) <= 1


def test_a_branching_tree_of_video_latents(wan_dir):
    """Splits at steps 0 and 1 into 2: 4 leaves per prompt with distinct latents and finite log-probs, and the
    same tree whatever the forward batch."""
    from treegrpo_cli.engine.rollout import TreeConfig, rollout

    policy = load(wan_dir)
    cfg = TreeConfig(split_steps=(0, 1), branch=2, sde_steps=(0, 1, 2))
    a, nfe = rollout(policy, ["a red cat", "a blue dog"], [0, 1], euler(), cfg, seed=5)
    b, _ = rollout(policy, ["a red cat", "a blue dog"], [0, 1], euler(), cfg, seed=5, max_batch=3)
    leaves = a.leaves()
    assert len(leaves) == 8 and a.latent.shape[1:] == (4, 3, 4, 4)
    assert (
        torch.isfinite(a.log_prob[a.sde]).all()
        and len({tuple(a.latent[i].flatten()[:4].tolist()) for i in leaves}) == 8
    )
    torch.testing.assert_close(a.latent, b.latent, rtol=0, atol=1e-5)
    assert nfe == 2 * policy.evals_per_row * (1 + 2 + 4 + 4)  # rows per step (4 steps) x 2 network rows (CFG)


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_a_grpo_step_trains_the_video_model(wan_dir, finetune):
    from treegrpo_cli.config import load_config
    from treegrpo_cli.engine.credit import assign_credit
    from treegrpo_cli.engine.grpo import Batch, grpo_update, make_optimizer
    from treegrpo_cli.engine.rollout import rollout

    policy = load(wan_dir, finetune=finetune)
    cfg = load_config("branch", sets=["sampler.steps=4", "tree.split_steps=[0, 1]", "tree.branch=2", "train.lr=0.01"])
    kernel, prompts = euler(), ["a red cat", "a blue dog"]
    tree, _ = rollout(policy, prompts, [0, 1], kernel, cfg.tree, seed=1)
    reward = torch.full((tree.num_nodes,), float("nan"))
    reward[tree.leaves()] = torch.rand(len(tree.leaves()), generator=torch.Generator().manual_seed(0))
    adv, trained = assign_credit(
        tree,
        {"r": reward},
        weights={"r": 1.0},
        combine_mode="rewards",
        advantage=cfg.advantage,
        pruning=cfg.pruning,
        steps=4,
        decode="final",
    )
    before = {k: v.clone() for k, v in policy.trainable_state().items()}
    opt = make_optimizer(policy.trainable_parameters(), cfg.train)
    batch = Batch(tree, trained, adv.edge, policy.encode([prompts[int(p)] for p in tree.tree_prompt]))
    metrics = grpo_update(policy, opt, kernel, batch, cfg.train, torch.Generator().manual_seed(0), max_batch=4)
    assert metrics["train_evals"] > 0 and metrics["ratio_first_dev"] < 1e-5  # before any update: on-policy
    assert any(not torch.equal(before[k], v) for k, v in policy.trainable_state().items())


def test_lora_export_reloads_into_the_pipeline(wan_dir, tmp_path):
    from diffusers import DiffusionPipeline

    policy = load(wan_dir)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    x, sigma = torch.randn(1, *policy.latent_shape, generator=torch.Generator().manual_seed(2)), torch.tensor([0.6])
    with torch.no_grad():
        trained = policy.model_output(policy.denoiser, x, sigma, policy.encode(["a red cat"]))
    assert policy.export(tmp_path / "lora", policy.trainable_state()) == ["pytorch_lora_weights.safetensors"]
    pipe = DiffusionPipeline.from_pretrained(wan_dir, local_files_only=True)
    pipe.load_lora_weights(tmp_path / "lora")
    with torch.no_grad():
        reloaded = policy.model_output(pipe.transformer, x, sigma, policy.encode(["a red cat"]))
    torch.testing.assert_close(reloaded, trained, rtol=0, atol=1e-5)


def test_bad_frame_count_and_missing_weights_are_one_line(wan_dir, tmp_path, monkeypatch):
    from treegrpo_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="policy.frames 10 must be 1 more than a multiple of 4"):
        load(wan_dir, frames=10)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    one_line_error(run("train", "--model", "wan2.1-t2v-1.3b", "--run-dir", tmp_path / "r"), repo, f"hf download {repo}")


@pytest.mark.slow
def test_train_rollout_score_on_video_through_the_cli(wan_dir, tmp_path):
    """`treegrpo train` on the tiny Wan pipeline: an image reward scores the clips frame by frame (every second
    frame with reward.frame_stride 2), the held-out curve and the sample grids (clip strips) are written, the
    LoRA exports; `rollout` then `score` give the staged path the same scores."""
    import json

    sets = [
        *TINY_CLIP_SETS,
        "policy.max_sequence_length=8",
        "train.eval_samples=1",
        "train.sample_every=2",
        "rollout.num_prompts=2",
        'train.loss_norm="mean"',
        "train.lr=0.01",
        "reward.frame_stride=2",
    ]
    args = ["--model", wan_dir, "--preset", "branch", *(x for s in sets for x in ("--set", s))]
    run_dir = tmp_path / "run"
    r = run("train", *args, "--reward", "jpeg-compressibility", "--iterations", 2, "--run-dir", run_dir, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["iterations"] == 2 and "heldout_gain" in summary
    assert (run_dir / "before_after.png").is_file() and (run_dir / "samples" / "step-2.png").is_file()
    r = run("export", run_dir, "--out", tmp_path / "lora", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["files"] == ["pytorch_lora_weights.safetensors"], r.output
    r = run("rollout", *args, "-n", 2, "--out", tmp_path / "trees", "--json")
    assert r.exit_code == 0, r.output
    r = run("score", tmp_path / "trees", "--reward", "jpeg-compressibility", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["leaves"] == 8, r.output


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_adapter_counts_its_flops(wan_dir, finetune):
    """flops_per_row: the formula (models/wan.py wan_flops) on the adapter's shapes, equal to one measured row."""
    from treegrpo_cli.models.flops import measure_policy_flops

    policy = load(wan_dir, finetune=finetune, lora_rank=4)
    policy.cache_prompts(["a red cat"])
    assert policy.flops_per_row() == measure_policy_flops(policy, "a red cat")
