"""Files in a directory altenv does not own: read and written without following links.

Run directories, records and checkpoints travel between people, so a file in one may be a
symlink to something else (``best.json -> ~/.bashrc``), a directory, a device
(``config.yaml -> /dev/zero``) or far larger than anything altenv writes. Every file
altenv writes in such a directory is opened with ``O_NOFOLLOW``, checked to be a regular
file before anything is truncated, written to a temporary file beside it and moved into
place (``os.replace``), so a link is refused and never written through. Every file read
from one is opened the same way and read up to a size bound. Whatever is wrong is a
:class:`UnsafeFileError` of one line naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import UserError

MB = 1 << 20
READ_LIMIT = 64 * MB
"""Default bound of a file read from a run directory (configs, summaries, checkpoints'
settings); records and arrays pass their own."""


class UnsafeFileError(UserError):
    """A file that is a link, not a regular file, not readable as asked, or too large."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse(path: Path, what: str, hint: bool = True) -> UnsafeFileError:
    return UnsafeFileError(f"{path}: {what}" + ("; altenv reads and writes only regular "
                           "files here (move it away or pick another directory)" if hint
                           else ", expected a regular file"))


def check_file(path: str | Path) -> bool:
    """Whether ``path`` exists; a :class:`UnsafeFileError` if it is there but is not a
    regular file (a link included, wherever it points)."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # not there, or a file above it
        return False
    if not stat.S_ISREG(mode):
        raise _refuse(path, f"is {_kind(mode)}")
    return True


def check_dir(path: str | Path) -> bool:
    """Whether directory ``path`` exists; a :class:`UnsafeFileError` if it is there but is
    a link or not a directory."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISDIR(mode):
        raise _refuse(path, f"is {_kind(mode)}, not a directory")
    return True


def make_dir(path: str | Path) -> Path:
    """Create directory ``path`` (and its parents) unless it is there; one that is a link or
    not a directory is refused."""
    path = Path(path)
    if not check_dir(path):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise _refuse(path, "cannot be made: a file is in its way") from None
        except OSError as err:
            raise UnsafeFileError(f"{path}: cannot make the directory ({err.strerror})"
                                  ) from None
        check_dir(path)
    return path


def check_tree(root: str | Path) -> None:
    """A :class:`UnsafeFileError` naming the first entry under ``root`` (``root`` itself
    included) that is a link or neither a regular file nor a directory."""
    root = Path(root)
    check_dir(root)
    for folder, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            entry = Path(folder) / name
            mode = os.lstat(entry).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise _refuse(entry, f"is {_kind(mode)}")


def _open(path: Path, flags: int, follow: bool = False) -> int:
    """``os.open`` without following a link (unless ``follow``); the descriptor of a
    regular file."""
    nofollow = 0 if follow else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | nofollow | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except FileNotFoundError:
        raise
    except OSError as err:
        try:
            mode = (os.stat if follow else os.lstat)(path).st_mode
        except OSError:
            raise UnsafeFileError(f"{path}: cannot open it ({err.strerror})") from None
        if stat.S_ISREG(mode):
            raise UnsafeFileError(f"{path}: cannot open it ({err.strerror})") from None
        raise _refuse(path, f"is {_kind(mode)}", not follow) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(path, f"is {_kind(mode)}", not follow)
    os.set_blocking(fd, True)
    return fd


def open_regular(path: str | Path, flags: int) -> int:
    """A descriptor of regular file ``path`` opened with ``flags`` (``O_CREAT`` creates
    it) and never through a link; a :class:`UnsafeFileError` otherwise. For files such as
    a lock that must stay the same file; others are written with :func:`write_bytes`."""
    return _open(Path(path), flags)


def read_bytes(path: str | Path, limit: int = READ_LIMIT, follow: bool = False) -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` of them (more is an error);
    ``FileNotFoundError`` when it is not there. ``follow``: a link is followed (a file the
    user named), still to a regular file only."""
    path = Path(path)
    fd = _open(path, os.O_RDONLY, follow)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFileError(f"{path}: larger than {limit / MB:g} MB, more than altenv "
                              "ever writes there; not read")
    return data


def read_text(path: str | Path, limit: int = READ_LIMIT, follow: bool = False) -> str:
    """:func:`read_bytes` decoded as UTF-8 (anything else is one line naming the file)."""
    data = read_bytes(path, limit, follow)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnsafeFileError(f"{path}: not UTF-8 text (byte {data[err.start]:#04x} at "
                              f"offset {err.start})") from None


def read_json(path: str | Path, limit: int = READ_LIMIT) -> Any:
    """The JSON value in ``path`` (:func:`read_text`; not JSON is one line naming it)."""
    try:
        return json.loads(read_text(path, limit))
    except (ValueError, RecursionError) as err:
        reason = "nested too deep" if isinstance(err, RecursionError) else str(err)
        raise UnsafeFileError(f"{path}: not JSON ({reason})") from None


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path: str | Path, durable: bool = False) -> Iterator[IO[bytes]]:
    """A binary file to write that replaces ``path`` when the block ends without an
    error (``durable``: synced to disk first). ``path`` must be a regular file or
    missing; a link there is refused, never followed, and nothing is truncated."""
    path = Path(path)
    check_file(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a killed write by a process with this PID
    fd = _open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        check_file(path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        _sync_dir(path.parent)


def write_bytes(path: str | Path, data: bytes, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` (:func:`replacing`)."""
    with replacing(path, durable) as fh:
        fh.write(data)


def write_text(path: str | Path, text: str, durable: bool = False) -> None:
    """Replace ``path`` with UTF-8 ``text`` (:func:`replacing`)."""
    write_bytes(path, text.encode("utf-8"), durable)


def write_json(path: str | Path, data: Any, indent: int | None = 1) -> None:
    """Replace ``path`` with ``data`` as JSON and a final newline."""
    write_text(path, json.dumps(data, indent=indent) + "\n")


def open_append(path: str | Path, binary: bool = False) -> IO[Any]:
    """File ``path`` opened to append (created when missing; UTF-8 text unless
    ``binary``), never through a link."""
    fd = _open(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "ab") if binary else os.fdopen(fd, "a", encoding="utf-8")


def read_mapping(path: str | Path, limit: int = READ_LIMIT) -> dict[str, Any] | None:
    """The JSON object in ``path`` (:func:`read_json`), ``None`` when it is not there; any
    other JSON value is one line naming the file."""
    if not check_file(path):
        return None
    data = read_json(path, limit)
    if not isinstance(data, dict):
        raise UnsafeFileError(f"{path}: not the file altenv writes (the top level is not a "
                              "JSON object); move it away to start that part again")
    return data


@contextlib.contextmanager
def as_written(path: str | Path) -> Iterator[None]:
    """Read the fields of ``path``, which altenv wrote, in this block: a field missing or
    of the wrong type there (``KeyError``, ``TypeError``, ``ValueError``,
    ``AttributeError``) is one line naming the file, not a traceback."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        if isinstance(err, UserError):
            raise
        raise UnsafeFileError(f"{path}: not the file altenv writes ({type(err).__name__}: "
                              f"{' '.join(str(err).split())[:120]}); move it away to start "
                              "that part again") from None
