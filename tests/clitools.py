"""Helpers of the CLI tests: invoke `treegrpo` in-process, check one-line errors."""

import re

from typer.testing import CliRunner

from treegrpo_cli.cli.app import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


# the lines `train` prints before it loads the model (cli/train_cmd.py run_header): an error found while loading
# (a LoRA target the model lacks) comes after them
RUN_HEADER = re.compile(
    r"^((starting|resuming) \S+: model .*|device: \S+( \(no GPU seen by torch\))?|run folder: .*|"
    r"loading .+ \.\.\.|.+ ready on \S+ in [\d.]+s|reading \S*step-\d+|writing the .* weights of step \d+ to .* \.\.\.|"
    r"warning: \S+ has [\d.]+ billion denoiser parameters and is about to be built on the CPU.*|"
    r"warning: \S+ from .* is overridden every iteration by schedule\.kind .*|"  # the user's tree under a schedule
    r"held-out (reward|evaluation) at iteration \d+: .*|iteration \d+: reward .*)$"  # progress before an error
)


def one_line_error(result, *needles):
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.strip().splitlines() if not RUN_HEADER.match(line)]
    assert len(lines) == 1, result.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def undeclared(row, row_type):
    """The keys of a run-log row that its TypedDict (runlog.MetricsRow, runlog.EvalRow) does not declare, per-name
    numbers (runlog.NUMBER_PREFIXES) aside: what the report and tracking code would read untyped."""
    from treegrpo_cli.training.runlog import NUMBER_PREFIXES

    declared = row_type.__required_keys__ | row_type.__optional_keys__
    return [k for k in row if k not in declared and not k.startswith(NUMBER_PREFIXES)]
