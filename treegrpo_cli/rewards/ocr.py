"""OCR reward (Flow-GRPO's text-rendering task): how closely the text read in an image matches the text it should show.

    score = 1                    when the target occurs in the recognised text
            1 - min(d, n) / n    otherwise; d = Levenshtein(recognised, target), n = len(target)

both strings normalised first: lower case, whitespace removed. So the score is in [0, 1]: 1 for the right text (even
with more text around it), about 1 - 1/n for one wrong letter, 0 for nothing read or nothing alike. This is
`flow_grpo/ocr.py` of Flow-GRPO (Liu et al. 2025), which removes only " " where we remove all whitespace.

The target is an explicit per-image target (`targets=`), else the prompt record's `text` field (its metadata:
`{"prompt": "a shop sign", "text": "OPEN"}` in a .jsonl), else the first text in double quotes of the prompt
(`a sign that says "OPEN"` -> OPEN; curly quotes too); a prompt with none of them is an error.

The engine is RapidOCR (`rapidocr-onnxruntime`, the `ocr` extra): PaddleOCR's PP-OCRv4 detector and recogniser as
ONNX files inside its wheel, run on the CPU by onnxruntime, offline. Settings follow Flow-GRPO's PaddleOCR call: no
angle classifier, the detector's input at most 960 px on its longer side, lines read with confidence >= 0.5 joined
in reading order. Flow-GRPO used PaddleOCR's English recogniser; RapidOCR ships the Chinese-and-English one.

    ocr.threads   onnxruntime threads per model (0, the default: onnxruntime's choice, all cores)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..engine.prompt import prompt_meta
from ..errors import ConfigError, TreegrpoError
from .base import register
from .jpeg import to_uint8
from .vision import as_int

QUOTED = re.compile(r'"([^"]*)"|\u201c([^\u201d]*)\u201d')  # "..." or “...”
INSTALL = "pip install 'treegrpo[ocr]'"
META_KEY = "text"  # the metadata field of a prompt record that holds its target text


def quoted_text(prompt: str) -> str | None:
    """The first text between double quotes in the prompt (straight or curly), None if there is none."""
    m = QUOTED.search(prompt)
    if m is None:
        return None
    return m.group(1) if m.group(1) is not None else m.group(2)


def normalise(text: str) -> str:
    """Lower case, every whitespace character removed (Flow-GRPO: `.replace(" ", "").lower()`)."""
    return "".join(text.split()).lower()


def levenshtein(a: str, b: str) -> int:
    """Edit distance: the fewest insertions, deletions and substitutions of one character that turn a into b."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def text_score(recognised: str, target: str) -> float:
    """1 - min(d, n) / n of the normalised strings (d their edit distance, n the target's length); 1 when the
    target occurs in the recognised text (an empty target always does)."""
    r, t = normalise(recognised), normalise(target)
    if t in r:
        return 1.0
    return 1.0 - min(levenshtein(r, t), len(t)) / len(t)


def targets_of(prompts: list[str], targets: Sequence[str | None] | None) -> list[str]:
    """Each image's target: its explicit one where given (not None), else its prompt's quoted text."""
    if targets is not None and len(targets) != len(prompts):
        raise ConfigError(f"ocr reward: {len(targets)} targets for {len(prompts)} images")
    out = []
    for i, prompt in enumerate(prompts):
        given = targets[i] if targets is not None else None
        meta = prompt_meta(prompt).get(META_KEY)  # the prompt record's own target text
        given = given if given is not None else (meta if isinstance(meta, str) else None)
        text = given if given is not None else quoted_text(prompt)
        if text is None:
            raise ConfigError(f"ocr reward: prompt {prompt!r} has no text in double quotes and no target was given")
        out.append(text)
    return out


def load_engine(threads: int) -> Any:
    """RapidOCR with Flow-GRPO's PaddleOCR settings; one clear line when the package is not installed."""
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError as e:
        why = " ".join(str(e).split())[:120]
        raise TreegrpoError(f"the ocr reward needs rapidocr-onnxruntime ({why}): {INSTALL}") from None
    n = threads if threads > 0 else -1
    return RapidOCR(
        use_cls=False,
        det_limit_type="max",
        det_limit_side_len=960,
        intra_op_num_threads=n,
        inter_op_num_threads=n,
    )


class OCRReward:
    """1 - normalised edit distance between an image's target text and the text RapidOCR reads in it."""

    name = "ocr"

    def __init__(self, threads: int | str = 0):
        self.engine = load_engine(as_int(threads, "ocr.threads", low=0))

    def read(self, image: np.ndarray) -> str:
        """The text of one [H, W, 3] uint8 RGB image: its lines in reading order, joined without separators."""
        result, _ = self.engine(np.ascontiguousarray(image[..., ::-1]))  # RapidOCR takes arrays as BGR (OpenCV's)
        return "".join(str(line[1]) for line in result or [])

    def recognise(self, images: Tensor) -> list[str]:
        """The text read in each image of [B, 3, H, W] float in [0, 1]."""
        return [self.read(arr) for arr in to_uint8(images)]

    def __call__(self, images: Tensor, prompts: list[str], targets: Sequence[str | None] | None = None) -> Tensor:
        """images [B, 3, H, W] float in [0, 1], prompts [B] -> scores [B] float32 in [0, 1]; `targets`: an optional
        text per image (None: that image's prompt's quoted text)."""
        want = targets_of(prompts, targets)
        read = self.recognise(images)
        return torch.tensor([text_score(r, t) for r, t in zip(read, want, strict=True)], dtype=torch.float32)


register(
    "ocr",
    OCRReward,
    options=("threads",),
    summary="text rendering (Flow-GRPO): 1 - normalised edit distance to the prompt's quoted text (RapidOCR)",
)
