"""VideoAlign (rewards/videoalign.py) against a reference forward written here from the published architecture,
on a tiny Qwen2-VL saved in the VideoReward release's folder layout (random LoRA, rm_head, embeddings)."""

import copy
import hashlib
import json
import subprocess
import sys

import pytest
import torch
from tinypipes import byte_vocab
from torch import nn

from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.rewards.base import get_reward, score_leaves
from treegrpo_cli.rewards.videoalign import frame_indices, frame_size
from treegrpo_cli.rewards.videoalign_prompt import DETAILED_SPECIAL

VISION = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
TOKENS = ["<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>"]
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
# Qwen2-VL-Instruct's chat template, cut down to what VideoAlign renders: a user turn of one video and a text
CHAT = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}" + SYSTEM + "{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}{% if c['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NORM = {"VQ_mean": 3.6757, "VQ_std": 2.2476, "MQ_mean": 1.1646, "MQ_std": 1.3811, "TA_mean": 2.8105, "TA_std": 2.5121}
MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
H, W, F, KEEP = 308, 336, 8, [0, 2, 5, 7]  # 103488 px frames (kept as they are); 8 frames at 16 fps -> 4 at 2 fps
PROMPTS = ["a red ball rolls to the left", "two cats"]
EXCLUDE = ("lm_head", "rm_head", "embed_tokens", "visual")  # the release's lora_namespan_exclude


def tokenizer():
    from transformers import Qwen2TokenizerFast

    vocab = byte_vocab()
    for s in VISION:
        vocab.setdefault(s, len(vocab))
    tok = Qwen2TokenizerFast(vocab=vocab, merges=[], model_max_length=10**6, pad_token="<|endoftext|>")
    tok.add_tokens(["<|im_start|>", "<|im_end|>", *VISION], special_tokens=True)
    return tok


def tiny_model(tok):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    text |= dict(num_key_value_heads=1, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    text |= dict(bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=True)
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, patch_size=14, spatial_merge_size=2)
    ids = {f"{k}_token_id": tok.convert_tokens_to_ids(f"<|{k}|>") for k in ("image_pad", "video_pad")}
    cfg = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(vision, temporal_patch_size=2),
        image_token_id=ids["image_pad_token_id"],
        video_token_id=ids["video_pad_token_id"],
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(cfg).eval()


def model_config(output_dim: int = 1) -> dict:
    """model_config.json as the release writes it (train_reward.py's dataclasses, plus inference_config)."""
    data = dict(meta_data="/x.csv", data_dir="/x", meta_data_test=None, max_frame_pixels=200704, num_frames=None)
    data |= dict(fps=2.0, p_shuffle_frames=0.0, p_color_jitter=0.0, eval_dim=["VQ", "MQ", "TA"])
    data |= dict(prompt_template_type="detailed_special", add_noise=False, sample_type="uniform", use_tied_data=True)
    model = dict(model_name_or_path="Qwen/Qwen2-VL-2B-Instruct", output_dim=output_dim, use_special_tokens=True)
    model |= dict(reward_token="special", loss_type="btt", torch_dtype="bfloat16", freeze_vision_tower=False)
    lora = dict(lora_enable=True, vision_lora=False, lora_r=4, lora_alpha=8, lora_dropout=0.05, use_rslora=False)
    lora |= dict(lora_namespan_exclude=list(EXCLUDE), lora_task_type="CAUSAL_LM", num_lora_modules=-1)
    return dict(
        data_config=data, training_args={"bf16": True}, model_config=model, peft_lora_config=lora, inference_config=NORM
    )


def release_names(sd: dict) -> dict:
    """transformers-5 keys -> the release's (transformers 4.45): model.language_model.* -> model.*, model.visual.*
    -> visual.*, under peft's base_model.model. prefix."""
    out = {}
    for k, v in sd.items():
        k = k.removeprefix("base_model.model.")
        k = k.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)
        out["base_model.model." + k] = v
    return out


def build_release(root):
    """The base folder, the VideoReward folder (checkpoint-10 in transformers-5 names, checkpoint-20 in the
    release's, with the embeddings also in its adapter file) and the merged reference model with its heads."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    tok = tokenizer()
    base = tiny_model(tok)
    base_dir, folder = root / "qwen2vl", root / "videoreward"
    base.save_pretrained(base_dir)
    proc = Qwen2VLProcessor(Qwen2VLImageProcessor(), tok, Qwen2VLVideoProcessor(), chat_template=CHAT)
    proc.save_pretrained(base_dir)

    targets = [
        n
        for n, m in base.named_modules()
        if isinstance(m, nn.Linear | nn.Embedding) and not any(x in n for x in EXCLUDE)
    ]
    torch.manual_seed(1)
    peft = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    )
    adapter = {k: v.contiguous() for k, v in get_peft_model_state_dict(peft).items()}
    ref = peft.merge_and_unload().eval()
    ref.resize_token_embeddings(len(tok) + 3, mean_resizing=False)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        embed = torch.randn(len(tok) + 3, 32, generator=g)
        ref.get_input_embeddings().weight.copy_(embed)
        for p in ref.model.visual.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    visual = {"base_model.model.model.visual." + k: v.clone() for k, v in ref.model.visual.state_dict().items()}
    heads = {10: torch.randn(1, 32, generator=g), 20: torch.randn(1, 32, generator=g)}
    (folder / "checkpoint-10").mkdir(parents=True)
    (folder / "model_config.json").write_text(json.dumps(model_config()))
    for step, names in ((10, dict), (20, release_names)):
        ck = folder / f"checkpoint-{step}"
        ck.mkdir(exist_ok=True)
        non_lora = visual | {"base_model.model.rm_head.weight": heads[step]}
        non_lora["base_model.model.model.language_model.embed_tokens.weight"] = embed
        files = dict(adapter)
        if step == 20:  # peft saves resized embeddings in the adapter file too
            files |= {
                "base_model.model.model.language_model.embed_tokens.weight": embed,
                "base_model.model.lm_head.weight": embed.clone(),
            }
        torch.save(names(non_lora), ck / "non_lora_state_dict.pth")
        save_file(names(files), str(ck / "adapter_model.safetensors"))
        peft.peft_config["default"].save_pretrained(str(ck))
    tok.add_tokens(TOKENS, special_tokens=True)
    return base_dir, folder, ref, tok, heads


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return build_release(tmp_path_factory.mktemp("videoalign"))


def clips(n: int = 2, seed: int = 3) -> torch.Tensor:
    """[n, 3, F, H, W] in [0, 1], on the uint8 grid (so quantising them is exact)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, F, H, W), generator=g).float() / 255


