"""`treegrpo train --nproc-per-node N`: start N copies of the command on this machine with the
environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Rank 0's stdout is the command's; its stderr is passed through line by line. When a process fails,
the others get a few seconds to end and are then killed, and one line names the failure: that of
the first failed process whose error is its own rather than a peer's closed connection. Multi-node runs use
torchrun itself:
`torchrun --nnodes 2 --nproc-per-node 8 ... -m treegrpo_cli train ...`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer

from ..errors import TreegrpoError
from .common import error_line, fail, internal_error, on_stop_signals

GRACE_S = 3.0
STOPPED = {130, 143, 3}  # a run stopped after a checkpoint: by Ctrl-C or SIGTERM (training/run.py STOP_CODES), or by
# the reward-hacking guard (config/guard.py GUARD_EXIT)
# Errors that only say a peer went away: the cause is another process's error.
PEER_FAILURE = re.compile(r"terminate called|connection|socket|broken pipe|gloo|nccl|timed? ?out|exit code -", re.I)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nproc: int, argv: list[str]) -> tuple[int, str | None]:
    """Run `treegrpo <argv>` in nproc processes; (exit code, the one error line or None)."""
    port, logs, procs = free_port(), [], []
    with tempfile.TemporaryDirectory(prefix="treegrpo-launch-") as tmp:
        for rank in range(nproc):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            log = Path(tmp) / f"rank{rank}.err"
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "treegrpo_cli", *argv],
                    env=env,
                    stdout=None if rank == 0 else subprocess.DEVNULL,
                    stderr=subprocess.PIPE if rank == 0 else open(log, "wb"),
                )
            )
        held: list[str] = []
        pump = threading.Thread(target=_forward, args=(procs[0], held), daemon=True)
        pump.start()
        with _passing_stops(procs) as asked:
            failed = _wait(procs)
        pump.join(timeout=GRACE_S)
        codes = {procs[r].returncode for r in failed}
        if not failed or (codes <= STOPPED and not any(ln.startswith("Error: ") for ln in held)):
            for line in held:  # a stopped run: rank 0 said so and how to resume
                sys.stderr.write(line)
            return (0, None) if not failed else (asked[0] if asked else procs[failed[0]].returncode, None)
        lasts = {
            r: _last_line("".join(held) if r == 0 else logs[r].read_text(errors="replace"), procs[r]) for r in failed
        }
        cause = next((r for r in failed if not PEER_FAILURE.search(lasts[r])), failed[0])
        return procs[cause].returncode or 1, lasts[cause] + ("" if cause == 0 else f" (process {cause} of {nproc})")


@contextmanager
def _passing_stops(procs: list[subprocess.Popen]) -> Iterator[list[int]]:
    """While the processes run, SIGTERM or Ctrl-C to this one asks each of them to stop after its iteration
    (SIGTERM to each: a second SIGTERM after a Ctrl-C that reached the whole process group changes nothing,
    where a second SIGINT would abort). Yields the exit code the stop asks for (130 or 143), once asked."""
    asked: list[int] = []

    def ask(signum, frame):
        asked[:] = asked or [128 + signum]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    with on_stop_signals(ask):
        yield asked


def _last_line(text: str, proc: subprocess.Popen) -> str:
    """The process's own error line; else its last line (a crash), else its exit code. An `Error:` line
    can be followed by noise from the teardown (gloo's threads aborting: "terminate called ...")."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("Error: ")]
    return (said or lines)[-1].removeprefix("Error: ") if lines else f"exit code {proc.returncode}"


def _forward(proc: subprocess.Popen, held: list[str]) -> None:
    """Rank 0's stderr to ours as it comes; its error lines are held back for the one-line report."""
    if proc.stderr is None:
        raise ValueError("rank 0 must be started with stderr=subprocess.PIPE")
    for raw in iter(proc.stderr.readline, b""):
        line = raw.decode(errors="replace")
        if line.startswith(("Error: ", "Traceback", "[rank")) or held:
            held.append(line)
        else:
            sys.stderr.write(line)
            sys.stderr.flush()


def _wait(procs: list[subprocess.Popen]) -> list[int]:
    """Wait for every process. After the first failure the others get GRACE_S to fail on their own (a
    peer's closed connection) before they are killed. Returns the failed ranks in the order they ended."""
    ended: list[tuple[float, int]] = []
    lock = threading.Lock()

    def watch(rank: int) -> None:
        procs[rank].wait()
        with lock:
            ended.append((time.monotonic(), rank))

    for r in range(len(procs)):
        threading.Thread(target=watch, args=(r,), daemon=True).start()
    first_failure = None
    while True:
        with lock:
            failed = [r for _, r in sorted(ended) if procs[r].returncode != 0]
            done = len(ended) == len(procs)
        if failed and first_failure is None:
            first_failure = time.monotonic()
        if done or (first_failure is not None and time.monotonic() - first_failure > GRACE_S):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            return failed
        time.sleep(0.02)


def relaunch(nproc: int) -> NoReturn:
    """Run this same command (its arguments less --nproc-per-node) in nproc processes, and exit with their outcome."""
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            argv.append(a)
    code, line = run(nproc, argv)
    if line:
        fail(line, code)
    raise typer.Exit(code)


def say_fatal(e: BaseException) -> None:
    """One rank's error of a data-parallel run, as one line (a peer's failure named as such)."""
    if isinstance(e, TreegrpoError):
        error_line(str(e))
    elif isinstance(e, KeyboardInterrupt):
        error_line("interrupted")
    else:  # a peer failed (closed connection) or this rank did (a bug)
        first = (str(e).strip().splitlines() or [""])[0]
        error_line(f"{type(e).__name__}: {first}" if PEER_FAILURE.search(first) else internal_error(e))
