"""The crash campaign: every writer killed at random moments, then its reader and its rerun checked.

    python bench/faults.py [--train 24] [--others 6] [--seed 0] [--work runs/faults]

For each writer, an uninterrupted run first (the reference), then trials, each killed with SIGKILL either at a
named point of the writer (TREEGRPO_FAULT, treegrpo_cli/store/faults.py, at a random hit) or from outside at a
random moment of the reference's duration:
    train     resumed (`train --resume`, or the same command when no run folder was written yet) until it exits 0;
              held when its metrics rows (timings aside) and last checkpoint's tensors equal the reference's bit for
              bit, its checkpoints are the reference's step-N names, and no dot-named leftover is there
    rollout   `inspect` exits 0 on a folder equal to the reference's (the kill came after the last write), or
              refuses in one line that names the rollout command (or, killed before its first write, finds
              nothing or a whole earlier folder), and the same command rerun gives the reference's folder byte
              for byte
    score     the same with `score` on a copy of the reference rollout ("score it again")
    eval      `eval --images --out` rerun gives the reference's results.csv and samples.png
    export    `export` rerun gives the reference's folder byte for byte; no OUT until it is whole
Writes bench/results/faults.json (every trial: writer, how it was killed, what the reader said, held or not) and
bench/results/faults.md (held of trials, per writer).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import read_metrics, without_timings

OUT = Path(__file__).parent / "results"
PIXEL = ["--set", 'model="pixel-tiny"']
TRAIN = [
    "train",
    *PIXEL,
    "--set",
    "rollout.num_prompts=2",
    "--set",
    "train.eval_samples=1",
    "--set",
    "train.save_every=1",
]
TRAIN += ["--set", "train.sample_every=2", "--iterations", "5", "--run-dir", "run"]
ROLLOUT = ["rollout", *PIXEL, "-n", "5", "--preset", "branch", "--prompts-per-shard", "1", "--save-images"]
ROLLOUT += ["--out", "trees"]
SCORE = ["score", "trees", "--reward", "jpeg-compressibility"]
FLUX = ["--model", "flux-dev", "--set", 'policy.weights="random"', "--set", 'policy.size="tiny"']
# the named points of each writer and how often an uninterrupted run reaches each
POINTS = {
    "train": {"checkpoint.shard": 10, "checkpoint.written": 5, "checkpoint.renamed": 5, "checkpoint.retire": 3},
    "rollout": {"rollout.shard": 5},
    "score": {"score.cleared": 1, "score.shard": 5},
    "eval": {"eval.file": 2},
    "export": {"export.file": 1},
}


def treegrpo(args: list[str], cwd: Path, fault: str | None = None, kill_after: float | None = None) -> int:
    """Run `treegrpo ARGS` in cwd; killed at the named point, or from outside after kill_after seconds."""
    env = {k: v for k, v in os.environ.items() if k != "TREEGRPO_FAULT"} | {"OMP_NUM_THREADS": "1"}
    env |= {"TREEGRPO_FAULT": fault} if fault else {}
    p = subprocess.Popen(
        [sys.executable, "-m", "treegrpo_cli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        _, err = p.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        _, err = p.communicate()
    treegrpo.last_stderr = err.decode(errors="replace")  # type: ignore[attr-defined]
    return p.returncode


def timed(args: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    rc = treegrpo(args, cwd)
    if rc != 0:
        raise SystemExit(f"reference run failed: treegrpo {' '.join(args)}\n{treegrpo.last_stderr}")  # type: ignore[attr-defined]
    return time.perf_counter() - t


def files(root: Path, skip: tuple[str, ...] = (".lock",)) -> dict[str, str]:
    """{relative path: sha256} of every file under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in skip:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def kill_plan(rng: random.Random, writer: str, duration: float, k: int) -> list[dict[str, Any]]:
    """k kills, alternating a named point at a random hit and a random moment of the reference's duration."""
    plan: list[dict[str, Any]] = []
    for i in range(k):
        if i % 2 == 0:
            point = rng.choice(sorted(POINTS[writer]))
            plan.append({"fault": f"{point}@{rng.randint(1, POINTS[writer][point])}", "kill_after": None})
        else:
            plan.append({"fault": None, "kill_after": round(rng.uniform(0.2, duration), 2)})
    return plan


