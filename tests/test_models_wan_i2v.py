"""Wan2.1 image-to-video (models/wan.py WanI2VPolicy) on a tiny WanImageToVideoPipeline built from config
(tests/tinypipes.py): each prompt's first frame conditions every node of its tree (CLIP tokens in the
cross-attention, the condition latent on channels); the ODE rollout ends where the pipeline's own sampling ends,
trees roll out, GRPO trains LoRA and full weights, the LoRA exports and reloads, the CLI trains from a .jsonl."""

import json

import pytest
import torch
from clitools import one_line_error, run
from test_models_wan import TINY_CLIP_SETS, euler
from tinypipes import saved, tiny_wan_i2v

from treegrpo_cli.models.base import PolicyConfig

PROMPTS = ["a red cat", "a blue dog"]


@pytest.fixture(scope="module")
def i2v_dir(tmp_path_factory):
    return saved(tmp_path_factory, {"wan-i2v": tiny_wan_i2v})["wan-i2v"]


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    """A .jsonl giving each prompt a first frame (a 40 x 24 picture of its own; paths relative to the file)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("frames")
    g = torch.Generator().manual_seed(4)
    rows = []
    for i, prompt in enumerate(PROMPTS):
        pixels = (torch.rand(24, 40, 3, generator=g) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"f{i}.png")
        rows.append({"prompt": prompt, "image": f"f{i}.png"})
    (folder / "clips.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "clips.jsonl"


def load(folder, images, **opts):
    from treegrpo_cli.models.registry import load_policy

    opts = {"dtype": "fp32", "resolution": 32, "frames": 9, "images": str(images), **opts}
    return load_policy(str(folder), "cpu", PolicyConfig(**opts))


@pytest.mark.slow
def test_ode_rollout_equals_the_pipeline_sampling(i2v_dir, frames):
    """True CFG 5.0 (only the text negated), the Euler grid at shift 3: the engine's ODE rollout ends where
    WanImageToVideoPipeline ends from the same noise and the same first frame."""
    from diffusers import DiffusionPipeline
    from PIL import Image

    from treegrpo_cli.engine.rollout import TreeConfig, rollout

    policy = load(i2v_dir, frames)
    assert policy.adapter == "wan-i2v" and policy.latent_shape == (4, 3, 4, 4)
    tree, _ = rollout(policy, ["a blue dog"], [0], euler(), TreeConfig(sde_steps=()), seed=3)
    x0 = tree.latent[tree.depth == 0].clone()
    pipe = DiffusionPipeline.from_pretrained(i2v_dir, local_files_only=True)
    kw = dict(num_inference_steps=4, height=32, width=32, num_frames=9, max_sequence_length=512, guidance_scale=5.0)
    with torch.no_grad():
        image = Image.open(frames.parent / "f1.png").convert("RGB")
        theirs = pipe(image=image, prompt="a blue dog", latents=x0, output_type="latent", **kw).frames.float()
    torch.testing.assert_close(tree.image_latent, theirs, rtol=0, atol=1e-4)
    other, _ = rollout(policy, ["a red cat"], [0], euler(), TreeConfig(sde_steps=()), seed=3)  # same noise
    assert (other.image_latent - tree.image_latent).abs().max() > 1e-3  # another frame, another clip


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_a_tree_and_a_grpo_step(i2v_dir, frames, finetune):
    from treegrpo_cli.config import load_config
    from treegrpo_cli.engine.credit import assign_credit
    from treegrpo_cli.engine.grpo import Batch, grpo_update, make_optimizer
    from treegrpo_cli.engine.rollout import rollout

    policy = load(i2v_dir, frames, finetune=finetune)
    cfg = load_config("branch", sets=["sampler.steps=4", "tree.split_steps=[0, 1]", "tree.branch=2", "train.lr=0.01"])
    tree, _ = rollout(policy, PROMPTS, [0, 1], euler(), cfg.tree, seed=1)
    assert len(tree.leaves()) == 8 and torch.isfinite(tree.log_prob[tree.sde]).all()
    reward = torch.full((tree.num_nodes,), float("nan"))
    reward[tree.leaves()] = torch.rand(8, generator=torch.Generator().manual_seed(0))
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
    batch = Batch(tree, trained, adv.edge, policy.encode([PROMPTS[int(p)] for p in tree.tree_prompt]))
    metrics = grpo_update(policy, opt, euler(), batch, cfg.train, torch.Generator().manual_seed(0), max_batch=4)
    assert metrics["train_evals"] > 0 and metrics["ratio_first_dev"] < 1e-5
    assert any(not torch.equal(before[k], v) for k, v in policy.trainable_state().items())


@pytest.mark.slow
def test_lora_export_reloads_into_the_pipeline(i2v_dir, frames, tmp_path):
    from diffusers import DiffusionPipeline

    policy = load(i2v_dir, frames)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    x, sigma = torch.randn(1, *policy.latent_shape, generator=torch.Generator().manual_seed(2)), torch.tensor([0.6])
    cond = policy.encode(["a red cat"])
    with torch.no_grad():
        trained = policy.model_output(policy.denoiser, x, sigma, cond)
    assert policy.export(tmp_path / "lora", policy.trainable_state()) == ["pytorch_lora_weights.safetensors"]
    pipe = DiffusionPipeline.from_pretrained(i2v_dir, local_files_only=True)
    pipe.load_lora_weights(tmp_path / "lora")
    with torch.no_grad():
        reloaded = policy.model_output(pipe.transformer, x, sigma, cond)
    torch.testing.assert_close(reloaded, trained, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_adapter_counts_its_flops(i2v_dir, frames, finetune):
    """The Wan formula with the image embedder and the image tokens' K/V and attention equals one measured row."""
    from treegrpo_cli.models.flops import measure_policy_flops

    policy = load(i2v_dir, frames, finetune=finetune, lora_rank=4)
    policy.cache_prompts(["a red cat"])
    assert policy.flops_per_row() == measure_policy_flops(policy, "a red cat")


