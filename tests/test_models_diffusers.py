"""The diffusers adapters (FLUX, SD3, SD1.5) end to end on tiny pipelines built from config.

Each pipeline is assembled from random-weight components with in-memory tokenizers (no files from any
hub, deps-and-weights.md section 5), saved with save_pretrained, and loaded back by path through the
real `--model` code: rollout, score, a 2-iteration train, LoRA export and reload, on the CPU in fp32.
"""

import json

import pytest
import torch
from clitools import one_line_error, run
from tinypipes import load_pipe, outputs, policy_of, saved, sd3_large_shaped, tiny_flux, tiny_sd, tiny_sd3

ADAPTERS = ("flux", "sd3", "sd")
# 2 prompts x (a 4-step tree splitting into 2 at steps 0 and 1): 4 leaves per tree; 16 px images
TINY = [
    "--set",
    "sampler.steps=4",
    "--set",
    "tree.split_steps=[0, 1]",
    "--set",
    "tree.branch=2",
    "--set",
    "policy.resolution=16",
    "--set",
    'policy.dtype="fp32"',
    "--set",
    "policy.max_sequence_length=8",
    "--set",
    "train.eval_samples=0",
    "--set",
    "train.sample_every=0",
]


BUILDERS = {"flux": tiny_flux, "sd3": tiny_sd3, "sd": tiny_sd}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """The three tiny pipelines (FLUX, SD3, SD1.5)."""
    return saved(tmp_path_factory, BUILDERS)


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_rollout_score_train_export_reload(model_dirs, tmp_path, adapter):
    folder, trees, run_dir, out = model_dirs[adapter], tmp_path / "trees", tmp_path / "run", tmp_path / "lora"
    r = run("rollout", "--model", folder, "--preset", "branch", *TINY, "-n", 2, "--out", trees, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["trees"] == 2 and summary["leaves_per_tree"] == 4
    r = run("score", trees, "--reward", "jpeg-compressibility", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["leaves"] == 8
    ema = ["--set", "train.ema_decay=0.5"] if adapter == "flux" else []
    r = run(
        "train",
        "--model",
        folder,
        "--preset",
        "branch",
        *TINY,
        "--set",
        "rollout.num_prompts=2",
        *ema,
        "--set",
        "train.lr=0.01",
        "--set",
        "train.kl_beta=0.01",
        "--set",
        'train.loss_norm="mean"',  # one step of the mean (the preset's code schedule steps every 12 transitions)
        "--iterations",
        2,
        "--run-dir",
        run_dir,
        "--json",
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1] and all(row["edges"] > 0 for row in rows)
    first = rows[0]  # one optimizer step per iteration: every ratio of iteration 0 is before the first update
    assert first["optimizer_steps"] == 1 and abs(first["ratio_min"] - 1) < 1e-5 and abs(first["ratio_max"] - 1) < 1e-5
    assert all(row["ratio_first_dev"] < 1e-5 for row in rows)
    assert first["kl_ref"] < 1e-12 < rows[1]["kl_ref"]  # the adapter-disabled reference is the start
    r = run("export", run_dir, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["ema"] == (adapter == "flux") and info["files"] == ["pytorch_lora_weights.safetensors"]
    one_line_error(run("export", run_dir, "--out", out), "not empty", "--overwrite")
    one_line_error(run("export", run_dir, "--step", 7, "--out", tmp_path / "x"), "no checkpoint of step 7 (have: 2)")
    (tmp_path / "a-file").write_text("")
    one_line_error(run("export", run_dir, "--out", tmp_path / "a-file"), "exists and is not a folder")
    check_lora_reload(folder, run_dir, out, adapter, info["ema"])


def check_lora_reload(folder, run_dir, out, adapter, ema):
    from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint

    ck = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    assert ck.model and all(".lora_" in k for k in ck.model)  # only the adapter is checkpointed
    policy = policy_of(folder)
    base = outputs(policy, policy.denoiser)
    policy.load_trainable_state(ck.ema if ema else ck.model)
    trained = outputs(policy, policy.denoiser)
    pipe = load_pipe(folder)
    pipe.load_lora_weights(out)
    net = pipe.unet if adapter == "sd" else pipe.transformer
    reloaded = outputs(policy, net)
    assert (trained - base).abs().max() > 1e-3  # training moved the model
    assert torch.allclose(reloaded, trained, atol=1e-5, rtol=0), (reloaded - trained).abs().max()


def train_one_iteration(folder, run_dir, preset, finetune, sets):
    """`treegrpo train` for one iteration on a tiny pipeline; its metrics row."""
    args = ["--model", folder, "--preset", preset, *TINY, *(x for s in sets for x in ("--set", s))]
    r = run("train", *args, "--finetune", finetune, "--iterations", 1, "--run-dir", run_dir, "--json")
    assert r.exit_code == 0, r.output
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.slow
def test_full_finetune_exports_a_model_folder(model_dirs, tmp_path):
    from diffusers import UNet2DConditionModel

    from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint

    folder, run_dir, out = model_dirs["sd"], tmp_path / "run", tmp_path / "full"
    sets = ["tree.split_steps=[]", "tree.trees_per_prompt=2", "train.lr=1e-3"]
    row = train_one_iteration(folder, run_dir, "flow-grpo", "full", sets)
    assert row["ratio_first_dev"] < 1e-5
    ck = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    policy = policy_of(folder, finetune="full")
    assert set(ck.model) == {k for k, _ in policy.denoiser.named_parameters()}  # every UNet weight
    r = run("export", run_dir, "--out", out, "--no-ema", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["files"] == ["unet/"], r.output
    base = outputs(policy, policy.denoiser)
    policy.load_trainable_state(ck.model)
    unet = UNet2DConditionModel.from_pretrained(out / "unet")
    reloaded, trained = outputs(policy, unet), outputs(policy, policy.denoiser)
    assert (trained - base).abs().max() > 1e-4 and torch.allclose(reloaded, trained, atol=1e-5, rtol=0)


def test_flux_dev_without_weights_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    r = run("train", "--model", "flux-dev", "--iterations", 1, "--run-dir", tmp_path / "run")
    one_line_error(r, "flux-dev", "black-forest-labs/FLUX.1-dev", "missing", "model_index.json", "--model")
    assert not (tmp_path / "run").exists()


def test_sd35_large_without_weights_is_one_line_and_samples_at_its_guidance(tmp_path, monkeypatch):
    from treegrpo_cli.models.registry import model_defaults

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    r = run("train", "--model", "sd3.5-large", "--iterations", 1, "--run-dir", tmp_path / "run")
    one_line_error(r, "sd3.5-large", "stabilityai/stable-diffusion-3.5-large", "missing", "--model")
    assert not (tmp_path / "run").exists()
    assert model_defaults("sd3.5-large")["policy.guidance"] == 3.5
    assert "policy.guidance" not in model_defaults("sd3.5-medium")  # the adapter's 4.5


@pytest.mark.slow
def test_incomplete_folder_names_the_missing_files(model_dirs, tmp_path):
    import shutil

    folder = tmp_path / "flux"
    shutil.copytree(model_dirs["flux"], folder)
    for f in (folder / "transformer").glob("*.safetensors"):
        f.unlink()
    (folder / "vae" / "config.json").unlink()
    r = run("rollout", "--model", folder, *TINY, "-n", 1, "--out", tmp_path / "t")
    one_line_error(r, "transformer/*.safetensors", "vae/config.json", "--model")


def test_bad_lora_target_is_one_line(model_dirs, tmp_path):
    r = run(
        "train", "--model", model_dirs["sd3"], *TINY, "--lora-targets", "no_such_layer", "--run-dir", tmp_path / "r"
    )
    one_line_error(r, "policy.lora_targets")


@pytest.mark.slow
def test_prompt_cache_on_disk_and_freed_encoders(model_dirs, tmp_path):
    from treegrpo_cli.errors import TreegrpoError

    cache = tmp_path / "embeddings"
    policy = policy_of(model_dirs["sd3"], prompt_cache=str(cache), free_text_encoders=True)
    want = policy.encode(["a cat", "a dog"])
    policy.cache_prompts(["a cat", "a dog"])
    assert policy.pipe.text_encoder is None and policy.pipe.text_encoder_3 is None
    assert len(list(cache.glob("*.safetensors"))) == 3  # two prompts and the empty one (CFG)
    assert all(torch.equal(want[k], v) for k, v in policy.encode(["a cat", "a dog"]).items())
    with pytest.raises(TreegrpoError, match="text encoders were freed"):
        policy.encode(["a bird"])
    again = policy_of(model_dirs["sd3"], prompt_cache=str(cache))  # a new process reads the disk cache
    again.free_text_encoders()
    got = again.encode(["a dog", "a cat"])
    assert all(torch.equal(v, want[k][[1, 0]]) for k, v in got.items())


def test_ddim_kernel_matches_diffusers():
    from diffusers import DDIMScheduler

    from treegrpo_cli.engine.sde import DDIMKernel, SamplerConfig

    sched = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    sched.set_timesteps(10)
    kern = DDIMKernel(
        SamplerConfig(steps=10), sched.alphas_cumprod, sched.timesteps, 1000, float(sched.final_alpha_cumprod), eta=1.0
    )
    g = torch.Generator().manual_seed(0)
    x, eps, noise = (torch.randn(2, 4, 8, 8, generator=g) for _ in range(3))
    for i in (0, 4, 9):
        t = sched.timesteps[i]
        ode = sched.step(eps, t, x, eta=0.0).prev_sample
        sde = sched.step(eps, t, x, eta=1.0, variance_noise=noise).prev_sample
        idx = torch.full((2,), i)
        res = kern.step(x, eps, idx, torch.tensor([False, False]))
        assert torch.allclose(res.mean, ode, atol=1e-5) and (res.std == 0).all()
        res = kern.step(x, eps, idx, torch.tensor([True, True]))
        assert torch.allclose(res.mean + res.std.view(-1, 1, 1, 1) * noise, sde, atol=1e-5)
        assert kern.sigmas[i] == float(t) / 1000
    lp = kern.log_prob(res.mean + res.std.view(-1, 1, 1, 1) * noise, res.mean, res.std)
    want = (-(noise**2) / 2 - res.std.view(-1, 1, 1, 1).log() - 0.5 * torch.log(torch.tensor(2 * torch.pi))).mean(
        (1, 2, 3)
    )
    assert torch.allclose(lp, want, atol=1e-5)


def test_flux_packing_matches_diffusers():
    from diffusers import FluxPipeline

    from treegrpo_cli.models.flux import image_ids, pack, unpack

    x = torch.randn(2, 16, 6, 8)
    assert torch.equal(pack(x), FluxPipeline._pack_latents(x, 2, 16, 6, 8))
    assert torch.equal(unpack(pack(x), 6, 8), x)
    assert torch.equal(
        image_ids(3, 4, x.device, x.dtype), FluxPipeline._prepare_latent_image_ids(2, 3, 4, x.device, x.dtype)
    )


@pytest.mark.slow
def test_hub_id_resolves_from_the_local_cache(model_dirs, tmp_path, monkeypatch):
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--tiny--sd3"
    shutil.copytree(model_dirs["sd3"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    r = run(
        "rollout",
        "--model",
        "tiny/sd3",
        "--revision",
        commit,
        *TINY,
        "--set",
        "tree.split_steps=[]",
        "-n",
        1,
        "--out",
        tmp_path / "t",
        "--json",
    )
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "t" / "index.json").read_text())["meta"]
    assert meta["model"]["adapter"] == "sd3" and meta["model"]["revision"] == commit
    assert meta["config"]["sampler"]["grid"] == "flow-match-euler"  # the SD3 adapter's own grid


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["sd3", "sd"])
def test_cfg_uncond_detach_backpropagates_the_conditional_half_only(model_dirs, adapter):
    """u + w (c - u) with u detached has the gradient w * dc; the exact gradient is w * dc + (1 - w) * du."""
    from dataclasses import replace

    policy = policy_of(model_dirs[adapter])
    w = policy.guidance
    assert w > 1 and policy.evals_per_row == 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *policy.latent_shape, generator=g)
    probe = torch.randn(2, *policy.latent_shape, generator=g)
    sigma, cond = torch.tensor([0.301, 0.702]), policy.encode(["a red cat", "a blue dog"])
    params = list(policy.trainable_parameters())

    def grad(mode: str, guidance: float) -> torch.Tensor:
        policy.opts, policy.guidance = replace(policy.opts, cfg_uncond=mode), guidance
        gs = torch.autograd.grad((policy.velocity(x, sigma, cond) * probe).sum(), params, allow_unused=True)
        return torch.cat(
            [(q if q is not None else torch.zeros_like(p)).flatten() for q, p in zip(gs, params, strict=True)]
        )

    exact, detached, cond_only = grad("grad", w), grad("detach", w), grad("grad", 1.0)
    assert cond_only.abs().max() > 0
    torch.testing.assert_close(
        detached, w * cond_only, rtol=1e-3, atol=1e-4 * float(cond_only.abs().max())
    )  # batched vs alone
    assert (exact - detached).abs().max() > 1e-3 * detached.abs().max()


def _bf16_policy(folder, finetune):
    from treegrpo_cli.models.base import PolicyConfig
    from treegrpo_cli.models.registry import load_policy

    return load_policy(
        str(folder), "cpu", PolicyConfig(dtype="bf16", finetune=finetune, resolution=16, max_sequence_length=8)
    )


def _velocity_loss(policy, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, *policy.latent_shape, generator=g)
    v = policy.velocity(x, torch.tensor([0.301, 0.702]), policy.encode(["a red cat", "a blue dog"]))
    return (v.float() * torch.randn(v.shape, generator=g)).sum(), v


def test_full_finetune_in_bf16_keeps_fp32_master_weights_and_small_updates(model_dirs):
    """bf16 compute, fp32 weights: one AdamW step of lr 1e-5 moves almost every weight; the same step
    applied to bf16 weights would round away for most of them."""
    policy = _bf16_policy(model_dirs["sd3"], "full")
    params = policy.trainable_parameters()
    assert params and all(p.dtype == torch.float32 for p in params)
    assert next(policy.pipe.vae.parameters()).dtype == torch.bfloat16  # frozen parts in the compute dtype
    before = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    loss, v = _velocity_loss(policy)
    assert v.dtype == torch.float32
    loss.backward()
    opt.step()
    moved = torch.cat([(p.detach() != b).flatten() for p, b in zip(params, before, strict=True)]).float().mean()
    kept_in_bf16 = (
        torch.cat(
            [((b + (p.detach() - b)).bfloat16() != b.bfloat16()).flatten() for p, b in zip(params, before, strict=True)]
        )
        .float()
        .mean()
    )
    assert moved > 0.9 and kept_in_bf16 < 0.5, (float(moved), float(kept_in_bf16))
    ref = policy.reference()
    assert next(ref.frozen.parameters()).dtype == torch.bfloat16  # the KL reference: bf16, inference only


def test_lora_forward_runs_under_bf16_autocast_with_fp32_adapters(model_dirs):
    policy = _bf16_policy(model_dirs["sd3"], "lora")
    lora = [m for n, m in policy.denoiser.named_modules() if n.endswith("lora_A.default")]
    assert lora and all(p.dtype == torch.float32 for p in policy.trainable_parameters())
    seen = []
    lora[0].register_forward_hook(lambda m, i, o: seen.append((torch.is_autocast_enabled("cpu"), o.dtype)))
    loss, v = _velocity_loss(policy)
    assert seen and all(on and dt == torch.bfloat16 for on, dt in seen), seen
    assert v.dtype == torch.float32
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in policy.trainable_parameters())


@pytest.mark.slow
def test_flux_full_finetune_sharded_over_two_processes_matches_one(model_dirs, tmp_path):
    """FSDP2 over a real transformer (the tiny FLUX's double and single blocks), two gloo processes."""
    import os
    import subprocess
    import sys

    from treegrpo_cli.training.runlog import read_metrics

    args = [
        "train",
        "--model",
        str(model_dirs["flux"]),
        "--preset",
        "branch",
        *map(str, TINY),
        "--finetune",
        "full",
        "--set",
        "rollout.num_prompts=2",
        "--set",
        "train.lr=1e-3",
        "--iterations",
        "2",
        "--seed",
        "1",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name, extra in (("one", []), ("two", ["--set", 'train.parallel="fsdp"', "--nproc-per-node", "2"])):
        r = subprocess.run(
            [sys.executable, "-m", "treegrpo_cli", *args, *extra, "--run-dir", str(tmp_path / name)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert r.returncode == 0, r.stderr
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    for a, b in zip(one, two, strict=True):
        for k in ("reward_mean", "loss", "grad_norm", "ratio_mean", "edges", "train_evals"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
    lora = [a for a in args if a not in ("--finetune", "full")]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "treegrpo_cli",
            *lora,
            "--set",
            'train.parallel="fsdp"',
            "--nproc-per-node",
            "2",
            "--run-dir",
            str(tmp_path / "lora"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode != 0 and "--finetune full" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("adapter, finetune", [("flux", "lora"), ("flux", "full"), ("sd3", "lora"), ("sd3", "full")])
def test_one_nft_step_on_a_tiny_pipeline(model_dirs, tmp_path, adapter, finetune):
    """train.objective = nft on the flow adapters: one optimizer step of every leaf at int(4 x 0.99) = 3 noise
    levels, the old (sampling) policy in the checkpoint beside the trained weights, trailing them by the decay."""
    from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint

    run_dir = tmp_path / "run"
    sets = ["tree.split_steps=[]", "tree.trees_per_prompt=3", "rollout.num_prompts=2", "train.lr=0.01"]
    row = train_one_iteration(model_dirs[adapter], run_dir, "nft", finetune, sets)
    assert row["optimizer_steps"] == 1 and row["train_evals"] == 6 * 3 and row["grad_norm"] > 0
    ck = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    assert ck.old is not None and set(ck.old) == set(ck.model)
    from treegrpo_cli.engine.rollout import mix_seed

    torch.manual_seed(mix_seed(0, 0x6E0B))  # as the Trainer seeds before loading: the same LoRA initialisation
    start = policy_of(model_dirs[adapter], finetune=finetune).trainable_state()
    d = row["old_decay"]  # old = d x start + (1 - d) x trained, after the first step
    for k in ck.model:
        torch.testing.assert_close(ck.old[k], d * start[k] + (1 - d) * ck.model[k], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(ck.model[k], start[k]) for k in ck.model)


@pytest.mark.slow
def test_nft_refuses_a_noise_prediction_model(model_dirs, tmp_path):
    one_line_error(
        run("train", "--model", model_dirs["sd"], "--preset", "nft", *TINY, "--run-dir", tmp_path / "r"),
        "train.objective = nft",
        "epsilon-prediction",
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["medium", "large"])
def test_sd3_ode_rollout_equals_the_pipeline_sampling(tmp_path, layout):
    """The engine's ODE rollout through the SD3 adapter (true CFG 4.5, the scheduler's grid and shift) ends
    where StableDiffusion3Pipeline ends from the same initial latent and prompt."""
    from treegrpo_cli.engine.rollout import TreeConfig, rollout
    from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig

    torch.manual_seed(0)
    (tiny_sd3 if layout == "medium" else sd3_large_shaped)().save_pretrained(tmp_path / "m")
    policy = policy_of(tmp_path / "m")
    sde = FlowSDE(SamplerConfig(steps=4, grid="flow-match-euler", shift=3.0, decode="final"))
    tree, _ = rollout(policy, ["a red cat"], [0], sde, TreeConfig(sde_steps=()), seed=3)
    pipe = load_pipe(tmp_path / "m")
    out = pipe(
        "a red cat",
        num_inference_steps=4,
        guidance_scale=4.5,
        height=16,
        width=16,
        max_sequence_length=8,
        latents=tree.latent[tree.depth == 0].clone(),
        output_type="latent",
    ).images
    torch.testing.assert_close(tree.image_latent, out.float(), rtol=0, atol=1e-4)
    assert (tree.image_latent - tree.latent[tree.depth == 0]).abs().max() > 0.1  # it moved


def test_cuda_settings_leave_cudnn_attention_off_unless_asked():
    """cuDNN's attention backward failed on an H100 (torch 2.11+cu130, FLUX.1-dev 720 px): a CUDA policy turns
    that SDPA backend off unless policy.cudnn_attention; the flags are process-wide, so they are put back."""
    from treegrpo_cli.config import load_config
    from treegrpo_cli.models.base import PolicyConfig
    from treegrpo_cli.models.diffusers_base import cuda_backends

    flags = (
        torch.backends.cuda.cudnn_sdp_enabled(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        cuda_backends(PolicyConfig())
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        asked = load_config("branch-mix", sets=["policy.cudnn_attention=true"]).policy
        cuda_backends(asked)
        assert asked.cudnn_attention and torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(flags[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags[1], flags[2]
