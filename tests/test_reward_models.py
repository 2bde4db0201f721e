"""Reward models on tiny random weights saved in the official layouts and loaded through the real loaders.

open_clip rewards use a tiny open_clip config registered at test time; PickScore a tiny transformers
CLIPModel and CLIPProcessor saved to folders; ImageReward a tiny BLIP state dict, med_config.json and
a WordPiece vocab. hps, pick and clip are compared with a direct open_clip / transformers computation.
"""

import json
import subprocess
import sys

import pytest
import torch

from treegrpo_cli.errors import ConfigError, TreegrpoError
from treegrpo_cli.rewards.base import available, get_reward, parse_reward_options, parse_rewards
from treegrpo_cli.rewards.vision import CLIP_MEAN, CLIP_STD, ImagePrep

open_clip = pytest.importorskip("open_clip")
TINY = "treegrpo-test-tiny"
TINY_CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
PROMPTS = ["a red circle", "two blue squares above a green triangle", "a photo of a cat"]


@pytest.fixture(autouse=True)
def _no_caches(monkeypatch, tmp_path_factory):
    """No weights from this machine's caches or variables: only what a test gives."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("empty-hub")))
    for var in (
        "TREEGRPO_HPS_CHECKPOINT",
        "TREEGRPO_CLIP_CHECKPOINT",
        "TREEGRPO_CLIP",
        "TREEGRPO_PICKSCORE_MODEL",
        "TREEGRPO_PICKSCORE_PROCESSOR",
        "TREEGRPO_IMAGEREWARD_CHECKPOINT",
        "TREEGRPO_BERT_TOKENIZER",
        "TREEGRPO_IMAGEREWARD_MED_CONFIG",
        "TREEGRPO_AESTHETIC_HEAD",
        "TREEGRPO_AESTHETIC_CLIP",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A registered tiny open_clip architecture and one random model of it."""
    d = tmp_path_factory.mktemp("oc-config")
    (d / f"{TINY}.json").write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(d / f"{TINY}.json")
    torch.manual_seed(0)
    return open_clip.create_model(TINY, pretrained=None).eval()


