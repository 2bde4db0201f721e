"""Reading what users and other programs hand the tool, within bounds: one JSON/TOML reader with a depth
limit, and one containment check for every path found inside a folder the tool reads.

    loads_json(raw)            json.loads, but a document nested deeper than MAX_DEPTH is a ValueError
                               (the callers' "not valid JSON" line), never a RecursionError
    loads_toml(text)           the same for TOML (a tomllib.TOMLDecodeError, itself a ValueError)
    contained(root, path, ..)  path, after checking that it resolves (links followed, at any depth of a
                               folder walked) to a file or folder inside root; one TreegrpoError otherwise
    shown(value)               (errors.shown) a value for an error line: its repr, cut short (a huge list is
                               named by its size, not echoed)
    read_text(path, what)      a user's text file, UTF-8 (a byte-order mark dropped): bytes that are not
                               UTF-8 are one line naming the file and the line they are on (utf8_text)

The module imports nothing of the tool's but its errors (nor torch): every layer above the engine may use it.
"""

from __future__ import annotations

import codecs
import json
import tomllib
from pathlib import Path
from typing import Any

from ..errors import TreegrpoError
from ..errors import shown as shown  # here for the callers that read files (errors.py: the engine's too)

MAX_DEPTH = 64  # levels of nested arrays and objects in any JSON or TOML document the tool reads


def depth(obj: Any) -> int:
    """Levels of nesting of parsed JSON/TOML (a scalar: 0), without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            items: Any = x.values()
        elif isinstance(x, list):
            items = x
        else:
            continue
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        stack.extend((v, d + 1) for v in items if isinstance(v, (dict, list)))
    return deepest


class TooDeep(tomllib.TOMLDecodeError):
    """A JSON or TOML document nested deeper than MAX_DEPTH (a ValueError, as any invalid document is)."""

    def __init__(self) -> None:
        super().__init__(f"nested deeper than {MAX_DEPTH} levels of arrays and objects; not read")


def loads_json(raw: str | bytes | bytearray) -> Any:
    """json.loads with a depth limit: TooDeep, a ValueError (as for any invalid JSON), when nested too deep."""
    return _bounded(json.loads, raw)


def loads_toml(text: str) -> dict[str, Any]:
    """tomllib.loads with a depth limit: a TOMLDecodeError (as for any invalid TOML) when nested too deep."""
    return _bounded(tomllib.loads, text)


def _bounded(load: Any, text: Any) -> Any:
    """load(text), refused as TooDeep when the parser recurses out or the document nests past MAX_DEPTH."""
    try:
        obj = load(text)
    except RecursionError:
        raise TooDeep() from None
    if depth(obj) > MAX_DEPTH:
        raise TooDeep()
    return obj


def read_regular(path: Path, what: str, error: type[TreegrpoError] = TreegrpoError) -> bytes:
    """The bytes of a user's file; a missing path or one that is not a regular file (a folder, a FIFO whose read
    would block, a device such as /dev/zero) is one line naming it as `what` ("config file", "prompts file")."""
    if not path.exists():
        raise error(f"{what} not found: {path}")
    if not path.is_file():
        raise error(f"{what} {path} is not a regular file")
    return path.read_bytes()


def read_text(path: Path, what: str, error: type[TreegrpoError] = TreegrpoError) -> str:
    """The text of a user's file (read_regular's checks first): UTF-8, a byte-order mark dropped."""
    return utf8_text(read_regular(path, what, error), path, error)


def utf8_text(raw: bytes, path: Path | str, error: type[TreegrpoError] = TreegrpoError) -> str:
    """raw as UTF-8 text (a leading byte-order mark dropped); bytes that are not UTF-8 are one line naming the
    file, the line and the column (in bytes) of the first of them."""
    body = raw[len(codecs.BOM_UTF8) :] if raw.startswith(codecs.BOM_UTF8) else raw
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        line = body.count(b"\n", 0, e.start) + 1
        column = e.start - (body.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(
            f"{path}:{line}: not UTF-8 text (byte 0x{body[e.start]:02x} at column {column}); save the file as UTF-8"
        ) from None


def contained(root: Path, path: Path, what: str = "") -> Path:
    """`path` (a file or folder found in or under `root`) when it resolves, through any link at any depth,
    inside `root`; one TreegrpoError naming it otherwise. Reads nothing but the links."""
    root, path = Path(root), Path(path)
    try:
        real, base = path.resolve(strict=True), root.resolve(strict=True)
    except FileNotFoundError:
        raise TreegrpoError(f"{what or path}: {path} does not exist (or is a broken link)") from None
    except (OSError, RuntimeError) as e:  # a link loop
        raise TreegrpoError(f"{what or path}: {path} does not resolve ({e})") from None
    if real != base and not real.is_relative_to(base):
        raise TreegrpoError(
            f"{what or path}: {path} is a link that resolves outside {root} (to {real}); it is not read"
        )
    return path
