"""Reports cannot be forged: every name from a file reaches a terminal inert.

A file's author picks its globals' names, its tensors' names, its records' names; a
terminal obeys what it prints.  Each test writes such names with real torch (or as the
raw pickle a hostile author writes), runs the installed ``ptfile`` with its stdout on a
pseudo-terminal (``os.openpty``), and checks that no control, escape, bidi or separator
character reaches it as such, that what was found (the DANGEROUS line, the exit code)
survives, and that JSON and SARIF keep the names exact.
"""

from __future__ import annotations

import io
import json
import subprocess
import unicodedata
import zipfile
from pathlib import Path

import pytest
import torch

from ptfile.cli.text import inert, shown
from terminal import PTFILE, on_terminal

#: Cursor up, erase the line, back to its start: what erases a DANGEROUS line above it.
ERASE = "\x1b[1A\x1b[2K\r"
#: The Unicode categories no output may write as they are.
HIDDEN = ("Cc", "Cf", "Zl", "Zp")


def forged_global(path: Path) -> str:
    """A pickle calling ``os.system`` under a name that, printed raw, erases the line
    naming it and writes a fake clean verdict over it; returns that name."""
    name = f"system{ERASE}{path.name}: clean (pickle; 1 reference, all allowed)\u202e"
    raw = name.encode()
    path.write_bytes(b"\x80\x04\x8c\x02os\x8c" + bytes([len(raw)]) + raw + b"\x93)R.")
    return name


def hidden_in(text: str) -> list[str]:
    """The characters of ``text`` a terminal would obey rather than show (newlines and
    tabs of ptfile's own layout aside)."""
    return [c for c in text if unicodedata.category(c) in HIDDEN and c not in "\n"]


def test_shown_escapes_every_hidden_character() -> None:
    for code in range(0x110000):
        c = chr(code)
        if unicodedata.category(c) not in (*HIDDEN, "Cs") and c != "\\":
            continue
        for text in (shown(f"a{c}b"), inert(f"a{c}b")):
            assert c == "\\" or c not in text, hex(code)
            assert text.isascii() or not hidden_in(text), hex(code)


def test_a_forged_global_cannot_erase_the_dangerous_line(tmp_path: Path) -> None:
    path = tmp_path / "m.pkl"
    name = forged_global(path)
    code, text, err = on_terminal("scan", path)
    assert code == 1 and err == ""
    assert not hidden_in(text)
    lines = text.splitlines()
    assert lines[0] == f"{path}: DANGEROUS (pickle; 1 dangerous)"
    assert lines[1].startswith(f"  dangerous global: {shown('os.' + name)} at stream")
    # Through a pipe, JSON keeps the name exact.
    done = subprocess.run([PTFILE, "scan", "--json", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert json.loads(done.stdout)["findings"][0]["name"] == name
    sarif = subprocess.run([PTFILE, "scan", "--format", "sarif", str(path)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert json.loads(sarif.stdout)["runs"][0]["results"][0]["properties"]["global"] == \
        f"os.{name}"


def test_a_forged_global_in_a_folder_table(tmp_path: Path) -> None:
    forged_global(tmp_path / "m.pkl")
    torch.save({"w": torch.ones(2)}, tmp_path / "clean.pt")
    code, text, err = on_terminal("scan", ".", cwd=tmp_path)
    assert code == 1 and err == "" and not hidden_in(text)
    rows = dict(line.split()[:2] for line in text.split("\n\n")[0].splitlines()[1:])
    assert rows == {"clean.pt": "allowed", "m.pkl": "dangerous"}
    assert "\nm.pkl: dangerous\n  dangerous global: 'os.system\\x1b[1A" in text


@pytest.fixture
def named(tmp_path: Path) -> tuple[Path, str]:
    """A torch checkpoint whose first tensor's name and archive folder hide escapes."""
    name = f"w{ERASE}\u202eok\u2028"
    path = tmp_path / "names.pt"
    torch.save({name: torch.ones(2), "b": torch.zeros(3), "step": f"7{ERASE}"}, path)
    return path, name


def test_inspect_shows_tensor_names_and_values_inert(named: tuple[Path, str]) -> None:
    path, name = named
    code, text, err = on_terminal("inspect", path)
    assert code == 0 and err == "" and not hidden_in(text)
    assert f"  {shown(name)}  " in text          # the tensors table
    assert f"── {shown(name)}: float32[2]" in text  # the object tree
    assert "step: str = '7\\x1b[1A" in text
    done = subprocess.run([PTFILE, "inspect", "--json", str(path)], capture_output=True,
                          text=True, timeout=120, check=True)
    assert name in [t["name"] for t in json.loads(done.stdout)["tensors"]]


def test_diff_and_convert_show_names_inert(named: tuple[Path, str], tmp_path: Path) -> None:
    path, name = named
    other = tmp_path / "other.pt"
    torch.save({"b": torch.zeros(3), "step": "8"}, other)
    code, text, err = on_terminal("diff", path, other)
    assert code == 1 and err == "" and not hidden_in(text)
    assert f"- {shown(name)}\n" in text and "~ step: '7\\x1b[1A" in text
    code, text, err = on_terminal("convert", path, tmp_path / "out.safetensors",
                                  "--no-progress")
    assert code == 0 and err == "" and not hidden_in(text)
    assert "step" in text  # the value it could not keep as a tensor, described


def test_verify_shows_record_names_inert(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    with zipfile.ZipFile(buffer, "a") as archive:
        archive.writestr(f"archive/extra{ERASE}", b"hello")
    raw = bytearray(buffer.getvalue())
    raw[raw.find(b"hello")] = ord("j")  # the CRC no longer matches
    path = tmp_path / "damaged.pt"
    path.write_bytes(bytes(raw))
    code, text, err = on_terminal("verify", path)
    assert code == 1 and err == "" and not hidden_in(text)
    assert f"  error: {shown(f'archive/extra{ERASE}')}: CRC-32 mismatch" in text


def test_errors_on_stderr_are_inert(tmp_path: Path) -> None:
    source = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2)}, source)
    forged = tmp_path / "m.pkl"
    name = forged_global(forged)
    buffer = io.BytesIO()
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(buffer, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            out.writestr(info, forged.read_bytes() if info.filename.endswith("data.pkl")
                         else data)
    path = tmp_path / "refused.pt"
    path.write_bytes(buffer.getvalue())
    code, text, err = on_terminal("inspect", path)
    assert code == 2 and text == ""
    assert err.startswith("ptfile inspect: error: ") and not hidden_in(err.rstrip("\n"))
    assert inert(f"os.{name}") in err