def images(n=3, h=40, w=48, seed=1):
    """[n, 3, h, w] float images on the uint8 grid (so PIL and tensor paths see the same pixels)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), generator=g).float() / 255


def open_clip_direct(model, x, prompts):
    """Cosine of open_clip's own forward, with open_clip's val transform (Resize, CenterCrop, Normalize) on tensors."""
    cfg = open_clip.get_model_preprocess_cfg(model)
    from open_clip.transform import PreprocessCfg, image_transform_v2

    tf = image_transform_v2(PreprocessCfg(**cfg), is_train=False).transforms
    resize, crop, normalize = tf[0], tf[1], tf[-1]
    pixels = torch.stack([normalize(crop(resize(im))) for im in x])
    with torch.no_grad():
        out = model(pixels, open_clip.get_tokenizer(TINY)(prompts))
    img, txt = (out["image_features"], out["text_features"]) if isinstance(out, dict) else out[:2]
    return (img * txt).sum(-1)


# --- registry ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_registry_lists_models_and_imports_nothing_heavy():
    assert {"shapes", "jpeg-compressibility", "hps", "pick", "imagereward", "clip", "aesthetic"} <= set(available())
    code = (
        "import sys; from treegrpo_cli.rewards.base import available, get_reward, parse_rewards; available(); "
        "get_reward('shapes'); parse_rewards('hps,pick,imagereward,clip,aesthetic'); "
        "print([m for m in ('open_clip', 'transformers', 'timm', 'torchvision') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_reward_options_and_names():
    assert parse_reward_options(["hps.checkpoint=/x.pt", "pick.form=logit"]) == {
        "hps": {"checkpoint": "/x.pt"},
        "pick": {"form": "logit"},
    }
    for bad in ("hps.nope=1", "hps=1", "nope.checkpoint=1"):
        with pytest.raises(ConfigError):
            parse_reward_options([bad])
    with pytest.raises(ConfigError, match="no option 'nope'"):
        get_reward("hps", nope=1)
    assert parse_rewards("hps,shapes", "0.8,0.2") == {"hps": 0.8, "shapes": 0.2}  # names only: no weights needed
    assert get_reward("shapes")(torch.zeros(1, 3, 32, 32), ["a red circle"]).dtype == torch.float32


@pytest.mark.parametrize(
    "name,needles",
    [
        ("hps", ["HPS_v2.1_compressed.pt", "TREEGRPO_HPS_CHECKPOINT", "hps.checkpoint"]),
        ("pick", ["PickScore", "TREEGRPO_PICKSCORE_MODEL", "TREEGRPO_PICKSCORE_PROCESSOR"]),
        ("imagereward", ["ImageReward.pt", "TREEGRPO_IMAGEREWARD_CHECKPOINT", "TREEGRPO_BERT_TOKENIZER"]),
        ("clip", ["open_clip ViT-B-32", "TREEGRPO_CLIP_CHECKPOINT"]),
        ("aesthetic", ["sac+logos+ava1-l14-linearMSE.pth", "TREEGRPO_AESTHETIC_CLIP"]),
    ],
)
def test_missing_weights_is_one_line_naming_the_files(name, needles):
    with pytest.raises(TreegrpoError) as e:
        get_reward(name)
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


@pytest.mark.parametrize("h,w", [(37, 53), (13, 19), (24, 24)])  # down, up (the 32 px world to 224), as is
def test_image_prep_matches_torchvision_resize_and_crop(h, w):
    pytest.importorskip("torchvision")
    from torchvision.transforms import CenterCrop, InterpolationMode, Normalize, Resize

    x = images(2, h, w)
    ref = torch.stack(
        [Normalize(CLIP_MEAN, CLIP_STD)(CenterCrop(24)(Resize(24, InterpolationMode.BICUBIC)(im))) for im in x]
    )
    assert torch.allclose(ImagePrep(24, 24)(x), ref, atol=1e-5)


def test_training_accepts_the_new_reward_names(tmp_path):
    from clitools import one_line_error, run

    from treegrpo_cli.config import load_config

    cfg = load_config(sets=['reward.names=["hps", "pick", "imagereward", "clip", "aesthetic", "shapes"]'])
    assert len(cfg.reward.weight_map()) == 6
    r = run(
        "train",
        "--set",
        'model="pixel-tiny"',
        "--reward",
        "shapes,hps",
        "--weights",
        "0.2,0.8",
        "--iterations",
        1,
        "--run-dir",
        tmp_path / "run",
    )
    one_line_error(r, "hps weights not found", "TREEGRPO_HPS_CHECKPOINT")  # found by name, then no weights here


# --- hps ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_hps_loads_the_official_layout_and_equals_open_clip(tiny_clip, tmp_path):
    path = tmp_path / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": tiny_clip.state_dict()}, path)  # the release wraps the weights
    reward = get_reward("hps", checkpoint=str(path), arch=TINY, batch_size=2)
    x = images()
    a, b = reward(x, PROMPTS), reward(x, PROMPTS)
    assert a.dtype == torch.float32 and a.shape == (3,) and torch.equal(a, b)
    assert torch.allclose(a, open_clip_direct(tiny_clip, x, PROMPTS), atol=1e-5)
    bf16 = get_reward("hps", dtype="bf16", checkpoint=str(path), arch=TINY)(x, PROMPTS)
    assert bf16.dtype == torch.float32 and torch.allclose(bf16, a, atol=0.05)


@pytest.mark.slow
def test_hps_from_env_and_from_the_hub_cache(tiny_clip, tmp_path, monkeypatch):
    sd = {"state_dict": tiny_clip.state_dict()}
    torch.save(sd, tmp_path / "w.pt")
    monkeypatch.setenv("TREEGRPO_HPS_CHECKPOINT", str(tmp_path / "w.pt"))
    assert get_reward("hps", arch=TINY).source == str(tmp_path / "w.pt")
    monkeypatch.delenv("TREEGRPO_HPS_CHECKPOINT")
    repo = tmp_path / "hub" / "models--xswu--HPSv2"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    torch.save(sd, repo / "snapshots" / "abc123" / "HPS_v2_compressed.pt")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert get_reward("hps", version="v2.0", arch=TINY).source.endswith("abc123/HPS_v2_compressed.pt")
    with pytest.raises(TreegrpoError, match="HPS_v2.1_compressed.pt"):
        get_reward("hps", arch=TINY)  # v2.1 is not in that cache


def test_hps_rejects_a_wrong_checkpoint(tiny_clip, tmp_path):
    sd = dict(tiny_clip.state_dict())
    sd.pop("logit_scale")
    sd["extra.weight"] = torch.zeros(1)
    torch.save({"state_dict": sd}, tmp_path / "bad.pt")
    with pytest.raises(TreegrpoError, match="1 tensors missing .*logit_scale.*1 unexpected"):
        get_reward("hps", checkpoint=str(tmp_path / "bad.pt"), arch=TINY)
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    with pytest.raises(TreegrpoError, match="not a loadable weights file"):
        get_reward("hps", checkpoint=str(tmp_path / "junk.pt"), arch=TINY)
    with pytest.raises(TreegrpoError, match="hps.checkpoint: no HPS v2.1 checkpoint at"):
        get_reward("hps", checkpoint=str(tmp_path / "missing.pt"), arch=TINY)


# --- clip and aesthetic ------------------------------------------------------------------------


@pytest.mark.slow
def test_clip_score_equals_open_clip_and_infers_quick_gelu(tiny_clip, tmp_path):
    (tmp_path / "openai").mkdir()
    for p in (tmp_path / "w.bin", tmp_path / "openai" / "w.bin"):
        torch.save(tiny_clip.state_dict(), p)
    x = images()
    reward = get_reward("clip", checkpoint=str(tmp_path / "w.bin"), arch=TINY)
    a = reward(x, PROMPTS)
    assert a.dtype == torch.float32 and a.shape == (3,) and torch.equal(a, reward(x, PROMPTS))  # deterministic
    assert torch.allclose(a, open_clip_direct(tiny_clip, x, PROMPTS), atol=1e-5)

    def act(r) -> str:
        return type(r.clip.model.visual.transformer.resblocks[0].mlp.gelu).__name__

    assert act(reward) == "GELU"
    assert act(get_reward("clip", checkpoint=str(tmp_path / "openai" / "w.bin"), arch=TINY)) == "QuickGELU"
    clipscore = get_reward("clip", checkpoint=str(tmp_path / "w.bin"), arch=TINY, form="clipscore")(x, PROMPTS)
    assert torch.allclose(clipscore, 2.5 * reward(x, PROMPTS).clamp(min=0), atol=1e-6)


def test_aesthetic_head_on_normalised_image_embeddings(tiny_clip, tmp_path):
    from treegrpo_cli.rewards.vision import MLPHead

    torch.manual_seed(3)
    head = MLPHead(16).eval()
    assert sorted(head.state_dict()) == sorted(f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias"))
    torch.save(head.state_dict(), tmp_path / "sac+logos+ava1-l14-linearMSE.pth")
    torch.save(tiny_clip.state_dict(), tmp_path / "vit.bin")
    reward = get_reward(
        "aesthetic",
        head=str(tmp_path / "sac+logos+ava1-l14-linearMSE.pth"),
        clip=str(tmp_path / "vit.bin"),
        arch=TINY,
        quick_gelu="false",
    )
    x = images()
    emb = tiny_clip.encode_image(reward.clip.prep(x), normalize=True)
    with torch.no_grad():
        want = head(emb).squeeze(-1)
    got = reward(x, ["ignored"] * 3)
    assert torch.allclose(got, want, atol=1e-5) and torch.equal(got, reward(x, PROMPTS))


# --- pick --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_pick(tmp_path_factory):
    """A tiny CLIPModel (model folder) and a CLIP processor with a character-level BPE tokenizer."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    vocab = {}
    for s in sorted(ByteLevel.alphabet()):
        vocab.setdefault(s, len(vocab))
    for s in sorted(ByteLevel.alphabet()):
        vocab.setdefault(s + "</w>", len(vocab))
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    tok = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)
    torch.manual_seed(0)
    text = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    vision = dict(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2
    )
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).eval()
    root = tmp_path_factory.mktemp("pick")
    model.save_pretrained(root / "PickScore_v1")
    proc = CLIPProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=tok,
    )
    proc.save_pretrained(root / "processor")
    return model, proc, root


