"""Helpers the tests share: invoke `treegrpo` in-process or as processes, check one-line errors and refusals
that leave their inputs as they were, snapshot a folder, write small image folders (and a decompression bomb's
header), compare metrics rows, load a bench/ script as a module."""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from typer.testing import CliRunner

from treegrpo_cli.cli.app import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


# the lines `train` prints before it loads the model (cli/train_report.py run_header): an error found while loading
# (a LoRA target the model lacks) comes after them
RUN_HEADER = re.compile(
    r"^((starting|resuming) \S+: model .*|device: \S+( \(no GPU seen by torch\))?|run folder: .*|"
    r"loading .+ \.\.\.|.+ ready on \S+ in [\d.]+s|reading \S*step-\d+|writing the .* weights of step \d+ to .* \.\.\.|"
    r"warning: \S+ has [\d.]+ billion denoiser parameters and is about to be built on the CPU.*|"
    r"warning: \S+ from .* is overridden every iteration by schedule\.kind .*|"  # the user's tree under a schedule
    r"rollout\.num_prompts \d+ -> \d+: \d+ for each of \d+ processes|"  # a new run's prompts on N processes
    r"held-out (reward|evaluation) at iteration \d+: .*|iteration \d+: reward .*)$"  # progress before an error
)


def one_line_error(result, *needles):
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.strip().splitlines() if not RUN_HEADER.match(line)]
    assert len(lines) == 1, result.stderr
    for n in needles:
        assert n in lines[0], lines[0]


PIXEL = ["--set", 'model="pixel-tiny"']  # the smallest built-in model: 8x8 pixels, one block
# `treegrpo diversity` at its cheapest: pixel features, two KID subsets, no permutation test
DIV = ["--features", "pixels", "--kid-subsets", 2, "--permutations", 0, "--by-image"]


def treegrpo(*args, nproc: int = 1, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """`treegrpo train ARGS` as its own process (`nproc` > 1: under --nproc-per-node), one thread each."""
    cmd = [sys.executable, "-m", "treegrpo_cli", "train", *map(str, args)]
    cmd += ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    )


MONITOR_TOL = 1e-3  # the guard's image statistics read uint8 pictures: a last-bit difference in a float picture
# flips a pixel's rounding, and a JPEG's size moves by bytes


def close(rows_a, rows_b, tol=1e-5):
    """Two runs' metrics rows agree: every key, floats to a relative tol (the guard's monitors to MONITOR_TOL),
    timings left out."""
    from treegrpo_cli.training.runlog import is_timing

    assert len(rows_a) == len(rows_b)
    for a, b in zip(rows_a, rows_b, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if is_timing(k):
                continue
            if isinstance(a[k], float):
                t = max(tol, MONITOR_TOL) if k.startswith("monitor/") else tol
                assert abs(a[k] - b[k]) <= t * max(1.0, abs(b[k])), (a["iteration"], k, a[k], b[k])
            else:
                assert a[k] == b[k], (a["iteration"], k)


def entry(path: Path):
    """One path as it is: a link (its target, never followed), a folder, a file's sha1, or another kind (a FIFO or
    socket: recorded, never read)."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return "dir"
    if path.is_file():
        return hashlib.sha1(path.read_bytes()).hexdigest()
    return ("special", stat.S_IFMT(path.lstat().st_mode)) if os.path.lexists(path) else None


def snapshot(root: Path) -> dict:
    """{relative path: entry} of everything under root (links recorded, not followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = entry(p)
    return out


def state(path: Path):
    """What a refused command must leave as it was: the snapshot of a folder, or one path's entry."""
    return snapshot(path) if path.is_dir() and not path.is_symlink() else entry(path)


def refused(args: list, needles: list[str], *watch: Path):
    """Run `treegrpo args`: one line with every needle, no traceback, and every watched path unchanged."""
    before = [state(p) for p in watch]
    r = run(*args)
    one_line_error(r, *needles)
    assert "Traceback" not in r.output and "this is a bug" not in r.stderr  # bad input, not an internal error
    assert [state(p) for p in watch] == before, "a refused command changed its inputs or something outside"
    return r


def copy_trees(world: Path, tmp_path: Path, name: str = "trees") -> Path:
    folder = tmp_path / name
    shutil.copytree(world / name, folder)
    return folder


def edit_json(path: Path, fn: Callable[[dict], object]) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def bomb_png(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A PNG whose header claims width x height pixels (its data is one row: a decompression bomb's header)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * (1 + 3 * width))) + chunk(b"IEND", b"")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


def write_pngs(folder: Path, n: int, seed: int = 0, size: int = 8) -> Path:
    """n small flat-coloured PNGs and a prompts.json naming them."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    names = {}
    for i in range(n):
        Image.new("RGB", (size, size), (40 * i + seed, 255 - 30 * i, 7 * seed)).save(folder / f"{i:03d}.png")
        names[f"{i:03d}.png"] = f"a red circle {i}"
    (folder / "prompts.json").write_text(json.dumps(names))
    return folder


def noise_pngs(folder: Path, n: int, seed: int, size=(8, 8), lo: int = 0, hi: int = 256) -> Path:
    """n PNGs of uniform noise in [lo, hi), size (width, height)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(lo, hi, (*size[::-1], 3), dtype=np.uint8)).save(folder / f"img{i:03d}.png")
    return folder


def undeclared(row, row_type):
    """The keys of a run-log row that its TypedDict (runlog.MetricsRow, runlog.EvalRow) does not declare, per-name
    numbers (runlog.NUMBER_PREFIXES) aside: what the report and tracking code would read untyped."""
    from treegrpo_cli.training.runlog import NUMBER_PREFIXES

    declared = row_type.__required_keys__ | row_type.__optional_keys__
    return [k for k in row if k not in declared and not k.startswith(NUMBER_PREFIXES)]


def bench_module(name: str) -> ModuleType:
    """bench/NAME.py as a module (bench/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"no bench/{name}.py"
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
