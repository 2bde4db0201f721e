"""The `treegrpo` command: thin commands that parse options, build a config and call the library."""

from __future__ import annotations

import typer

from .. import __version__
from . import diversity_cmd, eval_cmd, export_cmd, inspect_cmd, presets_cmd, rollout_cmd, score_cmd, train_cmd

app = typer.Typer(
    name="treegrpo",
    help="Tree-structured GRPO post-training for text-to-image flow models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"treegrpo {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """Roll out trees, score them, train, evaluate and check sample diversity."""


app.command("rollout")(rollout_cmd.rollout)
app.command("score")(score_cmd.score)
app.command("train")(train_cmd.train)
app.command("inspect")(inspect_cmd.inspect)
app.command("presets")(presets_cmd.presets)
app.command("diversity")(diversity_cmd.diversity)
app.command("eval")(eval_cmd.eval_)
app.command("export")(export_cmd.export)


def main() -> None:
    app()
