"""Shared CLI plumbing: one-line errors, rich progress on stderr, JSON output."""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from .. import __version__
from ..errors import TreegrpoError, disk_full, no_space
from ..models import catalog

DEVICE_HELP = (
    "Torch device: auto (a GPU when torch sees one, each process of a distributed run on cuda:LOCAL_RANK; else MPS "
    "where it works; else the CPU), cpu, cuda, cuda:N or mps"
)
# the title of the model options' help panel and --model's help, from the diffusers adapters' cards (read from
# their source: no torch)
MODEL_PANEL = f"Model (diffusers: {', '.join(catalog.families())})"


def model_help(default: str) -> str:
    """--model's help: what it takes, the releases named from the adapters' cards."""
    return (
        f"Model (default: {default}): a built-in name, a release ({', '.join(catalog.known())}), a hub id "
        "(org/name) or a local diffusers folder."
    )


# Plain text by default: paths, labels and names from files are printed as they are, never read as rich
# markup ("r[/x]" is a folder name, not a closing tag); the few styled words are rich Text objects.
err = Console(stderr=True, markup=False)
out = Console(markup=False)


def one_line(text: str) -> str:
    """text with every character that is not printable (newline, CR, tab, ESC, the Unicode line separators)
    written as its escape (\\n, \\x1b, ...): text quoted from the user (a path, a name) cannot start another
    line of the output or drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def error_line(message: str) -> None:
    """Print one error line on stderr (control characters escaped)."""
    err.print(f"[bold red]Error:[/] {escape(one_line(message))}", highlight=False, markup=True, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one error line on stderr and exit non-zero."""
    error_line(message)
    raise typer.Exit(code)


# Where an internal error's traceback goes: the run folder of the command when it has one (set_error_dir),
# else the temp folder.
_error_dir: list[Path] = []


def set_error_dir(folder: Path | None) -> None:
    """The folder (a run folder) that gets the traceback file of an internal error of this command."""
    _error_dir[:] = [Path(folder)] if folder is not None else []


def internal_error(e: BaseException) -> str:
    """The one line of an unexpected exception (a bug, not bad input), after writing its whole traceback to
    error-<time>-<pid>.txt in the command's run folder (if it exists) or the temp folder. The machine's
    refusals (no space or permission: OSError; out of memory) are said to be that rather than a bug."""
    first = (str(e).strip().splitlines() or [""])[0]
    head = f"{type(e).__name__}: {first}" if first else type(e).__name__
    system = isinstance(e, (OSError, MemoryError)) or "OutOfMemory" in type(e).__name__
    what = "a system error (disk, memory or permissions), not bad input" if system else "this is a bug"
    report = "" if system else "; please report it with this file"
    text = (
        f"treegrpo {__version__}, internal error: {what}{report}.\n"
        f"command: {command_line()}\npython: {sys.version.split()[0]}, pid {os.getpid()}\n\n"
        + "".join(traceback.format_exception(type(e), e, e.__traceback__))
    )
    stem = f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for folder in [*[d for d in _error_dir if d.is_dir()], Path(tempfile.gettempdir())]:
        for k in range(10):
            path = folder / (stem + (f"-{k}" if k else "") + ".txt")
            try:
                with open(path, "x") as f:  # never over another file
                    f.write(text)
            except FileExistsError:
                continue
            except OSError:
                break
            return f"{head}; {what}; the traceback is in {path}"
    return f"{head}; {what} (its traceback could not be written)"


# How a command ends on purpose (an exit code, a usage error): never an internal error.
# typer's exits and usage errors pass (typer vendors click as typer._click: click itself may not be installed)
_TYPER_CLICK_EXCEPTION: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
PASS_THROUGH: tuple[type[BaseException], ...] = (
    typer.Exit,
    typer.Abort,
    _TYPER_CLICK_EXCEPTION,
)


@contextmanager
def guarded() -> Iterator[None]:
    """Turn library errors into one line and an exit code; never a traceback. An unexpected exception is a
    bug: its one line names the file that holds its traceback."""
    try:
        yield
    except TreegrpoError as e:
        fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
        fail("interrupted", getattr(e, "exit_code", 130))
    except PASS_THROUGH:
        raise
    except Exception as e:
        if no_space(e):  # a write the library did not name: the disk it went to, in one line
            fail(str(disk_full(getattr(e, "filename", None) or Path.cwd())), 1)
        fail(internal_error(e), 1)
    finally:
        set_error_dir(None)  # the next command (in this process, as in the tests) starts without one


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
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        Eta(),
    )
    tasks: dict[str, TaskID] = {}
    with Progress(*columns, console=err, transient=False) as bar:

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            else:
                task = bar.tasks[tasks[phase]]
                if task.finished and done < task.completed + (total != task.total):  # a new pass of the phase
                    bar.reset(tasks[phase], total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


class Eta(ProgressColumn):
    """Time left at the mean pace so far (rich's own estimate needs several samples inside a window, so a bar of
    slow steps, such as training iterations, reads -:--:-- for its first ones)."""

    def render(self, task: Task) -> Text:
        if task.finished:
            return Text("done", style="progress.remaining")
        if not task.completed or not task.elapsed or task.total is None:
            return Text("eta -:--:--", style="progress.remaining")
        left = task.elapsed / task.completed * (task.total - task.completed)
        return Text(f"eta {datetime.timedelta(seconds=round(left))}", style="progress.remaining")


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


class Signalled(KeyboardInterrupt):
    """SIGTERM or SIGINT where a command stops at once: "interrupted", with the shell's exit code (128 + it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


@contextmanager
def on_stop_signals(handler: Any) -> Iterator[None]:
    """SIGINT and SIGTERM go to handler for the duration; the handlers before come back after."""
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 0.9 s, 57 s, 3.2 min, 1 h 05 min."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if seconds < 3600 - 30:
        return f"{seconds / 60:.1f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min"


def number(v: float) -> str:
    """A float with four significant digits (3e-05, 0.7657, 12.7), not four decimals that round it to 0.0000."""
    return f"{v:.4g}"
