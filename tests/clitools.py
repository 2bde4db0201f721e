"""Helpers of the CLI tests: invoke `treegrpo` in-process, check one-line errors."""

from typer.testing import CliRunner

from treegrpo_cli.cli.app import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, *needles):
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for n in needles:
        assert n in lines[0], lines[0]
