"""What overlapping the scoring with the rollout hides, with a reward served over HTTP.

    python bench/remote_overlap.py                    # tree-grpo on the world, 6 iterations per setting
    python bench/remote_overlap.py --ms-per-image 20  # a slower reward model, emulated (see below)

A `treegrpo serve-reward` server process on 127.0.0.1 serves `shapes`; the run trains with
`--reward http://127.0.0.1:PORT` twice: `rollout.score_overlap=1` (rollout, then scoring) and `=4` (chunk k is
scored while chunk k+1 is rolled out). The world's reward takes well under a millisecond an image, far
less than a real preference model, so a second pair of runs adds a fixed delay per image on the server
(`--ms-per-image`, default 10: about what a ViT-H/14 reward takes per image on one GPU at batch 32), a
stand-in for a model in another process or on another machine. Reported per iteration (means over the
iterations after the first): rollout, exposed scoring (what the iteration waits for), scoring the rollout
hid, and the total; bench/results/remote_overlap.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods import commit, machine  # noqa: E402  (bench/ is not a package)

SERVER = """
import sys, time
from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.rewards.remote import make_server
delay = float(sys.argv[1]) / 1000
shapes = get_reward("shapes")
def slow(images, prompts):
    time.sleep(delay * len(prompts))  # the emulated model's time
    return shapes(images, prompts)
server = make_server({"shapes": slow if delay else shapes})
print(f"http://127.0.0.1:{server.server_address[1]}", file=sys.stderr, flush=True)
server.serve_forever()
"""


def serve(ms_per_image: float) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(ms_per_image)],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert p.stderr is not None  # stderr=PIPE
    m = re.search(r"http://127\.0\.0\.1:\d+", p.stderr.readline())
    if not m:
        p.kill()
        raise RuntimeError("the reward server did not start")
    return p, m.group(0)


def train(url: str, chunks: int, iterations: int, preset: str, work: Path) -> dict:
    run = work / f"{preset}-overlap{chunks}-{time.time_ns()}"
    sets = [f"rollout.score_overlap={chunks}", "train.eval_samples=0", "train.sample_every=0", "train.save_every=1000"]
    cmd = [sys.executable, "-m", "treegrpo_cli", "train", "--preset", preset, "--reward", url]
    cmd += ["--iterations", str(iterations), "--run-dir", str(run), "--json"]
    cmd += [a for s in sets for a in ("--set", s)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1:])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]  # warm-up out
    mean = lambda k: sum(r["seconds"].get(k, 0.0) for r in rows) / len(rows)  # noqa: E731
    return {
        "chunks": chunks,
        "iterations_measured": len(rows),
        "leaves_per_iteration": sum(r["leaves"] for r in rows) / len(rows),
        **{f"{k}_s": mean(k) for k in ("rollout", "score", "score_hidden", "update", "total")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tree-grpo")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--ms-per-image", type=float, default=10.0)
    args = ap.parse_args()
    result: dict[str, Any] = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": commit(), "machine": machine()}
    result["command"] = " ".join(["python bench/remote_overlap.py", *sys.argv[1:]])
    result["loadavg_1m_before"] = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for delay in (0.0, args.ms_per_image):
            server, url = serve(delay)
            try:
                pair = [train(url, c, args.iterations, args.preset, Path(tmp)) for c in (1, 4)]
            finally:
                server.terminate()
                server.wait(timeout=30)
            key = "shapes" if not delay else f"shapes+{delay:g}ms-per-image"
            a, b = pair
            result[key] = {
                "plain": a,
                "overlapped": b,
                "score_wait_cut_s": a["score_s"] - b["score_s"],
                "total_cut_s": a["total_s"] - b["total_s"],
                "hidden_share": b["score_hidden_s"] / max(b["score_hidden_s"] + b["score_s"], 1e-9),
            }
            print(key, json.dumps(result[key]), flush=True)
    result["loadavg_1m_after"] = os.getloadavg()[0]
    Path("bench/results/remote_overlap.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
