"""Every local write of ptfile: a temporary beside the output, renamed over it on success.

:func:`atomic_path` (and :func:`atomic_file` over it) leave the old file or the new one,
never a partial one, with the modes torch's plain ``open(path, "wb")`` gives (``0o666``
less the umask; a replaced file's own mode).  Its docstring is the specification.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat as _stat
from collections.abc import Iterator
from typing import IO, Final

__all__ = ["atomic_file", "atomic_path"]


#: Tries at a fresh temporary name beside an output before giving up (tempfile's count).
_TEMP_ATTEMPTS: Final = 100
_CREATE_FLAGS: Final = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                        | getattr(os, "O_BINARY", 0))


def _fresh_sibling(path: str, directory: bool = False) -> str:
    """Create an empty file (a folder when ``directory``) under a fresh hidden name beside
    ``path``, with the mode ``open(path, "wb")`` (``os.mkdir(path)``) would give it there:
    asked of ``0o666`` (``0o777``), less the umask (or as a default ACL of the folder
    says), applied by the kernel as for torch's ``open``."""
    folder, stem = os.path.split(os.path.abspath(path))  # abspath: "out/" -> "out"
    for _ in range(_TEMP_ATTEMPTS):
        tmp = os.path.join(folder, f".{stem}.{secrets.token_hex(4)}.tmp")
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, _CREATE_FLAGS, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(errno.EEXIST, "no fresh temporary name left", folder)


def _settle_mode(tmp: str, path: str, fresh: int) -> None:
    """Give ``tmp`` the permission bits ``open(path, "wb")`` would leave: those of the
    file (folder) ``path`` it replaces, else ``fresh`` for a new file (a writer may have
    renamed a file of its own over the temporary: safetensors does).  A new folder
    keeps those its writer's ``mkdir`` gave it."""
    try:
        old: int | None = os.stat(path).st_mode
    except OSError:
        old = None
    if old is not None and ((_stat.S_ISREG(old) and os.path.isfile(tmp))
                            or (_stat.S_ISDIR(old) and os.path.isdir(tmp))):
        want = _stat.S_IMODE(old) & 0o777
    elif os.path.isfile(tmp):
        want = fresh
    else:
        return
    if _stat.S_IMODE(os.stat(tmp).st_mode) != want:
        os.chmod(tmp, want)


def _replace(tmp: str, path: str) -> None:
    """Rename ``tmp`` over ``path``; a folder over a folder moves the old one aside first
    (``os.replace`` cannot), removed once the new one is in place."""
    if not (os.path.isdir(tmp) and os.path.isdir(path) and not os.path.islink(path)):
        os.replace(tmp, path)
        return
    old = _fresh_sibling(path, directory=True)
    os.rename(path, os.path.join(old, "old"))
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _as_given(exc: OSError, path: str, temps: tuple[str, ...]) -> OSError:
    """``exc`` naming ``path`` wherever it names one of ``temps`` (or a file inside one):
    an error speaks of the output the caller gave, never of a temporary it never named."""
    def given(name: object) -> object:
        if isinstance(name, str) and any(name == t or name.startswith(t + os.sep)
                                         for t in temps):
            return path
        return name

    filename, filename2 = given(exc.filename), given(exc.filename2)
    if (filename, filename2) == (exc.filename, exc.filename2):
        return exc
    if filename2 == filename:  # a rename of the temporary over the output: one name
        filename2 = None
    renamed = type(exc)(exc.errno, exc.strerror, filename, None, filename2)
    return renamed.with_traceback(exc.__traceback__)


def _staging(path: str, same_name: bool) -> tuple[str | None, str]:
    """The fresh temporary folder (``same_name``) and the path to write, beside ``path``,
    its folder made first when missing (``os.makedirs``: ``0o777`` less the umask, as
    ``mkdir -p`` and torch's ``dcp.save`` make folders)."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)  # its own error names the folder as given
    try:
        if not same_name:
            return None, _fresh_sibling(path)
        staging = _fresh_sibling(path, directory=True)
    except OSError as exc:  # a folder that takes no new file: say so of the output
        raise _as_given(exc, path, (os.path.dirname(os.path.abspath(path)),)) from None
    return staging, os.path.join(staging, os.path.basename(os.path.abspath(path)))


@contextlib.contextmanager
def atomic_path(path: str, fsync: bool = False, *, same_name: bool = False) -> Iterator[str]:
    """A temporary path beside ``path`` to write instead, renamed over ``path`` only on
    success and removed on failure: a crash leaves the old file or the new one, never a
    partial one.  Every local write of ptfile goes through here (or :func:`atomic_file`).

    * A folder of ``path`` that does not exist yet is made first, with its parents
      (``os.makedirs``: ``0o777`` less the umask, the mode ``mkdir -p`` and torch's
      ``dcp.save`` give); it stays when the write fails.
    * Modes are torch's (a plain ``open(path, "wb")``): a new file gets ``0o666`` less
      the umask, a file (folder) that replaces another keeps the permission bits of the
      one it replaces.  The temporary is created with ``0o666`` (``0o777``), not
      ``mkstemp``'s ``0o600``, and the kernel applies the umask: it is never read
      (``os.umask`` reads it only by setting it, for the whole process, a race with
      other threads; ``/proc/self/status`` is Linux's alone).  The mode the kernel gave
      the temporary is set again before the rename, in case the writer replaced it.
    * The yielded path is an empty file of a fresh hidden name (``.NAME.XXXXXXXX.tmp``);
      with ``same_name`` it is ``path``'s own name inside a fresh hidden folder, not yet
      there, for writers that name what they write after the file (an archive's
      folder) or that write a folder (made with ``os.mkdir``'s modes, by the writer).
      A folder replaces a folder: the old one is removed once the new one is in place.
    * An ``OSError`` that names the temporary (making it, writing it, renaming it) is
      raised naming ``path`` instead: errors speak of the paths the caller gave.
    * ``fsync``: the file (folder) is flushed to disk before the rename, and the folder
      holding it after.
    """
    staging, tmp = _staging(path, same_name)
    # A new file's mode, as the kernel just applied it (a folder's 0o777 less the umask
    # holds the file's 0o666 less the umask).
    fresh = _stat.S_IMODE(os.stat(staging or tmp).st_mode) & 0o666
    try:
        yield tmp
        if fsync:
            _fsync(tmp)
        _settle_mode(tmp, path, fresh)
        _replace(tmp, path)
    except OSError as exc:
        if staging is None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        renamed = _as_given(exc, path, (staging or tmp,))
        if renamed is exc:
            raise
        raise renamed from None  # the same error, of the output: no second one of the temporary
    except BaseException:
        if staging is None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if fsync:
        with contextlib.suppress(OSError):
            _fsync(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def atomic_file(path: str, fsync: bool) -> Iterator[IO[bytes]]:
    """:func:`atomic_path` opened for writing: the file is renamed over ``path`` once the
    block succeeds, with torch's modes (``save``, ``convert_dcp`` and the exports write so)."""
    with atomic_path(path, fsync) as tmp, open(tmp, "wb") as fp:
        yield fp
