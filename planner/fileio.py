"""Writing output files: atomically, with the mode a plain `open(path, "w")` would give, and a clean error.

`write_atomically` writes to a temporary file beside the target and renames it over the target, so a reader
never sees half a file and a failed write leaves nothing behind. The file gets the mode the process's umask
gives a new file (0666 & ~umask; mkstemp alone would make it 0600); an existing target keeps its own mode.
A path that cannot be written (missing directory, a directory, /proc, read-only, permission) raises
OutputIOError, which the CLI reports as one line with exit code 8.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from planner.errors import FileAccessError as OutputIOError  # exit 8


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _target_mode(path: Path) -> int:
    try:
        st = path.stat()
    except FileNotFoundError:
        return _new_file_mode()
    if stat.S_ISDIR(st.st_mode):
        raise OutputIOError(f"cannot write {path}: it is a directory (give a file name)")
    if not stat.S_ISREG(st.st_mode):
        raise OutputIOError(f"cannot write {path}: not a regular file")
    return stat.S_IMODE(st.st_mode)


def check_writable(path: Path | str | None) -> None:
    """Fail now (exit 8), before any work or other output, where `path` cannot be written: its folder is missing or
    not writable, or it is a directory. A command with several outputs checks each first, so that a bad -o does not
    leave its --figures behind."""
    if path is None:
        return
    path = Path(path).resolve()
    _target_mode(path)
    if not path.parent.is_dir():
        raise OutputIOError(f"cannot write {path}: no such directory {path.parent}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise OutputIOError(f"cannot write {path}: the directory {path.parent} is not writable")


def refuse_overwriting_input(output: Path | str | None, source: Path | str, what: str) -> None:
    """-o naming the command's own input (or a link to it): the input would be replaced by the output."""
    if output is not None and Path(output).resolve() == Path(source).resolve():
        raise OutputIOError(f"-o {output}: the same file as the {what} it is made from -> write to another file")


def write_atomically(path: Path | str, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory and a rename. A symbolic link is
    written through (its target is replaced), as `open(path, "w")` would."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    try:
        mode = _target_mode(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OutputIOError:
        raise
    except OSError as exc:
        raise OutputIOError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputIOError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