def test_pick_equals_transformers_clip(tiny_pick):
    from PIL import Image

    model, proc, root = tiny_pick
    x = images(3, 40, 53)
    pil = [Image.fromarray((im * 255).round().byte().permute(1, 2, 0).numpy()) for im in x]
    with torch.no_grad():
        out = model(**proc(text=PROMPTS, images=pil, padding=True, return_tensors="pt"))
    logit = out.logits_per_image.diag()  # logit_scale.exp() * cosine
    opts = dict(model=str(root / "PickScore_v1"), processor=str(root / "processor"), batch_size=2)
    cos = get_reward("pick", **opts)(x, PROMPTS)
    assert torch.equal(cos, get_reward("pick", **opts)(x, PROMPTS))
    assert torch.allclose(cos, logit / model.logit_scale.exp(), atol=1e-5)
    assert torch.allclose(get_reward("pick", form="logit", **opts)(x, PROMPTS), logit, atol=1e-4)
    with pytest.raises(ConfigError, match="pick.form"):
        get_reward("pick", form="x100", **opts)


# --- imagereward -------------------------------------------------------------------------------


def official_imagereward_keys(depth=24, layers=12):
    """The tensor names of THUDM/ImageReward's ImageReward.pt (BLIP_Pretrain(vit='large') + MLP)."""
    v = "blip.visual_encoder."
    keys = [v + "cls_token", v + "pos_embed", v + "patch_embed.proj.weight", v + "patch_embed.proj.bias"]
    for i in range(depth):
        keys += [
            f"{v}blocks.{i}.{m}.{p}"
            for m in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")
            for p in ("weight", "bias")
        ]
    keys += [v + "norm.weight", v + "norm.bias"]
    t = "blip.text_encoder."
    keys += [
        t + "embeddings.position_ids",
        t + "embeddings.word_embeddings.weight",
        t + "embeddings.position_embeddings.weight",
        t + "embeddings.LayerNorm.weight",
        t + "embeddings.LayerNorm.bias",
    ]
    parts = [f"{a}.self.{q}" for a in ("attention", "crossattention") for q in ("query", "key", "value")]
    parts += [f"{a}.output.{q}" for a in ("attention", "crossattention") for q in ("dense", "LayerNorm")]
    parts += ["intermediate.dense", "output.dense", "output.LayerNorm"]
    for i in range(layers):
        keys += [f"{t}encoder.layer.{i}.{m}.{p}" for m in parts for p in ("weight", "bias")]
    keys += [f"blip.{m}.{p}" for m in ("vision_proj", "text_proj") for p in ("weight", "bias")]
    return keys + [f"mlp.layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")]