@pytest.mark.slow
def test_train_rollout_score_through_the_cli(i2v_dir, frames, tmp_path):
    """`--prompts clips.jsonl --set policy.images=clips.jsonl`: train 2 iterations, export, then the staged path."""
    sets = [
        *TINY_CLIP_SETS,
        f'policy.images="{frames}"',
        f'rollout.eval_prompts="{frames}"',
        "train.eval_samples=1",
        "rollout.num_prompts=2",
        'train.loss_norm="mean"',
    ]
    args = ["--model", i2v_dir, "--preset", "branch", "--prompts", frames, *(x for s in sets for x in ("--set", s))]
    r = run("train", *args, "--reward", "jpeg-compressibility", "--iterations", 2, "--run-dir", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "run" / "before_after.png").is_file()
    r = run("export", tmp_path / "run", "--out", tmp_path / "lora", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["files"] == ["pytorch_lora_weights.safetensors"], r.output
    r = run("rollout", *args, "-n", 2, "--out", tmp_path / "trees", "--json")
    assert r.exit_code == 0, r.output
    r = run("score", tmp_path / "trees", "--reward", "jpeg-compressibility", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["leaves"] == 8, r.output


@pytest.mark.slow
def test_first_frame_errors_are_one_line(i2v_dir, frames, tmp_path, monkeypatch):
    from treegrpo_cli.errors import ConfigError, TreegrpoError

    with pytest.raises(ConfigError, match="is image-to-video: give each prompt its first frame"):
        load(i2v_dir, "").encode(["a red cat"])
    with pytest.raises(ConfigError, match="max_sequence_length must be 512"):
        load(i2v_dir, frames, max_sequence_length=8)
    with pytest.raises(TreegrpoError, match="'a green bird' has no first frame in policy.images"):
        load(i2v_dir, frames).encode(["a green bird"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a red cat", "image": "nowhere.png"}\n')
    with pytest.raises(TreegrpoError, match="bad.jsonl:1: no image at"):
        load(i2v_dir, bad).encode(["a red cat"])
    bad.write_text('{"prompt": "a red cat"}\n')
    with pytest.raises(TreegrpoError, match='bad.jsonl:1: expected an object with "prompt" and "image"'):
        load(i2v_dir, bad).encode(["a red cat"])
    r = run("train", "--model", i2v_dir, "--run-dir", tmp_path / "r")
    one_line_error(r, "is image-to-video", "policy.images")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"
    one_line_error(run("train", "--model", "wan2.1-i2v-14b-480p", "--run-dir", tmp_path / "r2"), repo, "hf download")