def one_line_refusal(stderr: str, needle: str) -> bool:
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("Error")]
    return len(lines) == 1 and needle in lines[0] and "Traceback" not in stderr and "this is a bug" not in stderr


# --- train ---------------------------------------------------------------------------------------


def same_tensors(a: Path, b: Path) -> bool:
    ca, cb = (load_checkpoint(list_checkpoints(r / "checkpoints")[-1]) for r in (a, b))
    opt_a, opt_b = ca.optimizer["state"], cb.optimizer["state"]
    model = ca.model.keys() == cb.model.keys() and all(torch.equal(ca.model[k], cb.model[k]) for k in ca.model)
    optim = opt_a.keys() == opt_b.keys() and all(
        torch.equal(opt_a[p][s], opt_b[p][s]) for p in opt_a for s in opt_a[p] if torch.is_tensor(opt_a[p][s])
    )
    return ca.step == cb.step and model and optim


def train_trial(work: Path, ref: Path, kill: dict[str, Any]) -> dict[str, Any]:
    rc = treegrpo(TRAIN, work, **kill)
    run, resumes = work / "run", 0
    while rc != 0 and resumes < 3:
        resumes += 1
        rc = treegrpo(["train", "--resume", "run"] if (run / "run.json").is_file() else TRAIN, work)
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").is_dir() else []
    leftovers = [n for n in ckpts if n.startswith(".")] + [str(p) for p in run.rglob("*.tmp")]
    rows = rc == 0 and without_timings(read_metrics(run)) == without_timings(read_metrics(ref))
    steps = ckpts == sorted(p.name for p in (ref / "checkpoints").iterdir())
    held = bool(rows and steps and not leftovers and same_tensors(run, ref))
    return {"resumes": resumes, "rows": bool(rows), "steps": steps, "leftovers": leftovers, "held": held}


# --- rollout, score, eval, export ------------------------------------------------------------------


def rerun_trial(work: Path, args: list[str], out: str, ref: dict[str, str], kill: dict[str, Any], reader) -> dict:
    rc = treegrpo(args, work, **kill)
    said = reader(work) if rc != 0 else "finished before the kill"
    if said in ("whole", "finished before the kill") and files(work / out) == ref:  # killed after its last write
        return {"killed_rc": rc, "reader": said, "rerun_rc": None, "same": True, "held": True}
    rerun = treegrpo(args, work)
    same = rerun == 0 and files(work / out) == ref
    return {"killed_rc": rc, "reader": said, "rerun_rc": rerun, "same": same, "held": same and said is not None}


def tree_reader(needle: str):
    def read(work: Path) -> str | None:
        """What `inspect` says of the killed folder: whole (exit 0) or a one-line refusal with `needle`."""
        if not (work / "trees" / "index.json").is_file():
            return "no index.json yet"
        rc = treegrpo(["inspect", "trees"], work)
        if rc == 0:
            return "whole"  # then compared with the reference
        return "refused" if one_line_refusal(treegrpo.last_stderr, needle) else None  # type: ignore[attr-defined]

    return read


def no_out_or_whole(out: str, ref: dict[str, str], record: str):
    def read(work: Path) -> str | None:
        folder = work / out
        if not (folder / record).is_file():
            return f"no {record}: not taken as whole"
        return "whole" if files(folder) == ref else None

    return read