def test_full_size_imagereward_has_the_official_names_and_shapes():
    from treegrpo_cli.rewards.blip import ImageRewardNet

    with torch.device("meta"):
        sd = ImageRewardNet().state_dict()
    assert sorted(sd) == sorted(official_imagereward_keys()) and len(sd) == 625
    shapes = {
        "blip.visual_encoder.blocks.0.attn.qkv.weight": (3072, 1024),
        "blip.visual_encoder.pos_embed": (1, 197, 1024),
        "blip.visual_encoder.patch_embed.proj.weight": (1024, 3, 16, 16),
        "blip.text_encoder.encoder.layer.0.crossattention.self.query.weight": (768, 768),
        "blip.text_encoder.encoder.layer.0.crossattention.self.key.weight": (768, 1024),
        "blip.text_encoder.embeddings.word_embeddings.weight": (30524, 768),
        "blip.text_encoder.embeddings.position_ids": (1, 512),
        "blip.vision_proj.weight": (256, 1024),
        "blip.text_proj.weight": (256, 768),
        "mlp.layers.0.weight": (1024, 768),
        "mlp.layers.7.weight": (1, 16),
    }
    for k, shape in shapes.items():
        assert tuple(sd[k].shape) == shape, k
    assert 440e6 < sum(t.numel() for t in sd.values()) < 450e6  # ImageReward.pt is 1.79 GB of fp32


@pytest.fixture
def tiny_imagereward(tmp_path):
    """ImageReward.pt, med_config.json and a WordPiece vocab for a tiny BLIP (ViT width 64, 2 blocks)."""
    from treegrpo_cli.rewards.blip import ImageRewardNet, TextConfig, VisionConfig

    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "a",
        "red",
        "circle",
        "two",
        "blue",
        "square",
        "##s",
        "above",
        "green",
        "triangle",
        "photo",
        "of",
        "cat",
    ]
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(words) + "\n")
    med = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=40,
        vocab_size=len(words) + 2,
        hidden_act="gelu",
        add_cross_attention=True,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        encoder_width=32,
    )
    (tmp_path / "med_config.json").write_text(json.dumps(med))
    vision = VisionConfig(image_size=32, patch_size=8, width=64, depth=2, heads=1)
    torch.manual_seed(0)
    net = ImageRewardNet(vision, TextConfig.from_dict(med, vision.width))
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.2)
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    torch.save(sd, tmp_path / "ImageReward.pt")
    opts = dict(
        checkpoint=str(tmp_path / "ImageReward.pt"),
        med_config=str(tmp_path / "med_config.json"),
        tokenizer=str(tmp_path / "bert"),
    )
    return sd, opts, tmp_path


