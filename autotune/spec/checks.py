"""Checks shared by the study file's sections: each raises SpecError naming the file, the key,
the value it got and what is accepted. `read_yaml` is the only place YAML is parsed."""

from __future__ import annotations

import difflib
import math
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import SpecError, shown
from autotune.search.knob import finite

OPTIONAL_SECTIONS = ("space", "budget", "baseline", "confirm")


MAX_FILE_BYTES = 1 << 20  # a study file or preset is a page of YAML; this is a thousand pages


def read_yaml(path: Path) -> Any:
    """The YAML of a regular file of at most MAX_FILE_BYTES: a device (/dev/zero), a FIFO or a
    directory is refused before it is opened, as reading one would never end or block forever."""
    return _parse(path, _read_text(path))


def _read_text(path: Path) -> str:
    """The file's text, read only from a regular file of at most MAX_FILE_BYTES of UTF-8."""
    try:
        mode = path.stat().st_mode  # through symbolic links
        if not stat.S_ISREG(mode):
            raise SpecError(
                path,
                "(file)",
                str(path),
                f"is {_kind(mode)}, not a regular file; give the path of a study .yaml file",
            )
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise SpecError(
                path,
                "(file)",
                str(path),
                f"is larger than {MAX_FILE_BYTES >> 20} MiB; a study file is a page of YAML",
            )
        text = data.decode()
    except FileNotFoundError:
        raise SpecError(
            path, "(file)", str(path), "no such file; give the path of a study .yaml file"
        ) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            path,
            "(file)",
            str(path),
            f"is not UTF-8 text (byte {exc.start + 1} cannot be read as UTF-8); "
            "save the study file as UTF-8",
        ) from None
    except OSError as exc:
        raise SpecError(
            path,
            "(file)",
            str(path),
            f"cannot be read ({exc.__class__.__name__}); a readable text file",
        ) from None
    return text


def _parse(path: Path, text: str) -> Any:
    """The YAML in `text`, each way it can fail one line naming `path`."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise SpecError(
            path,
            "(yaml)",
            "(nesting)",
            "nested too deeply to read; a study file nests a few levels",
        ) from None
    except NotAName as exc:
        raise SpecError(
            path,
            "(yaml)",
            exc.where,
            f"a key is a name (or a number), not a list or a mapping such as {shown(exc.key)}",
        ) from None
    except DuplicateKey as exc:
        raise SpecError(
            path,
            f"{exc.key} ({exc.where})",
            exc.key,
            "this key is given twice in its mapping; "
            "give it once (YAML would keep the last silently)",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(path, "(yaml)", where, f"not valid YAML: {problem}") from None


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, where: str) -> None:
        super().__init__(key)
        self.key, self.where = key, where


class NotAName(yaml.YAMLError):
    def __init__(self, key: Any, where: str) -> None:
        super().__init__(str(key))
        self.key, self.where = key, where


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice, or a key that is a list or a
    mapping (`? [lr, batch_size]`), which no study file means."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                mark = key_node.start_mark
                raise NotAName(key, f"line {mark.line + 1}")
            if key in seen:
                mark = key_node.start_mark
                raise DuplicateKey(str(key), f"line {mark.line + 1}")
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def require(path: Path, key: str, value: Any, ok: bool, accepted: str) -> None:
    if not ok:
        raise SpecError(path, key, value, f"expected {accepted}")


def whole_number(
    path: Path,
    raw: Mapping[str, Any],
    key: str,
    *,
    default: int,
    low: int,
    high: int,
    what: str = "",
) -> int:
    """`raw[key]` (else `default`): a whole number from `low` to `high`; `what`: what it counts."""
    value = raw.get(key, default)
    require(
        path,
        key,
        value,
        is_int(value) and low <= value <= high,
        f"a whole number from {low} to {high}{what}",
    )
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(
    path: Path,
    key: str,
    value: Any,
    *,
    minimum: float = 0.0,
    inclusive: bool = False,
    maximum: float = math.inf,
) -> float:
    """A finite number above `minimum` and at most `maximum`; strings like "1e-3" (which YAML
    reads as text) are accepted."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
    ok = ok and (value >= minimum if inclusive else value > minimum) and value <= maximum
    relation = (
        "a finite number"
        if minimum == -math.inf
        else f"a finite number {'at least' if inclusive else 'greater than'} {minimum:g}"
    )
    if maximum < math.inf:
        relation += f" and at most {maximum:,.0f}"
    require(path, key, value, ok, relation)
    return float(value)


def mapping(path: Path, key: str, value: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """A section of the file; an empty one (`budget:` with nothing under it) means all defaults."""
    if value is None and key in OPTIONAL_SECTIONS:
        return {}
    require(
        path,
        key,
        value,
        isinstance(value, Mapping),
        f"a mapping with keys among {', '.join(allowed)}",
    )
    reject_unknown(path, key + ".", value, allowed)
    return value


def reject_unknown(
    path: Path, prefix: str, raw: Mapping[str, Any], allowed: tuple[str, ...]
) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SpecError(
                path,
                f"{prefix}{key}",
                key,
                f"unknown key; {hint}accepted keys: {', '.join(allowed)}",
            )