def writer_trials(name: str, work: Path, rng: random.Random, k: int, setup, args, out, reader_of) -> list[dict]:
    base = work / f"{name}-ref"
    setup(base)
    duration = timed(args, base)
    ref = files(base / out)
    trials = []
    for i, kill in enumerate(kill_plan(rng, name, duration, k)):
        here = work / f"{name}-{i}"
        setup(here)
        trials.append({"writer": name, **kill, **rerun_trial(here, args, out, ref, kill, reader_of(ref))})
    return trials


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=24, help="kills of `train`")
    ap.add_argument("--others", type=int, default=6, help="kills of each other writer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("runs/faults"))
    a = ap.parse_args()
    rng, work = random.Random(a.seed), a.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    trials = train_trials(work, rng, a.train)
    trials += writer_trials(
        "rollout", work, rng, a.others, _mkdir, ROLLOUT, "trees", lambda ref: tree_reader("roll it out again")
    )
    trials += writer_trials(
        "score", work, rng, a.others, _rolled(work), SCORE, "trees", lambda ref: tree_reader("score it again")
    )
    trials += writer_trials(
        "eval", work, rng, a.others, _images, EVAL, "e", lambda ref: no_out_or_whole("e", ref, "results.json")
    )
    trials += writer_trials("export", work, rng, a.others, _trained(work), ["export", "run", "--out", "x"], "x",
                            lambda ref: no_out_or_whole("x", ref, "treegrpo_export.json"))  # fmt: skip
    write(trials, a)


def train_trials(work: Path, rng: random.Random, k: int) -> list[dict]:
    (work / "train-ref").mkdir()
    duration = timed(TRAIN, work / "train-ref")
    ref = work / "train-ref" / "run"
    trials = []
    for i, kill in enumerate(kill_plan(rng, "train", duration, k)):
        here = work / f"train-{i}"
        here.mkdir()
        trials.append({"writer": "train", **kill, **train_trial(here, ref, kill)})
    return trials


EVAL = ["eval", "--images", "imgs", "--metric", "jpeg-compressibility", "--out", "e"]


def _mkdir(here: Path) -> None:
    here.mkdir()


def _rolled(work: Path):
    def setup(here: Path) -> None:
        src = work / "score-src"
        if not src.exists():
            src.mkdir()
            if treegrpo(ROLLOUT, src) != 0:
                raise SystemExit(f"rollout failed\n{treegrpo.last_stderr}")  # type: ignore[attr-defined]
        shutil.copytree(src, here)

    return setup


def _images(here: Path) -> None:
    from PIL import Image

    (here / "imgs").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    names = {}
    for i in range(24):
        x = torch.randint(0, 256, (16, 16, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(x).save(here / "imgs" / f"{i:03d}.png")
        names[f"{i:03d}.png"] = f"image {i}"
    (here / "imgs" / "prompts.json").write_text(json.dumps(names))


def _trained(work: Path):
    def setup(here: Path) -> None:
        src = work / "export-src"
        if not src.exists():
            src.mkdir()
            (src / "p.txt").write_text("a red fox\na blue car\n")
            args = ["train", *FLUX, "--reward", "jpeg-compressibility", "--prompts", "p.txt", "--iterations", "1"]
            args += ["--set", "rollout.num_prompts=2", "--set", "sampler.steps=4", "--set", "train.eval_samples=0"]
            if treegrpo([*args, "--run-dir", "run"], src) != 0:
                raise SystemExit(f"training failed\n{treegrpo.last_stderr}")  # type: ignore[attr-defined]
        shutil.copytree(src, here)

    return setup


def write(trials: list[dict[str, Any]], a: argparse.Namespace) -> None:
    writers = list(dict.fromkeys(t["writer"] for t in trials))
    summary = {}
    for w in writers:
        mine = [t for t in trials if t["writer"] == w]
        summary[w] = {"trials": len(mine), "held": sum(t["held"] for t in mine)}
    command = " ".join(["python", "bench/faults.py", *sys.argv[1:]])
    body = {"command": command, "seed": a.seed, "summary": summary, "trials": trials}
    OUT.mkdir(exist_ok=True)
    (OUT / "faults.json").write_text(json.dumps(body, indent=1) + "\n")
    lines = ["| writer | kills | held | at named points | at random moments |", "|---|---|---|---|---|"]
    for w in writers:
        mine = [t for t in trials if t["writer"] == w]
        named = [t for t in mine if t["fault"]]
        timed_ = [t for t in mine if not t["fault"]]
        lines.append(
            f"| {w} | {len(mine)} | {summary[w]['held']} | {sum(t['held'] for t in named)} of {len(named)} | "
            f"{sum(t['held'] for t in timed_)} of {len(timed_)} |"
        )
    (OUT / "faults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
