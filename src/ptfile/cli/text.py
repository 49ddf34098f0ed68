"""How the command line writes text: names from files shown safely, sizes, tables, a scan's
findings.

A name read from a file or a folder (a path, a global's module and name, a record, an
error message quoting one) is the file author's choice, and a terminal obeys what it
prints: an escape sequence can recolour, retitle or erase what came before it, a
carriage return or a bidi override can make ``evil.pt`` read as ``model.pt``.  So every
such name goes through :func:`shown` before it is written: a name made of printable
characters (``str.isprintable``: no control, format or separator character but the
space) and no backslash is written as it is; any other is written as its ``repr``, quoted
and escaped (``'ev\\x1b[31mil.pt'``), so that what is shown is unambiguous and inert.
``str.isprintable`` is false for every character of the Unicode categories Cc (controls:
ESC, carriage return, backspace), Cf (format: the bidi overrides and isolates U+202A to U+202E and
U+2066 to U+2069, zero-width joiners), Zl and Zp (line and paragraph separators), Zs but the space,
Cs, Co and Cn, and ``repr`` writes each of them as an escape (``\\u202e``).  A sentence of
ptfile's own that quotes names (an error message, a line of an exported program's
signature) goes through :func:`inert` instead: the same characters escaped in place, the
sentence unquoted.  JSON and SARIF output need none of this: JSON escapes control
characters itself, and a name is kept exact there.
"""

from __future__ import annotations

from typing import Any, TextIO

__all__ = ["finding_line", "global_name", "inert", "shown", "size", "table", "tally"]


def shown(name: object) -> str:
    """``name`` as text that is safe to write to a terminal: as it is when every character
    is printable and none is a backslash, else its ``repr``.

    Examples
    --------
    >>> shown("models/model.pt"), shown("ev\\x1b[31mil.pt"), shown("a\\u202eb")
    ('models/model.pt', "'ev\\\\x1b[31mil.pt'", "'a\\\\u202eb'")
    """
    text = str(name)
    return text if text.isprintable() and "\\" not in text else repr(text)


def inert(text: object) -> str:
    """``text`` with each character that is not printable written as its escape, in place:
    for sentences of ptfile's own that quote names (the quotes stay readable; a backslash
    is kept, so use :func:`shown` for a name on its own).

    Examples
    --------
    >>> inert("refused evil\\x1b[2K\\rmodel: clean"), inert("fine: a.b")
    ('refused evil\\\\x1b[2K\\\\rmodel: clean', 'fine: a.b')
    """
    text = str(text)
    return text if text.isprintable() else \
        "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def size(n: float) -> str:
    """A byte count in B, KiB, MiB, GiB or TiB.

    Examples
    --------
    >>> size(100), size(10752)
    ('100 B', '10.5 KiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def table(rows: list[list[str]], out: TextIO, indent: str = "  ") -> None:
    """Write ``rows`` as columns padded to their widest cell (the cells are already text
    safe to show)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        out.write(indent + "  ".join(cells).rstrip() + "\n")


def tally(findings: list[dict[str, Any]]) -> str:
    """How many findings of each verdict: ``3 references, all allowed`` for a clean file,
    ``1 dangerous, 2 allowed`` otherwise.

    Examples
    --------
    >>> tally([{"verdict": "allowed"}]), tally([{"verdict": "unknown"}, {"verdict": "allowed"}])
    ('1 reference, all allowed', '1 unknown, 1 allowed')
    """
    counts = {v: sum(1 for f in findings if f.get("verdict") == v)
              for v in ("dangerous", "unknown", "allowed")}
    if not counts["dangerous"] and not counts["unknown"]:
        n = counts["allowed"]
        return "nothing referenced" if not n else \
            f"{n} reference{'s' if n != 1 else ''}, all allowed"
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n)


def global_name(finding: dict[str, Any]) -> str:
    """The global a finding names (``posix.system``), shown safely; ``-`` for none."""
    return shown(".".join(str(x) for x in (finding.get("module"), finding.get("name")) if x)) \
        if finding.get("module") or finding.get("name") else "-"


def finding_line(finding: dict[str, Any]) -> str:
    """One finding of a scan as a line: verdict, kind, the global, where, and its message
    when it says more than the name.

    Examples
    --------
    >>> finding_line({"verdict": "dangerous", "kind": "global", "module": "posix",
    ...               "name": "system", "location": "stream", "message": "imports posix.system"})
    'dangerous global: posix.system at stream'
    """
    name = global_name(finding)
    where, message = finding.get("location", ""), str(finding.get("message") or "")
    note = "" if not message or (name != "-" and message.endswith(name)) else \
        f" — {shown(message)}"
    return (f"{finding.get('verdict', '?'):9} {shown(finding.get('kind', ''))}: {name} at "
            f"{shown(where) if where else 'file'}{note}")
