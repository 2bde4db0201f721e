"""Parts of the tests' tiny diffusers pipelines, built from config with nothing from any hub: in-memory byte-level
tokenizers (CLIP's, T5's, Qwen's and a Mistral-style one, with the chat template the pipelines apply), tiny text
encoders' configs and the 2-block image VAE. Each adapter file builds its own tiny pipelines from these
(`TINY_PIPELINES`: name -> a function of no arguments), which tests/tinypipes.py collects: random weights, 16 px
images (8 x 8 latents), the text encoders' widths and layer counts just large enough for what each pipeline reads.

Every import of transformers, tokenizers and diffusers is inside a function: importing an adapter stays cheap.
"""

from __future__ import annotations

from typing import Any

W = 16  # text width of the tiny decoder-only and UMT5 encoders
H = 32  # text width of the tiny CLIP and T5 encoders (FLUX.1, SD3, SD1.5)
# 2 blocks of an image VAE (vae_scale_factor 2: 16 px images have 8 x 8 latents of 4 channels)
VAE_BLOCKS: dict[str, Any] = dict(
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    block_out_channels=(8, 16),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=16,
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<pad>"]
# enough of a chat template for the pipelines' calls: role and text of each message, then the generation prompt
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}{{ c['text'] }}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_vocab() -> dict[str, int]:
    from tokenizers.pre_tokenizers import ByteLevel

    vocab: dict[str, int] = {}
    for s in [*SPECIAL, *sorted(ByteLevel.alphabet())]:
        vocab.setdefault(s, len(vocab))
    return vocab


def qwen_tokenizer() -> Any:
    from transformers import Qwen2TokenizerFast

    tok = Qwen2TokenizerFast(vocab=byte_vocab(), merges=[], model_max_length=2048)
    tok.chat_template = CHAT
    return tok


def plain_tokenizer() -> Any:
    """A tokenizer with Mistral's special tokens and the chat template (FLUX.2 [dev]'s processor stand-in)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[], unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=t, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tok.chat_template = CHAT
    return tok


def lm(tok: Any, layers: int, **kw: Any) -> dict[str, Any]:
    """The fields of a tiny decoder-only text model: width W, 2 heads of 8, one key-value head."""
    fields = dict(vocab_size=len(tok), hidden_size=W, intermediate_size=32, num_attention_heads=2)
    return dict(fields, num_key_value_heads=1, head_dim=8, num_hidden_layers=layers, **kw)


def t5_tokenizer() -> Any:
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)] + [
        (c, -2.0) for c in "abcdefghijklmnopqrstuvwxyz"
    ]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def flow_scheduler(**kw: Any) -> Any:
    """FlowMatchEuler with the dynamic exponential shift of the Qwen-Image and FLUX.2 pipelines."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential", **kw)


def clip_tokenizer() -> Any:
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    syms, vocab = sorted(ByteLevel.alphabet()), dict[str, int]()
    for s in syms:
        vocab.setdefault(s, len(vocab))
    for s in syms:
        vocab.setdefault(s + "</w>", len(vocab))
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def clip_config(tok: Any) -> Any:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tok),
        hidden_size=H,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        projection_dim=H,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def t5(tok: Any, width: int) -> Any:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(
            vocab_size=len(tok),
            d_model=width,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    )


def vae(scaling: float, shift: float | None) -> Any:
    """The 2-block AutoencoderKL of FLUX.1, SD3 and SD1.5 (4 latent channels)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        **VAE_BLOCKS, use_quant_conv=False, use_post_quant_conv=False, scaling_factor=scaling, shift_factor=shift
    )
