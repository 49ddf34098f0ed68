"""The oracle of the scan harness: real torch loaders, in a sandboxed child, on a batch of files.

:func:`run_loaders` hands a batch of files to one child process (``python -I``; torch is
imported once per batch) which opens every file with every loader it names and records
whether the file's *sentinel* appeared.  A payload in a generated file does one thing only:
it creates its sentinel (``open(path, "w")``, ``os.mkdir(path)``, ``Path.touch``), a path
unique to that file inside the sandbox, so a sentinel found after a loader ran was created
by that loader on that file (the sentinel is removed before the next loader runs).

The sandbox (set up in the child before it reads a file, after torch and the loaders'
modules are imported):

* an audit hook refuses process creation (``os.system``, ``subprocess``, ``fork``,
  ``exec``, ``posix_spawn``), sockets (``connect``, ``bind``, ``getaddrinfo``...), and any
  write, mkdir, rename, removal or link outside the sandbox root;
* ``RLIMIT_AS`` (memory) and ``RLIMIT_CPU`` (the whole batch) are capped; every loader gets
  a wall-clock alarm (:data:`LOADER_SECONDS`) that raises a ``BaseException``;
* the working directory and ``TMPDIR`` (torch extracts legacy tar members there) are fresh
  folders inside the root; the environment is minimal.

Every loader runs in ``try/except BaseException``; between loaders the working directory
and torch's safe-globals list are reset.  A child that dies (a crash, a C loop past the
alarm) is restarted on the files after the one it was reading, which is recorded as
``crashed``.  Results are written as JSON lines to a file, one per file, flushed, so the
parent reads what was done even when the child dies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ptfile

#: The real loaders, by the name results use.
TORCH_LOADERS = ("torch.load(weights_only=False)", "torch.load", "torch.load(mmap=True)",
                 "torch.jit.load", "torch.jit.mobile._load_for_lite_interpreter",
                 "torch.export.load", "pickle.load")
#: torch's DCP loader, for folders (``_load_state_dict_from_keys``: no process group).
DCP_LOADER = "dcp.load"
#: ptfile's own loaders (property: they never create the sentinel).
PTFILE_LOADERS = ("ptfile.load", "ptfile.load(structural=True)")

#: Wall-clock seconds one loader may spend on one file.
LOADER_SECONDS = 20
#: Address-space cap of the child (torch maps a lot of virtual memory at import).
MEMORY_BYTES = 8 << 30

_CHILD = r"""
import io, json, logging, os, resource, signal, sys, time, warnings
root, manifest, results = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, sys.argv[7])  # the parent's ptfile, whatever the interpreter would find
root = os.path.realpath(root)
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
import pickle, torch, torch.export, torch.jit, torch.jit.mobile, torch.serialization
import torch.distributed.checkpoint as dcp, torch.distributed.checkpoint.state_dict_loader
import torch.export.pt2_archive._package, torch._export.serde.serialize
import torch._inductor.cpp_builder
import ptfile
SAFE = list(torch.serialization.get_safe_globals())
import gc
gc.freeze()  # the imports' objects: the collector no longer walks them after every load

def _inside(path):
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False
    return os.path.realpath(os.path.join(os.getcwd(), path)).startswith(root + os.sep)

_PROCESS = ("os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
            "os.startfile", "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen")
_SOCKET = ("socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
           "socket.gethostbyname", "socket.gethostbyaddr", "socket.__new__")
_PATHS = ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link",
          "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move",
          "shutil.copyfile", "os.mkfifo", "os.mknod")

def _hook(event, args):
    if event in _PROCESS or event.startswith("subprocess.") or event in _SOCKET:
        raise PermissionError("sandbox: " + event)
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1] or "r", args[2] or 0
        writes = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR)
        if writes and not _inside(args[0]):
            raise PermissionError("sandbox: write outside the root: %r" % (args[0],))
    elif event in _PATHS:
        paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
        if not paths or not all(_inside(p) for p in paths):
            raise PermissionError("sandbox: %s outside the root: %r" % (event, args))

class Timeout(BaseException):
    pass

def _alarm(signum, frame):
    raise Timeout()

signal.signal(signal.SIGALRM, _alarm)
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[4]), int(sys.argv[4])))
resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[5]), int(sys.argv[5])))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.addaudithook(_hook)

def _pickle_load(path):
    with open(path, "rb") as f:
        return pickle.load(f)