@torch.no_grad()
def reference(ref, tok, clip: torch.Tensor, prompt: str) -> torch.Tensor:
    """[3, 32] last hidden states at <|VQ_reward|>, <|MQ_reward|>, <|TA_reward|> of one clip, from the published
    architecture: frames normalised and cut into 2 x 14 x 14 patches in 2 x 2 merge order, the vision tower's
    merged tokens in place of the <|video_pad|>s, positions 0..L-1 on every M-RoPE axis."""
    x = (clip[:, KEEP].transpose(0, 1) - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    t, gh, gw = len(KEEP) // 2, H // 14, W // 14
    patches = x.reshape(t, 2, 3, gh // 2, 2, 14, gw // 2, 2, 14).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    vision = ref.model.visual(patches.reshape(t * gh * gw, -1), grid_thw=torch.tensor([[t, gh, gw]])).pooler_output
    text = DETAILED_SPECIAL.replace("{text_prompt}", prompt)
    pads = "<|video_pad|>" * (t * gh * gw // 4)
    full = f"{SYSTEM}<|im_start|>user\n<|vision_start|>{pads}<|vision_end|>{text}<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor(tok(full)["input_ids"])
    emb = ref.get_input_embeddings()(ids)
    emb[ids == tok.convert_tokens_to_ids("<|video_pad|>")] = vision
    pos = torch.arange(len(ids)).view(1, 1, -1).expand(3, 1, -1)
    hidden = ref.model.language_model(inputs_embeds=emb[None], position_ids=pos).last_hidden_state[0]
    return torch.stack([hidden[(ids == tok.convert_tokens_to_ids(s)).nonzero().item()] for s in TOKENS])


def expected(hidden: list[torch.Tensor], head: torch.Tensor, which: str, norm: bool) -> torch.Tensor:
    raw = torch.stack([(h @ head.T)[:, 0] for h in hidden])  # [B, 3]: VQ, MQ, TA
    if norm:
        raw = (raw - torch.tensor([NORM[f"{d}_mean"] for d in ("VQ", "MQ", "TA")])) / torch.tensor(
            [NORM[f"{d}_std"] for d in ("VQ", "MQ", "TA")]
        )
    return raw.sum(1) if which == "overall" else raw[:, ["vq", "mq", "ta"].index(which)]


def test_prompt_is_the_released_text():
    text = DETAILED_SPECIAL.replace("{text_prompt}", "a cat on a mat")
    assert (
        hashlib.sha256(text.encode()).hexdigest() == "910b2fe87ce1c459a3a87aaab1cdae0da1add13ee2a094425df40092831861ce"
    )
    assert [text.index(t) for t in TOKENS] == sorted(text.index(t) for t in TOKENS)


@pytest.mark.slow
def test_matches_reference_on_every_head_and_both_norms(release):
    base_dir, folder, ref, tok, heads = release
    x = clips()
    hidden = [reference(ref, tok, c, p) for c, p in zip(x, PROMPTS, strict=True)]
    for which in ("overall", "vq", "mq", "ta"):
        for norm in (True, False):
            r = get_reward("videoalign", checkpoint=str(folder), base=str(base_dir), head=which, norm=str(norm))
            torch.testing.assert_close(r(x, PROMPTS), expected(hidden, heads[20], which, norm), rtol=0, atol=1e-5)
    # checkpoint-10: transformers-5 key names, its own rm_head
    r = get_reward("videoalign", checkpoint=str(folder), base=str(base_dir), step="10", head="mq")
    torch.testing.assert_close(r(x, PROMPTS), expected(hidden, heads[10], "mq", True), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_video_reward_through_score_leaves(release):
    base_dir, folder, *_ = release
    r = get_reward("videoalign", checkpoint=str(folder), base=str(base_dir), batch_size=1)
    assert r.video is True
    x = clips(3, seed=4)
    prompts = ["a dog", "rain", "a red ball"]
    out = score_leaves({"videoalign": r}, (x * 255).round().to(torch.uint8), prompts, batch=2)["videoalign"]
    assert out.shape == (3,) and out.dtype == torch.float32
    torch.testing.assert_close(out, r(x, prompts), rtol=0, atol=1e-5)
    with pytest.raises(TreegrpoError, match=r"clips \[B, 3, F, H, W\]"):
        r(x[:, :, 0], prompts)


@pytest.mark.slow
def test_frame_options(release):
    base_dir, folder, *_ = release
    x = clips()
    default = get_reward("videoalign", checkpoint=str(folder), base=str(base_dir))(x, PROMPTS)
    four = get_reward("videoalign", checkpoint=str(folder), base=str(base_dir), num_frames="4")
    torch.testing.assert_close(four(x, PROMPTS), default, rtol=0, atol=1e-6)  # the same 4 frames as 2 fps
    small = get_reward("videoalign", checkpoint=str(folder), base=str(base_dir), max_pixels="3136", fps="16")
    assert small.frames(x[0]).shape == (
        F,
        3,
        56,
        84,
    )  # all 8 frames at 16 fps; 28 x 56 under 3136 px, then the processor's 56 x 84
    assert torch.isfinite(small(x, PROMPTS)).all()
    with pytest.raises(TreegrpoError, match="fps or num_frames"):
        get_reward("videoalign", checkpoint=str(folder), base=str(base_dir), fps="1", num_frames="4")
    with pytest.raises(TreegrpoError, match="no checkpoint-7 .*steps: 10, 20"):
        get_reward("videoalign", checkpoint=str(folder), base=str(base_dir), step="7")


def test_missing_weights_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("TREEGRPO_VIDEOALIGN_CHECKPOINT", raising=False)
    monkeypatch.delenv("TREEGRPO_QWEN2VL", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(TreegrpoError) as e:
        get_reward("videoalign")
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("KwaiVGI/VideoReward", "videoalign.checkpoint", "$TREEGRPO_VIDEOALIGN_CHECKPOINT"):
        assert part in msg
    for part in ("Qwen/Qwen2-VL-2B-Instruct", "videoalign.base", "$TREEGRPO_QWEN2VL"):
        assert part in msg


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_refuses_a_bad_rm_head(release, tmp_path, change):
    import shutil

    base_dir, folder, *_ = release
    bad = tmp_path / "videoreward"
    shutil.copytree(folder, bad)
    path = bad / "checkpoint-20" / "non_lora_state_dict.pth"
    sd = torch.load(path)
    if change == "missing":
        del sd["base_model.model.rm_head.weight"]
    else:
        sd["base_model.model.rm_head.bias"] = torch.zeros(1)
    torch.save(sd, path)
    with pytest.raises(TreegrpoError, match="rm_head") as e:
        get_reward("videoalign", checkpoint=str(bad), base=str(base_dir))
    assert "\n" not in str(e.value)


def test_frame_rules():
    assert frame_indices(F, 16, 2.0, None) == KEEP  # 8 / 16 * 2 = 1 frame, raised to 4
    assert frame_indices(81, 16, 2.0, None) == [0, 9, 18, 27, 36, 44, 53, 62, 71, 80]  # Wan's 81 frames: 10
    assert frame_indices(9, 16, None, 20) == [0, 1, 2, 3, 5, 6, 7, 8] and len(frame_indices(33, 16, None, 5)) == 4
    assert frame_size(480, 832, 128 * 28 * 28, 200704) == (336, 588)  # Wan 480p under the release's max
    assert frame_size(H, W, 128 * 28 * 28, 200704) == (H, W)
    assert frame_size(28, 56, 56 * 56, 28 * 28 * 1280) == (56, 84)  # raised to the processor's least pixels


@pytest.mark.slow
def test_registry_imports_nothing_heavy():
    code = (
        "import sys; from treegrpo_cli.rewards.base import available; assert 'videoalign' in available(); "
        "print([m for m in ('transformers', 'peft', 'torchvision') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
