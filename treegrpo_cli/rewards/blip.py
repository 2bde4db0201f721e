"""ImageReward's network (Xu et al. 2023, arXiv 2304.05977): BLIP's ViT and BERT "med" text encoder
plus an MLP head, written from the architecture description; the parameter names are those of the
official release, so `ImageReward.pt` loads with strict=True (imagereward.py).

    blip.visual_encoder   ViT (BLIP `create_vit('large')`): 16 px patches, width 1024, 24 blocks, 16 heads,
                          pre-norm blocks (LayerNorm eps 1e-6), exact GELU, a final LayerNorm; returns
                          every token [B, 1 + (224/16)^2, 1024]
    blip.text_encoder     BERT-base from med_config.json without token-type embeddings or pooler; every
                          layer has self-attention, cross-attention to the image tokens (keys and values
                          from the 1024-d vision width), and a feed-forward block (post-norm, eps 1e-12);
                          additive -10000 attention masks as in BERT
    blip.vision_proj / blip.text_proj   BLIP's 256-d contrastive projections (loaded, unused by the score)
    mlp                   MLPHead(768) on the text encoder's first token

score = (mlp(text_encoder(prompt tokens, cross-attending to the image)[:, 0]) - MEAN) / STD.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import TreegrpoError
from ..store.safeio import loads_json
from .vision import MLPHead

MEAN, STD = 0.16717362830052426, 1.0333394966054072  # the official release's reward normalisation
EMBED_DIM = 256  # BLIP's contrastive projection width

# med_config.json of THUDM/ImageReward (BERT-base with cross-attention; 30522 + [DEC], [ENC] tokens)
OFFICIAL_MED_CONFIG = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "vocab_size": 30524,
    "encoder_width": 768,
    "add_cross_attention": True,
}


@dataclass(frozen=True)
class VisionConfig:
    """BLIP's ViT; the defaults are ViT-L/16 at 224 px (vit='large')."""

    image_size: int = 224
    patch_size: int = 16
    width: int = 1024
    depth: int = 24
    heads: int = 16
    mlp_ratio: float = 4.0


