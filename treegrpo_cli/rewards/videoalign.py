"""VideoAlign's VideoReward (Liu et al. 2025, arXiv 2501.13918; code KwaiVGI/VideoAlign, weights
KwaiVGI/VideoReward): Qwen2-VL-2B-Instruct with a LoRA and a linear reward head, three scores per clip.

The prompt (the release's `detailed_special` template, videoalign_prompt.py) holds three added tokens,
<|VQ_reward|>, <|MQ_reward|> and <|TA_reward|>; the last hidden state at each, times rm_head (no bias), is VQ
(visual quality), MQ (motion quality) and TA (text alignment) (with output_dim 3, token k reads channel k).
Each is normalised with model_config.json's inference_config means and stds; Overall = VQ + MQ + TA. As in
the release (transformers 4.45), the language model sees the plain positions 0..L-1 on all three M-RoPE axes.
BranchGRPO trains Wan2.1 on the motion-quality score: `videoalign.head=mq`.

Clips [B, 3, F, H, W] in [0, 1] (F >= 2) are quantised to uint8 as a decoded video is. Frames are kept as the
release's reader keeps them: n = F / video_fps * fps (at least 4, at most F, rounded to even) or num_frames,
at linspace(0, F - 1, n).round(). They are resized (bicubic, antialiased, rounded to uint8) to sides that are
multiples of 28 with 128*28*28 <= pixels <= max_pixels, then by the processor's own size rule (the identity
unless max_pixels is tiny); Qwen2-VL's processor rescales by 1/255, normalises and patchifies them.

    videoalign.checkpoint  the VideoReward folder: model_config.json and checkpoint-N/ holding
                           adapter_model.safetensors, adapter_config.json and non_lora_state_dict.pth;
                           $TREEGRPO_VIDEOALIGN_CHECKPOINT; hub cache KwaiVGI/VideoReward
    videoalign.base        the Qwen2-VL-2B-Instruct folder (weights, tokenizer, processor); $TREEGRPO_QWEN2VL;
                           hub cache Qwen/Qwen2-VL-2B-Instruct
    videoalign.step        which checkpoint-N (default: the largest N)
    videoalign.head        overall (default) | vq | mq | ta
    videoalign.norm        true (default): normalise with inference_config; false: the head's raw outputs
    videoalign.fps, videoalign.num_frames, videoalign.max_pixels
                           override data_config's fps, num_frames and max_frame_pixels (one of fps, num_frames)
    videoalign.video_fps   the frame rate of the scored clips (16, Wan's)
    videoalign.batch_size  clips per forward (2)

The LoRA is merged into the base weights (W += alpha / r * B @ A; alpha / sqrt(r) with rslora). Every tensor
of the adapter file and of non_lora_state_dict.pth (rm_head, the resized embeddings, the fine-tuned vision
tower) must find its place, else one error line; only lm_head (unused, tied to the embeddings) is skipped.
Keys may carry the release's transformers-4.45 names or transformers 5's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat import ensure_torchvision
from ..errors import ConfigError, TreegrpoError
from ..store.safeio import loads_json
from .base import register
from .videoalign_prompt import DETAILED_SPECIAL
from .vision import ModelReward, as_bool, as_choice, as_int, quiet
from .weights import Needed, load_state_dict, resolve

TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")
DIMS = ("VQ", "MQ", "TA")
HEADS = ("overall", "vq", "mq", "ta")
FACTOR = 28  # patch 14 x spatial merge 2: frame sides are multiples of this
MIN_PIXELS = 128 * 28 * 28  # the release's video reader never shrinks a frame below this
MIN_FRAMES, MAX_FRAMES = 4, 768  # its bounds on the frame count when sampling by fps
EMBED = "language_model.embed_tokens.weight"
LORA = re.compile(r"^(.*)\.lora_([AB])(?:\.default)?\.weight$")
OPTIONS = ("checkpoint", "base", "step", "head", "norm", "fps", "num_frames", "max_pixels", "video_fps", "batch_size")
FILES = ("adapter_model.safetensors", "adapter_config.json", "non_lora_state_dict.pth")
SETTING: dict[str, list[Any]] = dict(reward_token=["special"], use_special_tokens=[True], output_dim=[1, 3])
SETTING |= dict(prompt_template_type=["detailed_special"], eval_dim=[list(DIMS)], sample_type=["uniform"])
# the processor gets frames that are resized already (uint8 values, rescaled by 1/255 as the release feeds them)
PROCESS = dict(padding=True, return_tensors="pt", do_resize=False, do_rescale=True, cap_pixels_per_frame=False)

CHECKPOINT = Needed(
    "VideoReward folder",
    "videoalign.checkpoint",
    ("TREEGRPO_VIDEOALIGN_CHECKPOINT",),
    hub=(("KwaiVGI/VideoReward", ""),),
    needs=("model_config.json",),
)
BASE = Needed(
    "Qwen2-VL-2B-Instruct folder",
    "videoalign.base",
    ("TREEGRPO_QWEN2VL",),
    hub=(("Qwen/Qwen2-VL-2B-Instruct", ""),),
    needs=("config.json",),
)


@dataclass(frozen=True)
class Release:
    """What model_config.json fixes: sampling, frame size, head width and the normalisation (or None)."""

    fps: float
    num_frames: int | None
    max_pixels: int
    output_dim: int
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None


def read_release(folder: Path) -> Release:
    path = folder / "model_config.json"
    try:
        cfg = loads_json(path.read_text())
        data, model, norm = cfg["data_config"], cfg["model_config"], cfg.get("inference_config")
        got = {**data, **model, "sample_type": data.get("sample_type", "uniform")}
        bad = [f"{k}={got.get(k)!r}" for k, ok in SETTING.items() if got.get(k) not in ok]
        n, mean, std = data.get("num_frames"), [f"{d}_mean" for d in DIMS], [f"{d}_std" for d in DIMS]
        rel = Release(
            float(data.get("fps") or 2.0),
            None if n is None else int(n),
            int(data["max_frame_pixels"]),
            int(model["output_dim"]),
            tuple(float(norm[k]) for k in mean) if norm else None,
            tuple(float(norm[k]) for k in std) if norm else None,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TreegrpoError(f"{path}: not a VideoReward model_config.json ({type(e).__name__}: {e})") from None
    if bad:
        supported = "special reward tokens, the detailed_special prompt, VQ MQ TA, output_dim 1 or 3"
        raise TreegrpoError(f"{path}: only the release's setting is supported ({supported}); found {', '.join(bad)}")
    return rel


def checkpoint_dir(folder: Path, step: int | None) -> Path:
    """checkpoint-<step> (default: the largest step) holding the three files of a LoRA checkpoint."""
    steps = sorted(int(p.name[11:]) for p in folder.glob("checkpoint-*") if p.name[11:].isdigit() and p.is_dir())
    if not steps:
        raise TreegrpoError(f"{folder}: no checkpoint-N folder beside model_config.json")
    if step is not None and step not in steps:
        raise ConfigError(f"videoalign.step: no checkpoint-{step} in {folder} (steps: {', '.join(map(str, steps))})")
    path = folder / f"checkpoint-{steps[-1] if step is None else step}"
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise TreegrpoError(f"{path}: missing {', '.join(missing)} (a full model.pth checkpoint is not supported)")
    return path


def canonical(key: str) -> str:
    """A release key (peft's base_model.model. + transformers-4.45 names) or a transformers-5 one -> its name
    inside Qwen2VLModel ('visual.*', 'language_model.*'); 'rm_head.weight' and 'lm_head.weight' stay."""
    k = key.removeprefix("base_model.model.")
    if k.startswith("model."):
        k = k[len("model.") :]
        return k if k.startswith(("visual.", "language_model.")) else "language_model." + k
    return k


def lora_scale(path: Path) -> tuple[int, float]:
    """(r, scale) of adapter_config.json: scale = alpha / r, or alpha / sqrt(r) with rslora."""
    try:
        cfg = loads_json(path.read_text())
        r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TreegrpoError(f"{path}: not a LoRA adapter_config.json ({type(e).__name__}: {e})") from None
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern") or cfg.get("use_dora") or cfg.get("fan_in_fan_out"):
        raise TreegrpoError(f"{path}: per-module ranks or alphas, DoRA and fan_in_fan_out are not supported")
    return r, alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)


@torch.no_grad()
def merge_lora(net: nn.Module, sd: dict[str, Tensor], r: int, scale: float, path: Path) -> dict[str, Tensor]:
    """W += scale * B @ A for every LoRA pair of `sd`, in place; returns the tensors that are not LoRA."""
    pairs: dict[str, dict[str, Tensor]] = {}
    rest = {}
    for key, value in sd.items():
        m = LORA.match(key)
        if m:
            pairs.setdefault(canonical(m[1]), {})[m[2]] = value
        else:
            rest[key] = value
    modules = dict(net.named_modules())
    for name, ab in pairs.items():
        layer = modules.get(name)
        a, b = ab.get("A"), ab.get("B")  # [r, in], [out, r]
        if not isinstance(layer, nn.Linear) or a is None or b is None:
            raise TreegrpoError(f"{path}: LoRA tensors of {name} fit no linear layer (or lack lora_A / lora_B)")
        if a.shape != (r, layer.in_features) or b.shape != (layer.out_features, r):
            raise TreegrpoError(f"{path}: LoRA of {name} is {tuple(b.shape)} @ {tuple(a.shape)}, not for {layer}")
        w = layer.weight  # [out, in]
        w.copy_((w.float() + scale * (b.float() @ a.float())).to(w.dtype))
    return rest


@torch.no_grad()
def load_tensors(net: Any, head: nn.Linear, files: list[tuple[Path, dict[str, Tensor]]]) -> None:
    """rm_head, the (resized) embeddings and the fine-tuned tensors into their places in Qwen2VLModel `net`;
    a tensor in both files takes the later file's value, as the release's loader does."""
    named = [(p, canonical(k), v) for p, sd in files for k, v in sd.items() if canonical(k) != "lm_head.weight"]
    rows = [v.shape[0] for _, k, v in named if k == EMBED]
    if rows and rows[-1] != net.get_input_embeddings().num_embeddings:
        net.resize_token_embeddings(rows[-1], mean_resizing=False)  # the release added three tokens
    own = net.state_dict() | {"rm_head.weight": head.weight}
    for path, key, value in named:
        if key not in own or own[key].shape != value.shape:
            why = "fits nowhere" if key not in own else f"is {tuple(value.shape)}, not {tuple(own[key].shape)}"
            raise TreegrpoError(f"{path}: tensor {key} {why}")
        own[key].copy_(value)
    if not any(k == "rm_head.weight" for _, k, _ in named):
        raise TreegrpoError(f"{files[0][0]}: no rm_head.weight (the reward head)")


def frame_indices(total: int, video_fps: float, fps: float | None, num_frames: int | None) -> list[int]:
    """The frames the release's reader keeps of `total` (an even count, at least 2), evenly spaced."""
    if num_frames is not None:
        n = round(num_frames / 2) * 2
    else:
        low, high = math.ceil(MIN_FRAMES / 2) * 2, math.floor(min(MAX_FRAMES, total) / 2) * 2
        n = round(min(max(total / video_fps * (fps or 2.0), low), high) / 2) * 2
    n = min(n, total // 2 * 2)
    if n < 2:
        raise TreegrpoError(f"videoalign needs clips of at least 2 frames, got {total}")
    return torch.linspace(0, total - 1, n).round().long().tolist()


def frame_size(h: int, w: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's rule: sides multiples of 28 near h x w's aspect, min_pixels <= pixels <= max_pixels."""
    if max(h, w) / min(h, w) > 200:
        raise TreegrpoError(f"videoalign: frames {h}x{w} are more than 200 times wider than high or back")
    side = max(FACTOR, round(h / FACTOR) * FACTOR), max(FACTOR, round(w / FACTOR) * FACTOR)
    if side[0] * side[1] > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        return max(FACTOR, math.floor(h / beta / FACTOR) * FACTOR), max(FACTOR, math.floor(w / beta / FACTOR) * FACTOR)
    if side[0] * side[1] < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        return math.ceil(h * beta / FACTOR) * FACTOR, math.ceil(w * beta / FACTOR) * FACTOR
    return side


def resize_uint8(x: Tensor, size: tuple[int, int]) -> Tensor:
    """x [n, 3, h, w] float holding uint8 values -> [n, 3, *size], as torchvision resizes a uint8 video:
    bicubic, antialiased, clamped and rounded."""
    if tuple(x.shape[-2:]) == size:
        return x
    return F.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True).clamp(0, 255).round()


def positive(value: Any, option: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{option} must be a number, got {value!r}") from None
    if not v > 0 or math.isinf(v):
        raise ConfigError(f"{option} must be > 0, got {value!r}")
    return v


class VideoAlign(ModelReward):
    """VideoReward on clips: VQ + MQ + TA (or one of them), normalised as released."""

    name = "videoalign"
    video = True  # takes the clips whole (score_leaves does not split them into frames)

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        checkpoint: str | None = None,
        base: str | None = None,
        step: int | str | None = None,
        head: str = "overall",
        norm: bool | str = True,
        fps: float | str | None = None,
        num_frames: int | str | None = None,
        max_pixels: int | str | None = None,
        video_fps: float | str = 16,
        batch_size: int | str = 2,
    ):
        super().__init__(device, dtype, as_int(batch_size, "videoalign.batch_size"))
        self.head_name = as_choice(head, "videoalign.head", HEADS)
        self.norm = as_bool(norm, "videoalign.norm")
        if fps is not None and num_frames is not None:
            raise ConfigError("videoalign: pass fps or num_frames, not both")
        folder, base_dir = resolve("videoalign", [(CHECKPOINT, checkpoint), (BASE, base)])
        self.release = rel = read_release(folder)
        use_fps = fps is not None or num_frames is None and rel.num_frames is None
        self.fps = positive(rel.fps if fps is None else fps, "videoalign.fps") if use_fps else None
        n = rel.num_frames if num_frames is None else num_frames
        self.num_frames = None if use_fps else as_int(n, "videoalign.num_frames")
        self.max_pixels = as_int(rel.max_pixels if max_pixels is None else max_pixels, "videoalign.max_pixels")
        self.video_fps = positive(video_fps, "videoalign.video_fps")
        ck = checkpoint_dir(folder, None if step is None else as_int(step, "videoalign.step", 0))
        self._load(base_dir, ck)
        self.source = f"{ck} + {base_dir}"

    def _load(self, base: Path, ck: Path) -> None:
        ensure_torchvision()
        from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

        try:
            with quiet():
                self.processor = AutoProcessor.from_pretrained(base, local_files_only=True)
                net = Qwen2VLForConditionalGeneration.from_pretrained(base, local_files_only=True, dtype=self.dtype)
        except (OSError, ValueError) as e:
            raise TreegrpoError(f"videoalign: cannot load {base} ({' '.join(str(e).split())[:160]})") from None
        tok = self.processor.tokenizer
        tok.padding_side = "right"  # as trained; the reward tokens never see the padding
        tok.add_tokens(list(TOKENS), special_tokens=True)
        self.net = net.model.eval()  # Qwen2VLModel: the vision tower and the language model, no lm_head
        self.head = nn.Linear(self.net.config.text_config.hidden_size, self.release.output_dim, bias=False)
        rest = merge_lora(self.net, load_state_dict(ck / FILES[0]), *lora_scale(ck / FILES[1]), ck / FILES[0])
        load_tensors(self.net, self.head, [(ck / FILES[2], load_state_dict(ck / FILES[2])), (ck / FILES[0], rest)])
        ids, rows = tok.convert_tokens_to_ids(list(TOKENS)), self.net.get_input_embeddings().num_embeddings
        if max(ids) >= rows:
            raise TreegrpoError(f"{ck}: the reward tokens {ids} lie past the checkpoint's {rows} embeddings")
        self.token_ids = torch.tensor(ids, device=self.device)
        self.net.to(self.device)
        self.head = self.head.float().to(self.device)
        ip = self.processor.image_processor
        self.proc_pixels = (int(ip.size["shortest_edge"]), int(ip.size["longest_edge"]))

    def frames(self, clip: Tensor) -> Tensor:
        """clip [3, F, H, W] in [0, 1] -> the kept frames [n, 3, h, w] as float uint8 values (CPU)."""
        x = (clip.float() * 255).round().clamp(0, 255)  # as decoded from a video file
        keep = frame_indices(x.shape[1], self.video_fps, self.fps, self.num_frames)
        x = x[:, keep].transpose(0, 1)  # [n, 3, H, W]
        x = resize_uint8(x, frame_size(x.shape[-2], x.shape[-1], MIN_PIXELS, self.max_pixels))
        x = resize_uint8(x, frame_size(x.shape[-2], x.shape[-1], *self.proc_pixels))  # the processor's own rule
        return x.cpu()

    def chat(self, prompt: str) -> str:
        if any(t in prompt for t in TOKENS):
            raise TreegrpoError(f"videoalign: a prompt holds a reward token ({', '.join(TOKENS)})")
        text = DETAILED_SPECIAL.replace("{text_prompt}", prompt)
        msg = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]
        return self.processor.apply_chat_template(msg, tokenize=False, add_generation_prompt=True)

    def rewards(self, clips: Tensor, prompts: list[str]) -> Tensor:
        """clips [b, 3, F, H, W] in [0, 1] -> the head's raw VQ, MQ, TA [b, 3] float32."""
        batch = self.processor(text=[self.chat(p) for p in prompts], videos=[self.frames(c) for c in clips], **PROCESS)
        x = {k: batch[k].to(self.device) for k in ("input_ids", "attention_mask", "video_grid_thw")}
        ids = x["input_ids"]  # [b, L], padded on the right
        b, length = ids.shape
        pos = torch.arange(length, device=self.device).view(1, 1, length).expand(3, b, length)  # [3, b, L]
        pixels = batch["pixel_values_videos"].to(self.device, self.dtype)  # [patches, 3 * 2 * 14 * 14]
        hidden = self.net(**x, pixel_values_videos=pixels, position_ids=pos, use_cache=False).last_hidden_state
        at = (ids[:, :, None] == self.token_ids).float().argmax(1)  # [b, 3]: where VQ, MQ, TA sit
        out = self.head(hidden[torch.arange(b, device=self.device)[:, None], at].float())  # [b, 3, output_dim]
        return out[..., 0] if out.shape[-1] == 1 else out.diagonal(dim1=1, dim2=2)  # [b, 3]

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        r = self.rewards(images, prompts)  # [b, 3]
        rel = self.release
        if self.norm and rel.mean is not None and rel.std is not None:
            r = (r - torch.tensor(rel.mean, device=r.device)) / torch.tensor(rel.std, device=r.device)
        return r.sum(1) if self.head_name == "overall" else r[:, HEADS.index(self.head_name) - 1]  # [b]


register(
    "videoalign",
    VideoAlign,
    options=OPTIONS,
    on_device=True,
    summary="VideoAlign's VideoReward on clips (Qwen2-VL-2B + LoRA): VQ + MQ + TA normalised, or head=vq|mq|ta",
    needs=lambda checkpoint=None, base=None, **_: [(CHECKPOINT, checkpoint), (BASE, base)],
)
