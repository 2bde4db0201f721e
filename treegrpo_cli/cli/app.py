"""The `treegrpo` command: thin commands that parse options, build a config and call the library."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from .. import __version__
from . import (
    compare_cmd,
    config_cmd,
    diversity_cmd,
    eval_cmd,
    export_cmd,
    inspect_cmd,
    presets_cmd,
    rollout_cmd,
    score_cmd,
    serve_cmd,
    train_cmd,
)
from .common import error_line, internal_error

# typer's click exceptions (typer vendors click as typer._click since 0.2x; before, click's own), from its public
# BadParameter: a usage error is a bad option value, an unknown option or command, a missing argument
_USAGE_ERROR: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_CLICK_EXCEPTION: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class OneLineErrors(TyperGroup):
    """typer's group, except that a usage error (an option value out of range or of the wrong type, an unknown
    option or command, a missing argument) is one line on stderr like every other error, instead of a usage
    line, a hint and a boxed panel. --help, --version and a bare `treegrpo` print what they always did."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:  # the result is a typer.Exit's code, or None
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except _USAGE_ERROR as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # a bare command: its help is printed, as before
                raise SystemExit(e.exit_code) from None
            ctx = e.ctx
            hint = f" (see {ctx.command_path} {ctx.help_option_names[0]})" if ctx is not None else ""
            message = " ".join(e.format_message().split())
            error_line(message + (_config_hint(list(sys.argv[1:] if args is None else args), message) or hint))
            raise SystemExit(e.exit_code) from None
        except _CLICK_EXCEPTION as e:  # not a usage error: typer's own rendering
            from typer import rich_utils

            rich_utils.rich_format_error(e)
            raise SystemExit(e.exit_code) from None
        except typer.Abort:
            error_line("aborted")
            raise SystemExit(1) from None
        sys.exit(code if isinstance(code, int) else 0)


def _config_hint(args: list[str], message: str) -> str:
    """Hydra's and argparse's habits for config keys, which typer reports as extra arguments: `train.lr=1e-4`
    bare, or `--set train.lr 1e-4` with a space, get the spelling that works."""
    if "extra argument" not in message:
        return ""
    for i, a in enumerate(args):
        if i and args[i - 1] == "--set" and "=" not in a and i + 1 < len(args):
            return f" (write --set {a}={args[i + 1]}: key and value in one argument)"
        if not a.startswith("-") and "=" in a and "." in a.split("=", 1)[0] and (not i or args[i - 1] != "--set"):
            return f" (config keys go in --set: --set {a.lstrip('+')})"
    return ""


app = typer.Typer(
    name="treegrpo",
    cls=OneLineErrors,
    help="Tree-structured GRPO post-training for text-to-image and text-to-video flow models.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        for line in version_lines():
            typer.echo(line)
        raise typer.Exit()


def version_lines() -> list[str]:
    """treegrpo's version and git commit (when a checkout), torch's and CUDA's versions, the device `auto` picks."""
    import torch

    from ..errors import TreegrpoError
    from ..preflight import resolve_device
    from ..training.provenance import code_version

    commit = code_version()["commit"]
    cuda = torch.version.cuda
    if cuda is None:
        cuda_said = "none (a CPU build of torch)"
    else:
        cuda_said = cuda + ("" if torch.cuda.is_available() else " (no GPU seen by torch)")
    try:
        device = resolve_device("auto")
    except TreegrpoError as e:
        device = f"none ({e})"
    return [
        f"treegrpo {__version__}" + (f" (commit {commit})" if commit else ""),
        f"torch {torch.__version__}, CUDA {cuda_said}",
        f"--device auto: {device}",
    ]


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Print the version (and git commit), torch's and CUDA's, the device auto picks, and exit.",
    ),
) -> None:
    """Roll out trees, score them, train, evaluate and check sample diversity."""


app.add_typer(config_cmd.config_app, name="config")
app.command("rollout")(rollout_cmd.rollout)
app.command("score")(score_cmd.score)
app.command("train")(train_cmd.train)
app.command("inspect")(inspect_cmd.inspect)
app.command("presets")(presets_cmd.presets)
app.command("diversity")(diversity_cmd.diversity)
app.command("eval")(eval_cmd.eval_)
app.command("export")(export_cmd.export)
app.command("compare")(compare_cmd.compare)
app.command("serve-reward")(serve_cmd.serve_reward)


# Placeholders in --help: the option's own word instead of a Python type ("<list[str]>", "<bool>").
SPECIAL_METAVARS = {
    "set_": "KEY=VALUE",
    "reward_opt": "NAME.KEY=VALUE",
    "metric": "NAMES",
    "reward": "NAMES",
    "weights": "W1,W2",
    "features": "NAMES",
    "log": "TRACKERS",
}


def unwrap(text: str | None) -> str | None:
    """A docstring's prose paragraphs as single lines, for the terminal to wrap (typer keeps a paragraph's line
    breaks, which leave ragged lines in a narrow terminal); a paragraph with an indented line keeps its breaks."""
    if not text:
        return text
    paragraphs = text.split("\n\n")
    return "\n\n".join(
        p if any(line.startswith(" ") for line in p.splitlines()) else " ".join(p.split("\n")) for p in paragraphs
    )


def readable_help(command) -> None:
    """Give every option of a click command tree a readable metavar (flags none), and its help unwrapped prose."""
    for sub in getattr(command, "commands", {}).values():
        readable_help(sub)
    command.help = unwrap(command.help)
    made = command.get_help_option

    def help_option(ctx, made=made):
        opt = made(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt

    command.get_help_option = help_option
    for p in command.params:
        if p.metavar is not None:
            continue
        if getattr(p, "param_type_name", "") == "argument":
            p.metavar = p.name.upper()
            p.display_type_rich = lambda ctx: None  # the name says it; no "<path>" beside it
        elif getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""
        elif p.name in SPECIAL_METAVARS:
            p.metavar = SPECIAL_METAVARS[p.name]
        else:
            kind = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            p.metavar = "N" if kind is int else "X" if kind is float else p.name.rstrip("_").upper().replace("_", "-")


def main() -> None:
    command = typer.main.get_command(app)
    readable_help(command)
    try:
        command()
    except Exception as e:  # raised outside a command's guard: still one line, the traceback in a file
        error_line(internal_error(e))
        raise SystemExit(1) from None
