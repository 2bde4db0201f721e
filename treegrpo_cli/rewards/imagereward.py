"""ImageReward v1.0 (Xu et al. 2023, arXiv 2304.05977) on our own BLIP code (blip.py), without the
`image-reward` package (which cannot be installed beside current transformers; deps-and-weights.md 3d).

The prompt (BERT WordPiece, padded to 35 tokens, as released) cross-attends to the ViT-L image
tokens; the MLP head on the first token, normalised by the release's mean and std, is the score
(about -2 to 2; FLUX averages about 1.1 in the GRPO papers' tables). Images are preprocessed like
the release's transform (224 px shortest edge, bicubic, centre crop, CLIP mean/std) on tensors.

    imagereward.checkpoint  ImageReward.pt (a state dict); $TREEGRPO_IMAGEREWARD_CHECKPOINT; hub cache
                            THUDM/ImageReward; ~/.cache/ImageReward/ (where the package puts it)
    imagereward.med_config  med_config.json; $TREEGRPO_IMAGEREWARD_MED_CONFIG; same places; when absent
                            the release's values (blip.OFFICIAL_MED_CONFIG) are used
    imagereward.tokenizer   a bert-base-uncased tokenizer folder (vocab.txt); $TREEGRPO_BERT_TOKENIZER;
                            hub cache google-bert/bert-base-uncased or bert-base-uncased
    imagereward.batch_size  images per forward (16)

Every tensor of the checkpoint is loaded with strict=True (none missing, none unexpected); only the
`position_ids` buffer (arange(512), which older transformers saved and newer ones do not) is filled
in when a file lacks it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..compat import ensure_torchvision
from ..errors import TreegrpoError
from .base import register
from .blip import OFFICIAL_MED_CONFIG, ImageRewardNet, TextConfig, vision_config_of
from .vision import ImagePrep, ModelReward, as_int, quiet
from .weights import CACHE, Needed, find, load_state_dict, load_strict, resolve

RELEASE_CACHE = Path.home() / ".cache" / "ImageReward"
MAX_TOKENS = 35
POSITION_IDS = "blip.text_encoder.embeddings.position_ids"

CHECKPOINT = Needed(
    "ImageReward checkpoint",
    "imagereward.checkpoint",
    ("TREEGRPO_IMAGEREWARD_CHECKPOINT",),
    hub=(("THUDM/ImageReward", "ImageReward.pt"),),
    places=(CACHE / "ImageReward.pt", RELEASE_CACHE / "ImageReward.pt"),
)
MED_CONFIG = Needed(
    "med_config.json",
    "imagereward.med_config",
    ("TREEGRPO_IMAGEREWARD_MED_CONFIG",),
    hub=(("THUDM/ImageReward", "med_config.json"),),
    places=(CACHE / "med_config.json", RELEASE_CACHE / "med_config.json"),
)
TOKENIZER = Needed(
    "bert-base-uncased tokenizer folder",
    "imagereward.tokenizer",
    ("TREEGRPO_BERT_TOKENIZER",),
    hub=(("google-bert/bert-base-uncased", ""), ("bert-base-uncased", "")),
    needs=("vocab.txt", "tokenizer.json"),
)


def load_net(checkpoint: Path, med_config: Path | None = None) -> ImageRewardNet:
    """The network with every tensor of `checkpoint` (strict); the ViT geometry comes from its shapes."""
    sd = load_state_dict(checkpoint)
    vision = vision_config_of(sd)
    text = (
        TextConfig.from_json(med_config, vision.width)
        if med_config
        else TextConfig.from_dict(OFFICIAL_MED_CONFIG, vision.width)
    )
    if POSITION_IDS not in sd:
        sd[POSITION_IDS] = torch.arange(text.max_position_embeddings).expand((1, -1))
    net = ImageRewardNet(vision, text)
    load_strict(net, sd, checkpoint, "ImageReward checkpoint")
    return net.eval()


def load_tokenizer(folder: Path, vocab_size: int):
    """BLIP's tokenizer: bert-base-uncased plus the [DEC] bos token and the [ENC] special token."""
    ensure_torchvision()
    from transformers import BertTokenizer

    try:
        with quiet():
            tok = BertTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise TreegrpoError(f"{folder}: not a BERT tokenizer folder ({' '.join(str(e).split())[:120]})") from None
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    if len(tok) > vocab_size:
        raise TreegrpoError(f"{folder}: {len(tok)} tokens, more than the checkpoint's {vocab_size} embeddings")
    return tok


class ImageReward(ModelReward):
    """ImageReward v1.0: BLIP ViT-L + BERT cross-attention + MLP head, normalised as released."""

    name = "imagereward"

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        checkpoint: str | None = None,
        med_config: str | None = None,
        tokenizer: str | None = None,
        batch_size: int | str = 16,
    ):
        super().__init__(device, dtype, as_int(batch_size, "imagereward.batch_size"))
        ck, tok_dir = resolve("imagereward", [(CHECKPOINT, checkpoint), (TOKENIZER, tokenizer)])
        self.net = load_net(ck, find(MED_CONFIG, med_config)).to(self.device, dtype)
        self.tokenizer = load_tokenizer(tok_dir, self.net.text_cfg.vocab_size)
        size = self.net.vision_cfg.image_size
        self.prep = ImagePrep(size, size)
        self.source = str(ck)

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        pixels = self.prep(images).to(self.dtype)  # [b, 3, 224, 224]
        tok = self.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
        ).to(self.device)
        return self.net(pixels, tok["input_ids"], tok["attention_mask"])  # [b]


register(
    "imagereward",
    ImageReward,
    options=("checkpoint", "med_config", "tokenizer", "batch_size"),
    on_device=True,
    summary="ImageReward v1.0 (own BLIP code), about -2..2",
    needs=lambda checkpoint=None, tokenizer=None, **_: [(CHECKPOINT, checkpoint), (TOKENIZER, tokenizer)],
)
