"""User-facing errors: the CLI turns each into one line on stderr and a non-zero exit."""


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


def no_space(e: BaseException) -> bool:
    """Is this exception a full disk (or quota), however a library wrapped it?"""
    import errno

    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left on device" in text or "Disk quota exceeded" in text


def disk_full(folder: object, need: int | None = None) -> DiskFullError:
    """The one line of a write to `folder` that found its disk full; `need`: the bytes being written."""
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
    return DiskFullError(
        f"{folder}: no space left on its disk{' (' + ', '.join(known) + ')' if known else ''}; free some space "
        "and run the command again (a run goes on with --resume from its last checkpoint, which is intact)"
    )