LOADERS = {
    "torch.load(weights_only=False)": lambda p: torch.load(p, map_location="cpu", weights_only=False),
    "torch.load": lambda p: torch.load(p, map_location="cpu"),
    "torch.load(mmap=True)": lambda p: torch.load(p, map_location="cpu", mmap=True),
    "torch.jit.load": lambda p: torch.jit.load(p, map_location="cpu"),
    "torch.export.load": lambda p: torch.export.load(p),
    "torch.jit.mobile._load_for_lite_interpreter":
        lambda p: torch.jit.mobile._load_for_lite_interpreter(p, map_location="cpu"),
    "dcp.load": lambda p: dcp.state_dict_loader._load_state_dict_from_keys(checkpoint_id=p),
    "pickle.load": _pickle_load,
    "ptfile.load": lambda p: ptfile.load(p),
    "ptfile.load(structural=True)": lambda p: ptfile.load(p, structural=True),
}
cwd = os.getcwd()
seconds = int(sys.argv[6])

def _gone(sentinel):
    if os.path.isdir(sentinel) and not os.path.islink(sentinel):
        os.rmdir(sentinel)
    elif os.path.lexists(sentinel):
        os.remove(sentinel)

with open(manifest) as m, open(results, "a") as out:
    for line in m:
        item = json.loads(line)
        fired, errors, spent = [], {}, {}
        for name in item["loaders"]:
            os.chdir(cwd)
            torch.serialization.clear_safe_globals()
            torch.serialization.add_safe_globals(SAFE)
            print(json.dumps({"start": item["id"], "loader": name}), file=out, flush=True)
            signal.alarm(seconds)
            began = time.perf_counter()
            try:
                try:
                    obj = LOADERS[name](item["path"])
                    del obj
                    errors[name] = None
                finally:
                    signal.alarm(0)
            except BaseException as exc:
                errors[name] = type(exc).__name__
            spent[name] = round(time.perf_counter() - began, 4)
            if os.path.lexists(item["sentinel"]):
                fired.append(name)
                _gone(item["sentinel"])
        print(json.dumps({"id": item["id"], "fired": fired, "errors": errors, "seconds": spent}),
              file=out,
              flush=True)
"""


#: The folder the parent imports ptfile from: the child imports the same one.
_PTFILE_ROOT = str(Path(ptfile.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class Job:
    """One file for the oracle: where it is, where its payload would put its sentinel."""

    id: str
    path: Path
    sentinel: Path
    loaders: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    """What the loaders did with one file: which created the sentinel; each one's error."""

    id: str
    fired: tuple[str, ...]
    errors: dict[str, str | None]
    seconds: dict[str, float]
    crashed: str | None = None


def sandbox(root: Path) -> tuple[Path, Path]:
    """Make the sandbox under ``root``: returns (folder for files, folder for sentinels)."""
    for sub in ("files", "sentinels", "cwd", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root / "files", root / "sentinels"


def run_loaders(root: Path, jobs: Sequence[Job], *, batch_seconds: int = 1800,
                loader_seconds: int = LOADER_SECONDS) -> list[Outcome]:
    """Run every job's loaders in sandboxed children (restarted after a crash), in order."""
    root = root.resolve()
    manifest, results = root / "manifest.jsonl", root / "results.jsonl"
    done: dict[str, Outcome] = {}
    pending = list(jobs)
    while pending:
        manifest.write_text("".join(json.dumps({
            "id": j.id, "path": str(j.path), "sentinel": str(j.sentinel),
            "loaders": list(j.loaders)}) + "\n" for j in pending))
        results.write_text("")
        env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(root / "tmp"), "HOME": str(root / "cwd"),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LC_ALL": "C.UTF-8",
               "TORCHINDUCTOR_CACHE_DIR": str(root / "tmp")}
        with open(root / "child.stderr", "ab") as err:
            try:
                subprocess.run(
                    [sys.executable, "-I", "-c", _CHILD, str(root), str(manifest), str(results),
                     str(MEMORY_BYTES), str(batch_seconds), str(loader_seconds), _PTFILE_ROOT],
                    cwd=root / "cwd", env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=err, timeout=batch_seconds + 60,
                    check=False)
            except subprocess.TimeoutExpired:
                pass
        started: tuple[str, str] | None = None
        for line in results.read_text().splitlines():
            row = json.loads(line)
            if "start" in row:
                started = (row["start"], row["loader"])
            else:
                done[row["id"]] = Outcome(row["id"], tuple(row["fired"]), row["errors"],
                                          row["seconds"])
                started = None
        remaining = [j for j in pending if j.id not in done]
        if remaining and started is None and remaining == pending:
            raise RuntimeError(f"the oracle child did not start: {(root / 'child.stderr')}"
                               f"\n{(root / 'child.stderr').read_text()[-3000:]}")
        if remaining:  # the child died on the file it had started: record it, go on after it
            victim = remaining[0]
            loader = started[1] if started and started[0] == victim.id else "?"
            fired = (loader,) if victim.sentinel.exists() else ()
            done[victim.id] = Outcome(victim.id, fired, {}, {}, crashed=loader)
            for leftover in (victim.sentinel,):
                if leftover.is_dir():
                    leftover.rmdir()
                elif leftover.exists():
                    leftover.unlink()
            remaining = remaining[1:]
        pending = remaining
    return [done[j.id] for j in jobs]