def test_imagereward_loads_every_key_and_round_trips(tiny_imagereward):
    sd, opts, _ = tiny_imagereward
    reward = get_reward("imagereward", **opts)
    got = reward.net.state_dict()
    assert sorted(got) == sorted(sd) == sorted(official_imagereward_keys(depth=2, layers=2))
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    x = images(3, 32, 32)
    a = reward(x, PROMPTS)
    assert a.shape == (3,) and a.dtype == torch.float32 and torch.isfinite(a).all()
    assert torch.equal(a, reward(x, PROMPTS))
    assert torch.allclose(a, get_reward("imagereward", batch_size=1, **opts)(x, PROMPTS), atol=1e-5)
    assert not torch.equal(a, reward(x.flip(-1), PROMPTS))  # the image matters
    assert not torch.equal(a, reward(x, PROMPTS[::-1]))  # the prompt matters
    tok = reward.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert tok["input_ids"].shape == (3, 35)  # padded to 35 tokens, as released
    assert reward.tokenizer.convert_tokens_to_ids(["[DEC]", "[ENC]"]) == [18, 19]  # BLIP's two added tokens
    net = reward.net
    with torch.no_grad():
        h = net.blip.text_encoder(tok["input_ids"], tok["attention_mask"], net.blip.visual_encoder(reward.prep(x)))
        raw = net.mlp(h[:, 0]).squeeze(-1)  # the head on the first token
    assert torch.allclose(a, (raw - 0.16717362830052426) / 1.0333394966054072, atol=1e-5)  # the release's norm


def test_imagereward_rejects_missing_and_unexpected_keys(tiny_imagereward):
    sd, opts, d = tiny_imagereward
    broken = dict(sd)
    broken.pop("blip.text_encoder.encoder.layer.1.crossattention.self.key.weight")
    broken["blip.text_decoder.cls.weight"] = torch.zeros(1)
    torch.save(broken, d / "broken.pt")
    with pytest.raises(TreegrpoError, match="1 tensors missing .*crossattention.*1 unexpected .*text_decoder"):
        get_reward("imagereward", **{**opts, "checkpoint": str(d / "broken.pt")})
    no_ids = {k: v for k, v in sd.items() if not k.endswith("position_ids")}  # newer transformers do not save it
    torch.save(no_ids, d / "no_ids.pt")
    get_reward("imagereward", **{**opts, "checkpoint": str(d / "no_ids.pt")})


def test_blip_vit_equals_timm_vision_transformer():
    timm = pytest.importorskip("timm")
    from treegrpo_cli.rewards.blip import VisionConfig, VisionTransformer

    torch.manual_seed(0)
    ours = VisionTransformer(VisionConfig(image_size=32, patch_size=8, width=64, depth=2, heads=2))
    for p in ours.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=0, global_pool=""
    )
    ref.load_state_dict(ours.state_dict(), strict=True)  # same names, same shapes
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(ours.eval()(x), ref.eval().forward_features(x), atol=1e-5)


def test_blip_text_encoder_equals_transformers_bert_with_cross_attention():
    """Our BLIP text encoder (multimodal mode) against transformers' BertModel with cross-attention layers,
    bidirectional self-attention, the same weights (BLIP has no token-type embeddings: zeros), padded rows."""
    from treegrpo_cli.compat import ensure_torchvision
    from treegrpo_cli.rewards.blip import BertModel, TextConfig

    ensure_torchvision()
    from transformers import BertConfig
    from transformers import BertModel as HFBert

    med = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=40,
        vocab_size=20,
        hidden_act="gelu",
        add_cross_attention=True,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        encoder_width=32,
    )
    torch.manual_seed(0)
    ours = BertModel(TextConfig.from_dict(med, 32)).eval()
    for p in ours.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ref = HFBert(
        BertConfig(
            vocab_size=20,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            max_position_embeddings=40,
            hidden_act="gelu",
            layer_norm_eps=1e-12,
            pad_token_id=0,
            is_decoder=True,
            add_cross_attention=True,
        ),
        add_pooling_layer=False,
    )
    sd = {k: v for k, v in ours.state_dict().items() if k != "embeddings.position_ids"}
    sd["embeddings.token_type_embeddings.weight"] = torch.zeros_like(ref.embeddings.token_type_embeddings.weight)
    ref.load_state_dict(sd, strict=True)
    ref.config.is_decoder = False  # the layers keep their cross-attention; self-attention is bidirectional
    ref.eval()
    ids = torch.tensor([[2, 5, 6, 7, 3, 0, 0], [2, 8, 9, 10, 11, 12, 3]])
    mask, image = (ids != 0).long(), torch.randn(2, 5, 32)
    with torch.no_grad():
        got = ours(ids, mask, image)
        want = ref(input_ids=ids, attention_mask=mask, encoder_hidden_states=image).last_hidden_state
    keep = mask.bool()  # padded positions are never read (the score uses the first token)
    assert torch.allclose(got[keep], want[keep], atol=1e-5), float((got - want)[keep].abs().max())
