"""PickScore (Kirstain et al. 2023, arXiv 2305.01569): a CLIP-H fine-tuned on Pick-a-Pic preferences.

A transformers CLIPModel (`yuvalkirstain/PickScore_v1`) with the processor of
`laion/CLIP-ViT-H-14-laion2B-s32B-b79K`, re-implemented on tensors: the image side follows the
folder's preprocessor_config.json with CLIPImageProcessor's uint8 semantics (vision.ImagePrep), the
text side is the folder's tokenizer (padding, truncation at 77 tokens).

Two forms; the DEFAULT is `cosine`:
    cosine  the cosine of the normalised projected embeddings (about 0.20-0.24): the scale of the
            DanceGRPO / MixGRPO / BranchGRPO / TreeGRPO tables (e.g. FLUX 0.227; methods.md 1.4)
    logit   logit_scale.exp() * cosine (about 100x, e.g. 21-23): the PickScore paper's and the
            Flow-GRPO tables' scale (e.g. 23.58)

    pick.model       the PickScore_v1 folder (config.json + model.safetensors or pytorch_model.bin);
                     $TREEGRPO_PICKSCORE_MODEL; hub cache yuvalkirstain/PickScore_v1
    pick.processor   the CLIP-H processor folder (preprocessor_config.json + tokenizer files);
                     $TREEGRPO_PICKSCORE_PROCESSOR; hub cache laion/CLIP-ViT-H-14-laion2B-s32B-b79K
    pick.form        cosine (default) | logit
    pick.batch_size  images per forward (16)
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import ensure_torchvision
from ..errors import TreegrpoError
from ..store.safeio import loads_json
from .base import register
from .vision import CLIP_MEAN, CLIP_STD, ImagePrep, ModelReward, as_choice, as_int, quiet
from .weights import Needed, resolve

MODEL = Needed(
    "PickScore model folder",
    "pick.model",
    ("TREEGRPO_PICKSCORE_MODEL",),
    hub=(("yuvalkirstain/PickScore_v1", ""),),
    needs=("config.json",),
)
PROCESSOR = Needed(
    "CLIP-H processor folder",
    "pick.processor",
    ("TREEGRPO_PICKSCORE_PROCESSOR",),
    hub=(("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", ""),),
    needs=("preprocessor_config.json", "processor_config.json"),
)
RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL resample codes of preprocessor_config.json


def processor_prep(folder: Path) -> ImagePrep:
    """The image side of CLIPImageProcessor, from the folder's preprocessor_config.json (or, as
    transformers 5 saves it, the "image_processor" table of processor_config.json)."""
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        path = folder / "processor_config.json"
    try:
        cfg = loads_json(path.read_text())
    except ValueError:
        raise TreegrpoError(f"{path}: not valid JSON") from None
    cfg = cfg.get("image_processor", cfg)
    size, crop = cfg.get("size", {"shortest_edge": 224}), cfg.get("crop_size", 224)
    size = size.get("shortest_edge") if isinstance(size, dict) else size
    crop = crop.get("height") if isinstance(crop, dict) else crop
    if not isinstance(size, int) or not isinstance(crop, int) or not cfg.get("do_center_crop", True):
        raise TreegrpoError(f"{path}: expected a CLIP processor (shortest_edge resize and a square centre crop)")
    resample = RESAMPLE.get(cfg.get("resample", 3))
    if resample is None or abs(cfg.get("rescale_factor", 1 / 255) - 1 / 255) > 1e-12:
        raise TreegrpoError(f"{path}: unsupported resample {cfg.get('resample')} or rescale_factor")
    return ImagePrep(
        size, crop, tuple(cfg.get("image_mean", CLIP_MEAN)), tuple(cfg.get("image_std", CLIP_STD)), resample, uint8=True
    )


def pooled(out) -> Tensor:
    """get_*_features returns a tensor (transformers 4) or an output whose pooler_output is projected (5)."""
    return out if torch.is_tensor(out) else out.pooler_output


class PickScore(ModelReward):
    """PickScore_v1: cosine (default) or logit-scaled cosine of CLIP-H image and text embeddings."""

    name = "pick"

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        model: str | None = None,
        processor: str | None = None,
        form: str = "cosine",
        batch_size: int | str = 16,
    ):
        super().__init__(device, dtype, as_int(batch_size, "pick.batch_size"))
        self.form = as_choice(form, "pick.form", ("cosine", "logit"))
        model_dir, proc_dir = resolve("pick", [(MODEL, model), (PROCESSOR, processor)])
        ensure_torchvision()
        from transformers import AutoTokenizer, CLIPModel, CLIPTextConfig

        try:
            with quiet():
                self.model = CLIPModel.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
                self.tokenizer = AutoTokenizer.from_pretrained(proc_dir, local_files_only=True)
        except (OSError, ValueError) as e:
            why = " ".join(str(e).split())[:160]
            raise TreegrpoError(f"pick: cannot load {model_dir} / {proc_dir} ({why})") from None
        self.model = self.model.eval().to(self.device)
        self.prep = processor_prep(proc_dir)
        text = self.model.config.text_config  # a CLIPTextConfig once loaded (the constructor also takes a dict)
        if not isinstance(text, CLIPTextConfig):
            raise TreegrpoError(f"pick: {model_dir} has no CLIP text config")
        self.max_length = min(77, int(text.max_position_embeddings))
        self.source = f"{model_dir} + {proc_dir}"

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        pixels = self.prep(images).to(self.dtype)  # [b, 3, 224, 224]
        tok = self.tokenizer(
            prompts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        img = F.normalize(pooled(self.model.get_image_features(pixel_values=pixels)).float(), dim=-1)  # [b, D]
        txt = F.normalize(
            pooled(
                self.model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
            ).float(),
            dim=-1,
        )
        cos = (img * txt).sum(-1)  # [b]
        return cos * self.model.logit_scale.exp().float() if self.form == "logit" else cos


register(
    "pick",
    PickScore,
    options=("model", "processor", "form", "batch_size"),
    on_device=True,
    summary="PickScore_v1 (transformers CLIP-H): cosine ~0.20-0.24 by default, or x logit scale",
    needs=lambda model=None, processor=None, **_: [(MODEL, model), (PROCESSOR, processor)],
)
