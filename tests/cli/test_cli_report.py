"""``ptfile scan|inspect|verify DIR`` for a person and for a script: a table on a terminal
(or with ``--format text``), JSON Lines through a pipe (or with ``--format jsonl``), the same
exit code either way, and names from the folder shown inert (no escape reaches the terminal).

The installed command runs with its stdout on a pseudo-terminal (``pty.openpty``) or a pipe.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bulk_corpus import EXPECTED, corpus, kind_of
from terminal import PTFILE, on_terminal

#: A file name a hostile folder may hold: an escape sequence that retitles the terminal, a
#: bell, a carriage return that would write the rest over the start of the line.
HOSTILE = "ev\x1b]0;owned\x07\ril-dangerous-pickle.pkl"
#: Characters no text output may hold as they are (after the tty's \r\n became \n).
RAW = ("\x1b", "\x07", "\r")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    files = corpus(8)  # one file of each kind
    files[f"d00/{HOSTILE}"] = files[next(n for n in files if kind_of(n) == "dangerous-pickle")]
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def on_tty(*args: str | Path) -> tuple[int, str]:
    """The command on a pseudo-terminal: its exit code and what it wrote (no stderr)."""
    code, text, err = on_terminal(*args)
    assert err == ""
    return code, text


def through_pipe(*args: str | Path) -> tuple[int, str]:
    done = subprocess.run([PTFILE, *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.stderr == ""
    return done.returncode, done.stdout


def json_lines(text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every line parsed: the file records and the closing summary."""
    docs = [json.loads(line) for line in text.splitlines()]
    assert docs and docs[-1]["summary"] is True
    assert not any(d.get("summary") for d in docs[:-1])
    return docs[:-1], docs[-1]


def table_rows(text: str) -> dict[str, str]:
    """The table's verdict per path as it is shown (up to the blank line after it)."""
    lines = text.split("\n\n", 1)[0].splitlines()
    assert lines[0].split() == ["path", "verdict", "reason"]
    rows = {}
    for line in lines[1:]:
        if line.startswith("'"):  # a repr: up to its closing quote
            end = line.index("'", 1) + 1
            path, rest = line[:end], line[end:]
        else:
            path, rest = line.split(" ", 1)
        rows[path] = rest.split()[0]
    return rows


def shown(path: str) -> str:
    return path if path.isprintable() else repr(path)


@pytest.mark.parametrize("command", ["scan", "verify"])
def test_a_folder_on_a_terminal_is_a_table_and_through_a_pipe_json_lines(
        folder: Path, command: str) -> None:
    code, text = on_tty(command, folder)
    piped, lines = through_pipe(command, folder)
    records, summary = json_lines(lines)
    assert code == piped == summary["exit_code"] != 0
    by_path = {r["path"]: r["verdict"] for r in records}
    assert {p: EXPECTED[command][kind_of(p)] for p in by_path} == by_path  # the pipe's records
    assert table_rows(text) == {shown(p): v for p, v in by_path.items()}  # the table's rows
    # Names are inert: the escape is shown as \x1b, never written as the byte.
    assert not any(c in text for c in RAW) and repr(str(folder / "d00" / HOSTILE)) in text
    totals = text.split("\n\n")[1]
    for verdict, n in summary["verdicts"].items():
        assert f"{n} {verdict}" in totals
    assert totals.endswith(f"exit {code}")
    # Then every file that needs attention, with its details.
    attention = text.split("\nNeeds attention (", 1)[1]
    flagged = [p for p, v in by_path.items() if v not in ("allowed", "ok")]
    assert attention.startswith(f"{len(flagged)})\n")
    for path in flagged:
        assert f"\n{shown(path)}: {by_path[path]}\n" in attention
    if command == "scan":
        assert "dangerous global: posix.system at stream" in attention


def test_format_overrides_the_terminal(folder: Path) -> None:
    code, text = on_tty("inspect", folder, "--format", "jsonl")
    records, summary = json_lines(text)
    assert code == summary["exit_code"] == 2 and len(records) == 9
    piped, table = through_pipe("inspect", folder, "--format", "text")
    assert piped == code and table.startswith("path ") and "Needs attention" in table
    assert set(table_rows(table)) == {shown(r["path"]) for r in records}
    # scan's --jsonl and --format jsonl are one thing; --format text on a terminal too
    assert json_lines(on_tty("scan", folder, "--jsonl")[1])[1]["exit_code"] == 1
    explicit, default = on_tty("scan", folder, "--format", "text"), on_tty("scan", folder)
    assert explicit[0] == default[0] == 1
    assert explicit[1].split("\n\n")[0] == default[1].split("\n\n")[0]  # the tables


def test_one_named_file_on_a_terminal_is_reported_as_before(folder: Path) -> None:
    name = folder / "d00" / HOSTILE
    code, text = on_tty("scan", name)
    assert code == 1 and not any(c in text for c in RAW)
    assert text.startswith(f"{shown(str(name))}: DANGEROUS (pickle; 1 dangerous)\n")


def test_help_says_what_each_output_is() -> None:
    for command in ("scan", "inspect", "verify", "convert"):
        _, text = through_pipe(command, "--help")
        flat = " ".join(text.split())
        assert "jsonl" in flat and "terminal" in flat, command