@dataclass(frozen=True)
class TextConfig:
    """The med_config.json fields the text encoder uses (encoder_width is set to the vision width)."""

    vocab_size: int = 30524
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    encoder_width: int = 1024

    @classmethod
    def from_dict(cls, d: dict, encoder_width: int) -> TextConfig:
        names = {f.name for f in fields(cls)} - {"encoder_width"}
        if d.get("hidden_act", "gelu") != "gelu" or not d.get("add_cross_attention", True):
            raise TreegrpoError("med config: expected hidden_act 'gelu' and add_cross_attention true")
        return cls(**{k: v for k, v in d.items() if k in names}, encoder_width=encoder_width)

    @classmethod
    def from_json(cls, path: Path, encoder_width: int) -> TextConfig:
        try:
            d = loads_json(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise TreegrpoError(f"{path}: not a readable med_config.json ({' '.join(str(e).split())[:80]})") from None
        return cls.from_dict(d, encoder_width)


def _attend(q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None = None) -> Tensor:
    """q [B, Lq, D], k/v [B, Lk, D], additive mask [B, 1, 1, Lk] -> [B, Lq, D]."""
    b, lq, d = q.shape

    def split(t: Tensor) -> Tensor:
        return t.view(b, t.shape[1], heads, d // heads).transpose(1, 2)  # [B, h, L, d/h]

    out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask)
    return out.transpose(1, 2).reshape(b, lq, d)


# --- the vision transformer ------------------------------------------------------------------


class PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.proj = nn.Conv2d(3, cfg.width, cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, 3, H, W] -> [B, N, D]


class ViTAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # [B, N, D] each
        return self.proj(_attend(q, k, v, self.heads))


class ViTMlp(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        hidden = int(cfg.width * cfg.mlp_ratio)
        self.fc1, self.fc2 = nn.Linear(cfg.width, hidden), nn.Linear(hidden, cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(cfg.width, eps=1e-6), nn.LayerNorm(cfg.width, eps=1e-6)
        self.attn, self.mlp = ViTAttention(cfg), ViTMlp(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        n = (cfg.image_size // cfg.patch_size) ** 2
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, cfg.width))
        self.blocks = nn.ModuleList(ViTBlock(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.width, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, 3, S, S] normalised -> tokens [B, 1 + (S/patch)^2, width]."""
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos_embed[:, : x.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)


# --- the BERT "med" text encoder -------------------------------------------------------------


class BertEmbeddings(nn.Module):
    position_ids: Tensor  # [1, max positions] buffer

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.register_buffer("position_ids", torch.arange(cfg.max_position_embeddings).expand((1, -1)))

    def forward(self, ids: Tensor) -> Tensor:
        pos = self.position_ids[:, : ids.shape[1]]
        return self.LayerNorm(self.word_embeddings(ids) + self.position_embeddings(pos))  # [B, L, H]


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: TextConfig, cross: bool):
        super().__init__()
        kv_in = cfg.encoder_width if cross else cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key, self.value = nn.Linear(kv_in, cfg.hidden_size), nn.Linear(kv_in, cfg.hidden_size)

    def forward(self, x: Tensor, mask: Tensor | None, context: Tensor | None = None) -> Tensor:
        src = x if context is None else context
        return _attend(self.query(x), self.key(src), self.value(src), self.heads, mask)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: TextConfig, inner: int | None = None):
        super().__init__()
        self.dense = nn.Linear(inner or cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: TextConfig, cross: bool = False):
        super().__init__()
        self.self, self.output = BertSelfAttention(cfg, cross), BertSelfOutput(cfg)

    def forward(self, x: Tensor, mask: Tensor | None, context: Tensor | None = None) -> Tensor:
        return self.output(self.self(x, mask, context), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.attention, self.crossattention = BertAttention(cfg), BertAttention(cfg, cross=True)
        self.intermediate, self.output = BertIntermediate(cfg), BertSelfOutput(cfg, cfg.intermediate_size)

    def forward(self, x: Tensor, mask: Tensor, image: Tensor, image_mask: Tensor | None) -> Tensor:
        x = self.attention(x, mask)
        x = self.crossattention(x, image_mask, image)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))


class BertModel(nn.Module):
    """BLIP's text encoder in multimodal mode (no pooler)."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.embeddings, self.encoder = BertEmbeddings(cfg), BertEncoder(cfg)

    def forward(self, ids: Tensor, attention_mask: Tensor, image: Tensor) -> Tensor:
        """ids, attention_mask [B, L]; image tokens [B, N, encoder_width] -> hidden states [B, L, H]."""
        x = self.embeddings(ids)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0  # [B, 1, 1, L]
        for layer in self.encoder.layer:
            x = layer(x, mask, image, None)  # every image token is attended (an all-ones mask adds 0)
        return x


class BLIP(nn.Module):
    def __init__(self, vision: VisionConfig, text: TextConfig):
        super().__init__()
        self.visual_encoder, self.text_encoder = VisionTransformer(vision), BertModel(text)
        self.vision_proj = nn.Linear(vision.width, EMBED_DIM)
        self.text_proj = nn.Linear(text.hidden_size, EMBED_DIM)


class ImageRewardNet(nn.Module):
    """blip + mlp, with the parameter names of ImageReward.pt."""

    def __init__(self, vision: VisionConfig = VisionConfig(), text: TextConfig | None = None):
        super().__init__()
        text = text or TextConfig.from_dict(OFFICIAL_MED_CONFIG, vision.width)
        self.vision_cfg, self.text_cfg = vision, text
        self.blip = BLIP(vision, text)
        self.mlp = MLPHead(text.hidden_size)

    def forward(self, pixels: Tensor, ids: Tensor, attention_mask: Tensor) -> Tensor:
        """pixels [B, 3, S, S] normalised, ids/attention_mask [B, L] -> normalised rewards [B] float32."""
        image = self.blip.visual_encoder(pixels)  # [B, N, width]
        h = self.blip.text_encoder(ids, attention_mask, image)  # [B, L, hidden]
        raw = self.mlp(h[:, 0].to(self.mlp.layers[0].weight.dtype)).squeeze(-1).float()
        return (raw - MEAN) / STD


def vision_config_of(sd: dict[str, Tensor]) -> VisionConfig:
    """BLIP's ViT geometry from a state dict's shapes (heads: width / 64, as ViT-B and ViT-L have)."""
    try:
        w = sd["blip.visual_encoder.patch_embed.proj.weight"]  # [width, 3, p, p]
        n = sd["blip.visual_encoder.pos_embed"].shape[1] - 1  # patches
        fc1 = sd["blip.visual_encoder.blocks.0.mlp.fc1.weight"]  # [hidden, width]
    except KeyError as e:
        raise TreegrpoError(f"not an ImageReward state dict (no {e.args[0]})") from None
    depth = len({k.split(".")[3] for k in sd if k.startswith("blip.visual_encoder.blocks.")})
    width, patch = int(w.shape[0]), int(w.shape[-1])
    return VisionConfig(int(round(n**0.5)) * patch, patch, width, depth, max(1, width // 64), fc1.shape[0] / width)
