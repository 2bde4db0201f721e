"""Denoiser FLOPs per row (models/flops.py, each formula with its adapter): the counts derived from the models'
shapes agree with torch's FlopCounterMode on the world's DiT and on the tiny FLUX and SD3 transformers, forward and
backward."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tinypipes import tiny_flux, tiny_sd, tiny_sd3, tiny_sd3_transformer
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from treegrpo_cli.models.base import PolicyConfig
from treegrpo_cli.models.dit import DiTConfig, DiTPolicy, TinyDiT, dit_flops, tokenize
from treegrpo_cli.models.flops import flop_counter, measure, measure_policy_flops
from treegrpo_cli.models.flux import FLUX_LORA, flux_flops, image_ids
from treegrpo_cli.models.latent import AEConfig, latent_dit_config
from treegrpo_cli.models.pixel import PixelConfig, PixelPolicy
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.training.pretrain import PretrainConfig


def within(counted: tuple[int, int], measured: tuple[int, int], rel: float = 0.02) -> bool:
    return all(m > 0 and abs(c - m) <= rel * m for c, m in zip(counted, measured, strict=True))


def dit_measured(net: TinyDiT) -> tuple[int, int]:
    cfg = net.cfg
    ids, mask = tokenize(["a red circle left of two blue squares"], cfg.vocab, cfg.max_words)
    x = torch.randn(1, cfg.channels, cfg.image_size, cfg.image_size)
    return measure(lambda: net(x, torch.tensor([0.3]), ids, mask), list(net.parameters()))


def test_cpu_attention_is_counted_with_torchs_formulas():
    q, k, v = (torch.randn(1, 2, 10, 8, requires_grad=True) for _ in range(3))  # [B, heads, S, head dim]
    with flop_counter() as counter:
        out = F.scaled_dot_product_attention(q, k, v)
    assert counter.get_total_flops() == 4 * 10 * 10 * 16  # q k^T and p v over all heads (width 16)
    with flop_counter() as counter:
        out.sum().backward()
    assert counter.get_total_flops() == 10 * 10 * 10 * 16  # scores recomputed + four gradient products
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as plain:  # the math kernel: plain bmm
        F.scaled_dot_product_attention(q, k, v)
    assert plain.get_total_flops() == 4 * 10 * 10 * 16


def test_the_shipped_world_dit_count_is_exact():
    policy = load_policy("tiny-shapes", "cpu", PolicyConfig())
    assert policy.cfg == latent_dit_config(AEConfig(), **PretrainConfig().dit_shape)
    counted = dit_flops(policy.cfg, policy.cfg.max_words)
    assert policy.flops_per_row() == counted
    assert dit_measured(policy.net) == counted  # forward and backward, every op
    assert measure_policy_flops(policy, "a red circle") == counted  # through velocity()
    fwd, bwd = counted  # 6 blocks of width 128 over 10 words + 16 latent tokens
    assert fwd == 54_702_080 and bwd == 110_344_192


def test_a_pixel_space_dit_with_text_layers_and_refiner_and_cfg():
    cfg = DiTConfig(dim=64, depth=2, heads=2, mlp_ratio=2.0, text_layers=1, text_ada=True, pos="learned")
    torch.manual_seed(0)
    net = TinyDiT(cfg)
    counted = dit_flops(cfg, cfg.max_words)
    assert dit_measured(net) == counted
    guided = DiTPolicy(cfg, net, guidance=3.0)  # two network rows per latent row
    assert guided.evals_per_row == 2 and guided.flops_per_row() == counted
    assert measure_policy_flops(guided, "two green triangles") == counted


def test_golden_forward_count_by_hand():
    cfg = DiTConfig(
        4, 1, patch=2, dim=8, depth=1, heads=2, mlp_ratio=2.0, max_words=3, text_layers=1, refine=4, refine_feats=2
    )
    # N = (4/2)^2 = 4 image tokens, W = 3 words, S = 7, D = 8, MLP 16, patch features 1*2*2 = 4, 16 pixels
    patch_in = 2 * 4 * 4 * 8
    time_mlp = 2 * 1 * 8 * 8 + 2 * 1 * 8 * 8
    text_block = 2 * 3 * 8 * 24 + 4 * 3 * 3 * 8 + 2 * 3 * 8 * 8 + 2 * 3 * 8 * 16 + 2 * 3 * 16 * 8
    block_ada = 2 * 1 * 8 * 48
    block_attn = 2 * 7 * 8 * 24 + 4 * 7 * 7 * 8 + 2 * 7 * 8 * 8  # qkv, sdpa, proj
    block_mlp = 2 * 7 * 8 * 16 + 2 * 7 * 16 * 8
    head = 2 * 1 * 8 * 16 + 2 * 4 * 8 * (3 * 4)  # ada_out; patch_out to (1 + 2 feats) * 2 * 2
    refiner = 2 * 16 * 9 * 4 * 4 + 2 * 16 * 9 * 4 * 4 + 2 * 16 * 9 * 4 * 1  # convs 4 -> 4 -> 4 -> 1 channels
    fwd = patch_in + time_mlp + text_block + block_ada + block_attn + block_mlp + head + refiner
    assert fwd == 24_768
    attention = 4 * 3 * 3 * 8 + 4 * 7 * 7 * 8
    # backward: dW and dx of every layer, less dx of patch_in and time.0 (latent, sigma), sdpa at 2.5x
    bwd = 2 * fwd - patch_in - 2 * 1 * 8 * 8 + attention // 2
    assert dit_flops(cfg, 3) == (fwd, bwd)
    torch.manual_seed(0)
    assert dit_measured(TinyDiT(cfg)) == (fwd, bwd)


FLUX_CASES = {
    "full": None,
    "lora": FLUX_LORA.targets,
    "lora-adaln": ("proj_out", "norm1.linear", "ff.net.2"),  # LoRA upstream of the modulations too
}


@pytest.fixture(scope="module")
def flux_transformer():
    torch.manual_seed(0)
    return tiny_flux().transformer


@pytest.mark.slow
@pytest.mark.parametrize("case", FLUX_CASES)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_flux_count_matches_flop_counter(flux_transformer, case, checkpointing):
    from peft import LoraConfig

    net, targets = copy.deepcopy(flux_transformer), FLUX_CASES[case]
    if targets is None:
        net.requires_grad_(True)
    else:
        net.requires_grad_(False).add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))
    if checkpointing:
        net.enable_gradient_checkpointing()
    N, T, cfg = 16, 8, net.config  # 4x4 packed latent tokens, 8 text tokens
    x, emb, pooled = torch.randn(1, N, cfg.in_channels), torch.randn(1, T, cfg.joint_attention_dim), torch.randn(1, 32)
    kw = dict(txt_ids=torch.zeros(T, 3), img_ids=image_ids(4, 4, x.device, x.dtype), return_dict=False)
    run = lambda: net(x, emb, pooled, torch.tensor([0.5]), guidance=torch.tensor([3.5]), **kw)[0]  # noqa: E731
    measured = measure(run, [p for p in net.parameters() if p.requires_grad])
    counted = flux_flops(cfg, N, T, None if targets is None else 4, targets, recompute=checkpointing)
    assert within(counted, measured), (counted, measured)
    assert counted == measured


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_flux_adapter_reports_its_shapes(finetune):
    from treegrpo_cli.models.flux import FluxPolicy

    torch.manual_seed(0)
    opts = PolicyConfig(dtype="fp32", resolution=16, max_sequence_length=8, finetune=finetune, lora_rank=4)
    policy = FluxPolicy(tiny_flux(), opts, name="flux-test")
    counted = policy.flops_per_row()
    assert counted is not None and within(counted, measure_policy_flops(policy, "a red cat"))


def test_the_measured_fallback_on_the_pixel_policy():
    policy = PixelPolicy(PixelConfig())
    first = policy.flops_per_row()
    assert first is not None and min(first) > 0 and policy.flops_per_row() is first  # measured once, cached
    cond = policy.encode(["a probe prompt"])
    x, sigma = torch.randn(1, *policy.latent_shape), torch.full((1,), 0.5)
    with FlopCounterMode(display=False) as counter:
        out = policy.velocity(x, sigma, cond)
    fwd = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    assert first == (fwd, counter.get_total_flops())


@pytest.mark.slow
def test_the_measured_fallback_counts_one_network_row_under_true_cfg():
    from treegrpo_cli.models.sd import SDPolicy

    rows = {}
    for guidance in (1.0, 5.0):  # 5.0: both CFG halves in one forward, two network rows per latent row
        torch.manual_seed(0)
        opts = PolicyConfig(dtype="fp32", resolution=16, max_sequence_length=8, guidance=guidance)
        policy = SDPolicy(tiny_sd(), opts, name="sd-test")
        rows[policy.evals_per_row] = policy.flops_per_row()
    assert rows[1] == rows[2] and min(rows[1]) > 0


def _sd3_transformer(dual: tuple[int, ...]):
    torch.manual_seed(0)
    return tiny_sd3_transformer(dual)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["medium", "large"])  # SD3.5 Medium's dual-attention block, Large's plain ones
@pytest.mark.parametrize("case", ["full", "lora"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_sd3_count_matches_flop_counter(layout, case, checkpointing):
    from peft import LoraConfig

    from treegrpo_cli.models.sd3 import SD3_LORA, sd3_flops

    net = _sd3_transformer((0,) if layout == "medium" else ())
    targets = None if case == "full" else SD3_LORA.targets
    if targets is None:
        net.requires_grad_(True)
    else:
        net.requires_grad_(False).add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))
    if checkpointing:
        net.enable_gradient_checkpointing()
    x, emb, pooled = torch.randn(1, 4, 8, 8), torch.randn(1, 8, 64), torch.randn(1, 64)
    kw = dict(encoder_hidden_states=emb, pooled_projections=pooled, timestep=torch.tensor([500.0]), return_dict=False)
    measured = measure(lambda: net(hidden_states=x, **kw)[0], [p for p in net.parameters() if p.requires_grad])
    counted = sd3_flops(net.config, 16, 8, None if targets is None else 4, targets, recompute=checkpointing)
    assert counted == measured


@pytest.mark.parametrize(("finetune", "uncond"), [("lora", "grad"), ("full", "grad"), ("lora", "detach")])
def test_the_sd3_adapter_reports_its_shapes(finetune, uncond):
    from treegrpo_cli.models.sd3 import SD3Policy

    torch.manual_seed(0)
    opts = PolicyConfig(
        dtype="fp32", resolution=16, max_sequence_length=8, finetune=finetune, lora_rank=4, cfg_uncond=uncond
    )
    policy = SD3Policy(tiny_sd3(), opts, name="sd3-test")
    counted = policy.flops_per_row()
    assert policy.evals_per_row == 2 and counted is not None
    assert within(counted, measure_policy_flops(policy, "a red cat")), (counted, measure_policy_flops(policy, "x"))
