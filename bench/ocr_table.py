"""The `ocr` reward on rendered text: for a few words at a few sizes, the score of the right text, of the text in
the other case, of the text with one letter wrong, of a wrong word and of a blank image, with what RapidOCR read.

    python bench/ocr_table.py [--side 512] [--threads 1]

Black text in Pillow's built-in font on a white --side x --side image (Flow-GRPO's 512 px by default), the target
given by a prompt `a sign that says "TARGET"`. Writes bench/results/ocr_reward.json (every image's target, rendered
text, recognised text and score, and the median seconds an image) and bench/results/ocr_reward.md (the table that
docs/rewards.md shows).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from treegrpo_cli.rewards.ocr import OCRReward

OUT = Path(__file__).parent / "results"
# (target, a wrong word, font size in px)
CASES = [
    ("OPEN", "SHUT", 64),
    ("Hello World", "Goodbye Moon", 48),
    ("TreeGRPO", "FlowGRPO", 32),
    ("coffee shop", "tea house", 24),
    ("SALE 50% OFF", "NEW ARRIVALS", 16),
    ("fine print", "small type", 10),
]


def one_letter_wrong(text: str) -> str:
    """The text with its middle letter replaced by the next one of the alphabet (z -> a), case kept."""
    letters = [i for i, c in enumerate(text) if c.isalpha()]
    i = letters[len(letters) // 2]
    c = text[i]
    base = "a" if c.islower() else "A"
    return text[:i] + chr(ord(base) + (ord(c) - ord(base) + 1) % 26) + text[i + 1 :]


def render(text: str, size: int, side: int) -> np.ndarray:
    """[side, side, 3] uint8: black text at `size` px, left-aligned at mid-height, on white."""
    im = Image.new("RGB", (side, side), "white")
    if text:
        font = ImageFont.load_default(size=size)
        ImageDraw.Draw(im).text((side // 16, (side - size) // 2), text, fill="black", font=font)
    return np.array(im)


def rows(side: int, threads: int) -> tuple[list[dict], float]:
    ocr = OCRReward(threads=threads)
    out: list[dict[str, Any]] = []
    seconds = []
    for target, wrong, size in CASES:
        prompt = f'a sign that says "{target}"'
        kinds = {
            "right": target,
            "case swapped": target.swapcase(),
            "one letter wrong": one_letter_wrong(target),
            "wrong word": wrong,
            "blank": "",
        }
        out += [{"target": target, "kind": k, "rendered": text, "size_px": size} for k, text in kinds.items()]
        for row in out[-len(kinds) :]:
            x = torch.from_numpy(render(row["rendered"], size, side)).permute(2, 0, 1)[None].float() / 255.0
            t0 = time.perf_counter()
            row["recognised"] = ocr.recognise(x)[0]
            seconds.append(time.perf_counter() - t0)
            row["score"] = round(float(ocr(x, [prompt])[0]), 4)
    return out, statistics.median(seconds)


def table(result: list[dict]) -> str:
    lines = ["| target | image | font px | recognised | score |", "|---|---|---|---|---|"]
    for r in result:
        shown = f"`{r['rendered']}` ({r['kind']})" if r["rendered"] else "blank"
        read = f"`{r['recognised'].strip()}`" if r["recognised"].strip() else "(nothing)"
        lines.append(f"| `{r['target']}` | {shown} | {r['size_px']} | {read} | {r['score']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=512, help="image side in px")
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime threads (ocr.threads)")
    ap.add_argument("--out", type=Path, default=OUT, help="folder of ocr_reward.json and ocr_reward.md")
    args = ap.parse_args()
    result, seconds = rows(args.side, args.threads)
    md = table(result)
    print(md, end="")
    print(f"median {seconds * 1e3:.0f} ms an image ({args.side} px, {args.threads} thread(s))")
    meta = {
        "command": "python bench/ocr_table.py" + (f" --side {args.side}" if args.side != 512 else ""),
        "side": args.side,
        "threads": args.threads,
        "median_seconds_per_image": round(seconds, 4),
        "engine": f"rapidocr-onnxruntime {version('rapidocr-onnxruntime')}",
        "machine": platform.processor() or platform.machine(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ocr_reward.json").write_text(json.dumps({**meta, "rows": result}, indent=2) + "\n")
    (args.out / "ocr_reward.md").write_text(md)


if __name__ == "__main__":
    main()
