"""User-facing errors: the CLI turns each into one line on stderr and a non-zero exit."""


class TreegrpoError(Exception):
    """Bad input or a broken file; the message is one line meant for the user."""

    exit_code = 1


class ConfigError(TreegrpoError):
    """A bad preset, option or config value (exit code 2, like a usage error)."""

    exit_code = 2


class CorruptFileError(TreegrpoError):
    """A stored file does not match its recorded hash or format."""
