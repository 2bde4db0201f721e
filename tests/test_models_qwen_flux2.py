"""Qwen-Image, FLUX.2 [dev] and [klein] (base and step-distilled), SD3.5 Large-shaped SD3, and FLUX.1 on the
model grid, on tiny pipelines built from config (tests/tinypipes.py): the engine's ODE rollout ends where the
pipeline's own sampling ends; rollout, score, a GRPO and a DiffusionNFT step with LoRA and with full weights,
export and reload through the CLI."""

import json

import pytest
import torch
from clitools import one_line_error, run
from test_models_diffusers import TINY, check_lora_reload, train_one_iteration
from tinypipes import BUILDERS, saved, sd3_large_shaped, tiny_flux

from treegrpo_cli.models.base import PolicyConfig

NEW = tuple(BUILDERS)  # qwenimage, flux2-dev, flux2-klein, flux2-klein-distilled
QWEN_TEXT = 256  # Qwen-Image keeps prompts at their own length up to this: " " and "a red cat" differ


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return saved(tmp_path_factory, {**BUILDERS, "flux": tiny_flux, "sd3-large": sd3_large_shaped})


def load(folder, **opts):
    from treegrpo_cli.models.registry import load_policy

    opts = {"dtype": "fp32", "resolution": 16, "max_sequence_length": 8, **opts}
    return load_policy(str(folder), "cpu", PolicyConfig(**opts))


def pipeline_latents(folder, name, x0, steps):
    """The pipeline's own sampling from x0 [1, C, h, w] (in the adapter's latent layout), packed as it returns it."""
    from diffusers import DiffusionPipeline

    from treegrpo_cli.models.flux import pack

    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    kw = {"prompt": "a red cat", "num_inference_steps": steps, "height": 16, "width": 16, "output_type": "latent"}
    if name == "qwenimage":
        kw.update(true_cfg_scale=4.0, negative_prompt=" ", max_sequence_length=QWEN_TEXT, latents=pack(x0))
    elif name == "flux":
        kw.update(guidance_scale=3.5, max_sequence_length=8, latents=pack(x0))
    else:  # FLUX.2 takes the unpacked patchified latent
        kw.update(guidance_scale=4.0, max_sequence_length=8, latents=x0)
    with torch.no_grad():
        return pipe(**kw).images.float()


@pytest.mark.slow
@pytest.mark.parametrize("name", [*NEW, "flux"])
def test_ode_rollout_equals_the_pipeline_sampling(dirs, name):
    """sampler.grid = "model" with each model's guidance: the engine's ODE rollout (no SDE step) ends where the
    pipeline ends from the same initial latent and prompt (Qwen-Image: true CFG 4.0 with its per-token
    renormalisation and prompts of different lengths; FLUX.2 [dev]: embedded guidance 4.0; [klein] base:
    true CFG 4.0; [klein] distilled: none; FLUX.1-dev on its pipeline's dynamic shift)."""
    from treegrpo_cli.engine.rollout import TreeConfig, rollout
    from treegrpo_cli.engine.sde import SamplerConfig
    from treegrpo_cli.models.flux import pack
    from treegrpo_cli.models.flux2 import flatten

    policy = load(dirs[name], **({"max_sequence_length": QWEN_TEXT} if name == "qwenimage" else {}))
    sde = policy.kernel(SamplerConfig(steps=4, grid="model", decode="final"))
    tree, _ = rollout(policy, ["a red cat"], [0], sde, TreeConfig(sde_steps=()), seed=3)
    x0 = tree.latent[tree.depth == 0].clone()
    theirs = pipeline_latents(dirs[name], name, x0, 4)
    if name.startswith("flux2-klein"):  # Flux2KleinPipeline returns the VAE's latent: our decode's input
        ours = policy._vae_in(tree.image_latent)
    else:  # packed tokens
        ours = (flatten if name.startswith("flux2") else pack)(tree.image_latent)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    assert (tree.image_latent - x0).abs().max() > 0.1  # it moved
    assert policy.evals_per_row == (2 if name in ("qwenimage", "flux2-klein") else 1)


@pytest.mark.slow
def test_model_grid_is_the_pipelines_dynamic_shift(dirs):
    """FLUX.2's empirical mu and Qwen-Image's shift_terminal: the model grid equals the scheduler's sigmas after
    the pipeline's own set_timesteps call, and differs from the presets' fixed shift."""
    import numpy as np
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    from treegrpo_cli.models.flux2 import empirical_mu

    for tokens, steps in [(16, 4), (4096, 28), (4300, 50), (8192, 50)]:
        assert empirical_mu(tokens, steps) == pytest.approx(compute_empirical_mu(tokens, steps), rel=1e-6)
    q = load(dirs["qwenimage"])
    sched = q.pipe.scheduler
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / 6, 6), mu=q.shift_mu(6))
    assert torch.equal(q.model_sigmas(6), sched.sigmas.double())
    assert float(q.model_sigmas(6)[-2]) == pytest.approx(0.02, abs=1e-6)  # shift_terminal: the last sigma > 0


