"""User-facing errors: the CLI turns each into one line on stderr and a non-zero exit."""


def shown(value: object, limit: int = 200) -> str:
    """A value read from a file or the command line, for an error line: its repr, cut short (a list of more
    than `limit` entries is named by its size, not echoed)."""
    if isinstance(value, (list, dict, tuple, set)) and len(value) > limit:
        return f"{type(value).__name__} of {len(value):,} entries"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TreegrpoError(Exception):
    """Bad input or a broken file; the message is one line meant for the user."""

    exit_code = 1


class ConfigError(TreegrpoError):
    """A bad preset, option or config value (exit code 2, like a usage error)."""

    exit_code = 2


class CorruptFileError(TreegrpoError):
    """A stored file does not match its recorded hash or format."""


class DiskFullError(TreegrpoError):
    """A write that found no space left on its disk (ENOSPC, or a quota): one line naming the folder."""

    def __init__(self, what: str, then: str = "run the command again"):
        super().__init__(f"{what}; free some space and {then}")
        self.what = what

    def then(self, advice: str) -> "DiskFullError":
        """The same line with the command's own advice for after the space is freed."""
        return DiskFullError(self.what, advice)


def no_space(e: BaseException) -> bool:
    """Is this exception a full disk (or quota), however a library wrapped it?"""
    import errno

    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left on device" in text or "Disk quota exceeded" in text


def disk_full(folder: object, need: int | None = None, then: str = "run the command again") -> DiskFullError:
    """The one line of a write to `folder` that found its disk full; `need`: the bytes being written; `then`:
    what to do once there is space (the command's own advice: a run says how it resumes)."""
    import shutil
    from pathlib import Path

    known = [f"{need / 1e6:,.1f} MB needed"] if need is not None else []
    place = Path(str(folder)).absolute()
    while not place.exists() and place != place.parent:  # the disk of the nearest folder that exists
        place = place.parent
    try:
        known.append(f"{shutil.disk_usage(place).free / 1e6:,.1f} MB free")
    except OSError:
        pass
    return DiskFullError(f"{folder}: no space left on its disk{' (' + ', '.join(known) + ')' if known else ''}", then)
