"""The files a user asks autotune to write (`report --csv/--html`, `export -o`).

None of them may ever be one of the study's own files, whatever name, symbolic link or hard link
reaches it, not even with --force; and a file that autotune did not write is replaced only with
--force. Files are compared as the kernel sees them (device and inode), and a regular file is
written beside its target and renamed over it, so that another hard link to the old contents
keeps them and a write cut short leaves the old file whole.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from autotune.errors import AutotuneError
from autotune.spec.storage_url import local_path
from autotune.spec.study_file import StudySpec
from autotune.storage import opening


def study_files(spec: StudySpec) -> dict[Path, str]:
    """The study's own files, by path: what no output may replace."""
    own = {spec.path: "the study file"}
    stored = local_path(spec.storage)
    if stored is not None:
        own.update(opening.files_of(stored))
    return own


def _same_file(a: Path, b: Path) -> bool:
    try:
        # device and inode: a hard link, a symbolic link, another spelling
        return os.path.samefile(a, b)
    except OSError:  # one of them is not there: only the names can say
        try:
            return a.resolve() == b.resolve()
        except (
            OSError,
            RuntimeError,
        ):  # a symbolic link loop on the way: no file of the study lies there
            return False


# `-o -`, `--csv -`: standard output, as other command-line tools read it
STDOUT = Path("-")


def check_output(
    spec: StudySpec, output: Path, *, option: str, ours: Callable[[str], bool], force: bool
) -> None:
    """Refuse `output` if it is one of the study's files, or (unless `force`) an existing file that
    `ours` does not recognise as an earlier output of the same kind."""
    if output == STDOUT:
        return
    for own, what in study_files(spec).items():
        if _same_file(output, own):
            raise AutotuneError(f"{option} {output}: that is {what}; write it elsewhere")
    if force or not output.is_file():
        return
    try:
        with open(output, errors="replace") as file:
            head = file.read(64 * 1024)
    except OSError:
        return  # unreadable: the write will say why
    if head.strip() and not ours(head):
        raise AutotuneError(
            f"{option} {output}: the file exists and was not written by autotune; "
            f"choose another name, or pass --force to replace it"
        )


def write(output: Path, text: str, *, option: str) -> None:
    """Write `text` to a file the user named (`-`: standard output); a path that cannot be written
    is their error."""
    if output == STDOUT:
        sys.stdout.write(text)
        return
    try:
        try:
            mode: int | None = os.stat(output).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            # A terminal, a pipe, /dev/null: written through, not replaced. Opened by the name
            # given: /dev/stdout resolves to /proc/self/fd/1, which names a pipe by no path.
            with open(output, "w") as stream:
                stream.write(text)
        else:
            _replace(output.resolve(), text)
    except OSError as exc:
        raise AutotuneError(f"{option} {output}: cannot write ({exc.strerror or exc})") from None
    except RuntimeError as exc:  # Path.resolve on Python 3.11: a loop of symbolic links
        raise AutotuneError(f"{option} {output}: cannot write ({exc})") from None
    print(f"autotune: wrote {output}", file=sys.stderr)


def _replace(target: Path, text: str) -> None:
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        if mode is not None:
            os.chmod(temporary, mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