def test_qwen_rows_of_different_prompt_lengths_equal_each_alone(dirs):
    """A batch pads shorter prompts and masks them: each row's velocity equals that prompt's alone."""
    policy = load(dirs["qwenimage"], max_sequence_length=QWEN_TEXT)
    prompts = ["a red cat", "a big blue square on a small green circle"]
    cond = policy.encode(prompts)
    assert cond["prompt_mask"].sum(1).tolist()[0] < cond["prompt_mask"].shape[1]
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.7, 0.7])
    with torch.no_grad():
        both = policy.velocity(x, sigma, cond)
        alone = [policy.velocity(x[i : i + 1], sigma[:1], policy.encode([p])) for i, p in enumerate(prompts)]
    torch.testing.assert_close(both, torch.cat(alone), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_flux2_lora_targets_reach_the_single_stream_blocks(dirs):
    policy = load(dirs["flux2-klein"])
    names = {n.rsplit(".lora_", 1)[0] for n, p in policy.denoiser.named_parameters() if p.requires_grad}
    assert "single_transformer_blocks.1.attn.to_out" in names
    assert "single_transformer_blocks.0.attn.to_qkv_mlp_proj" in names
    assert "transformer_blocks.0.ff_context.linear_out" in names and "proj_out" not in names
    qwen = load(dirs["qwenimage"])
    assert len(qwen.describe()["lora"]["targets"]) == 12 and qwen.describe()["lora"]["rank"] == 64


@pytest.mark.slow
@pytest.mark.parametrize("name", [*NEW, "sd3-large"])
def test_rollout_score_train_export_reload(dirs, tmp_path, name):
    folder, trees, run_dir, out = dirs[name], tmp_path / "trees", tmp_path / "run", tmp_path / "lora"
    r = run("rollout", "--model", folder, "--preset", "branch", *TINY, "-n", 2, "--out", trees, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["leaves_per_tree"] == 4
    r = run("score", trees, "--reward", "jpeg-compressibility", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["leaves"] == 8, r.output
    sets = ["rollout.num_prompts=2", "train.lr=0.01", "train.kl_beta=0.01", 'train.loss_norm="mean"']
    args = ["--model", folder, "--preset", "branch", *TINY, *(x for s in sets for x in ("--set", s))]
    r = run("train", *args, "--iterations", 2, "--run-dir", run_dir, "--json")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["optimizer_steps"] == 1 and abs(rows[0]["ratio_max"] - 1) < 1e-5
    assert rows[0]["kl_ref"] < 1e-12 < rows[1]["kl_ref"]
    run_json = json.loads((run_dir / "run.json").read_text())
    grid = "flow-match-euler" if name == "sd3-large" else "model"  # the adapter's default
    assert run_json["config"]["sampler"]["grid"] == grid
    r = run("export", run_dir, "--out", out, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["files"] == ["pytorch_lora_weights.safetensors"], r.output
    check_lora_reload(folder, run_dir, out, "sd3" if name == "sd3-large" else name, ema=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwenimage", "flux2-dev", "flux2-klein", "sd3-large"])
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_one_grpo_and_one_nft_step(dirs, tmp_path, name, finetune):
    row = train_one_iteration(dirs[name], tmp_path / "grpo", "tree-grpo", finetune, ["rollout.num_prompts=1"])
    assert row["optimizer_steps"] >= 1 and row["grad_norm"] > 0
    sets = ["tree.split_steps=[]", "tree.trees_per_prompt=3", "rollout.num_prompts=2", "train.lr=0.01"]
    row = train_one_iteration(dirs[name], tmp_path / "nft", "nft", finetune, sets)
    assert row["optimizer_steps"] == 1 and row["train_evals"] == 6 * 3 and row["grad_norm"] > 0


@pytest.mark.parametrize(
    "model, repo", [("qwen-image", "Qwen/Qwen-Image"), ("flux2-dev", "black-forest-labs/FLUX.2-dev")]
)
def test_known_names_without_weights_are_one_line(tmp_path, monkeypatch, model, repo):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    one_line_error(run("train", "--model", model, "--run-dir", tmp_path / "r"), repo, f"hf download {repo}")
