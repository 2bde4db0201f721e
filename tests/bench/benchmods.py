"""bench/NAME.py as a module for the tests (bench/ is not a package): clitools.bench_module."""

from clitools import bench_module as load

__all__ = ["load"]
