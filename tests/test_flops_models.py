"""The Qwen-Image, FLUX.2 and Wan2.1 FLOP formulas (each with its adapter) against torch's FlopCounterMode on the
tiny transformers of tests/tinypipes.py: LoRA with the adapters' default targets and full fine-tuning, with and
without gradient checkpointing; and the adapters' flops_per_row against a measured row."""

import pytest
import torch
from tinypipes import flux2_transformer, tiny_qwen_image

from treegrpo_cli.models.flops import measure
from treegrpo_cli.models.flux2 import flux2_flops
from treegrpo_cli.models.qwenimage import qwen_image_flops
from treegrpo_cli.models.wan import wan_flops


def prepared(net, lora, targets, checkpointing):
    from peft import LoraConfig

    if lora:
        net.requires_grad_(False).add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    else:
        net.requires_grad_(True)
    if checkpointing:
        net.enable_gradient_checkpointing()
    return net, [p for p in net.parameters() if p.requires_grad]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_qwen_image_count_matches_flop_counter(lora, checkpointing):
    from treegrpo_cli.models.qwenimage import QWEN_LORA

    torch.manual_seed(0)
    net, params = prepared(tiny_qwen_image().transformer, lora, list(QWEN_LORA.targets), checkpointing)
    N, T = 16, 7  # 4 x 4 packed tokens, 7 text tokens
    x, emb = torch.randn(1, N, net.config.in_channels), torch.randn(1, T, net.config.joint_attention_dim)
    kw = dict(encoder_hidden_states=emb, timestep=torch.tensor([0.5]), img_shapes=[[(1, 4, 4)]], return_dict=False)
    measured = measure(lambda: net(hidden_states=x, **kw)[0], params)
    assert qwen_image_flops(net.config, N, T, 4 if lora else None, recompute=checkpointing) == measured


@pytest.mark.slow
@pytest.mark.parametrize("guidance", [True, False])  # [dev]'s guidance embedding; [klein] has none
@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_flux2_count_matches_flop_counter(guidance, lora, checkpointing):
    from treegrpo_cli.models.flux2 import FLUX2_LORA, positions

    torch.manual_seed(0)
    net, params = prepared(flux2_transformer(48, guidance), lora, FLUX2_LORA.targets, checkpointing)
    N, T = 16, 8
    img_ids, txt_ids = positions(1, 4, 4, T, torch.device("cpu"))
    x, emb = torch.randn(1, N, 16), torch.randn(1, T, 48)
    kw = dict(encoder_hidden_states=emb, timestep=torch.tensor([0.5]), img_ids=img_ids, txt_ids=txt_ids)
    g = torch.tensor([4.0]) if guidance else None
    measured = measure(lambda: net(hidden_states=x, guidance=g, return_dict=False, **kw)[0], params)
    assert flux2_flops(net.config, N, T, 4 if lora else None, recompute=checkpointing) == measured


@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_wan_count_matches_flop_counter(lora, checkpointing):
    """Self-attention over the video patches, cross-attention to the text (queries and keys of different lengths)."""
    from tinypipes import tiny_wan

    from treegrpo_cli.models.wan import WAN_LORA

    torch.manual_seed(0)
    net, params = prepared(tiny_wan().transformer, lora, list(WAN_LORA.targets), checkpointing)
    x, emb = torch.randn(1, 4, 3, 4, 4), torch.randn(1, 8, net.config.text_dim)  # 3 x 2 x 2 = 12 patches, 8 words
    kw = dict(encoder_hidden_states=emb, timestep=torch.tensor([500.0]), return_dict=False)
    measured = measure(lambda: net(hidden_states=x, **kw)[0], params)
    assert wan_flops(net.config, 12, 8, 4 if lora else None, recompute=checkpointing) == measured


@pytest.mark.slow
@pytest.mark.parametrize("build", ["qwenimage", "flux2-dev", "flux2-klein"])
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_adapters_report_their_shapes(build, finetune):
    """flux_iteration.py and the FLOP axis read flops_per_row(): derived from the config, equal to one measured row
    of the adapter (one network row: true CFG's two halves are counted by evals_per_row)."""
    from tinypipes import BUILDERS

    from treegrpo_cli.models.base import PolicyConfig
    from treegrpo_cli.models.flops import measure_policy_flops
    from treegrpo_cli.models.flux2 import Flux2Policy
    from treegrpo_cli.models.qwenimage import QwenImagePolicy

    torch.manual_seed(0)
    cls = QwenImagePolicy if build == "qwenimage" else Flux2Policy
    opts = PolicyConfig(dtype="fp32", resolution=16, max_sequence_length=8, finetune=finetune, lora_rank=4)
    policy = cls(BUILDERS[build](), opts, name=build)
    policy.cache_prompts(["a red cat"])
    counted = policy.flops_per_row()
    assert counted == measure_policy_flops(policy, "a red cat")
