"""Shared CLI plumbing: one-line errors, rich progress on stderr, JSON output."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..errors import TreegrpoError

err = Console(stderr=True)
out = Console()


def fail(message: str, code: int = 1) -> None:
    """Print one error line on stderr and exit non-zero."""
    err.print(f"[bold red]Error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def guarded() -> Iterator[None]:
    """Turn library errors into one line and an exit code; never a traceback."""
    try:
        yield
    except TreegrpoError as e:
        fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)


@contextmanager
def progress_bar(
    enabled: bool = True, quiet: tuple[str, ...] = (), every_s: float = 30.0
) -> Iterator[Callable[[str, int, int], None]]:
    """A callback (phase, done, total): one rich bar per phase on a terminal; elsewhere (a log file, CI)
    a plain line when a phase ends and every `every_s` seconds while it runs (phases in `quiet` excepted)."""
    if not enabled:
        yield lambda phase, done, total: None
        return
    if not err.is_terminal:
        last: dict[str, float] = {}

        def line(phase: str, done: int, total: int) -> None:
            now = time.monotonic()
            if phase in quiet or (done < total and now - last.setdefault(phase, now) < every_s):
                return
            last[phase] = now
            err.print(f"{phase}: {done}/{total}", highlight=False, markup=False)

        yield line
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    tasks: dict[str, TaskID] = {}
    with Progress(*columns, console=err, transient=False) as bar:

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=1, allow_nan=False, default=str) + "\n")
    sys.stdout.flush()


def command_line() -> str:
    return " ".join(["treegrpo", *sys.argv[1:]])


def parse_numbers(text: str, option: str) -> list[float]:
    """'0.8,0.2' -> [0.8, 0.2]; anything else is one line naming the option."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise TreegrpoError(f"{option} must be numbers separated by commas, got {text!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise TreegrpoError(f"{option} must be finite numbers, got {text!r}")
    return values
