"""What ``ptfile inspect`` prints of one checkpoint on a terminal: its header, parts,
tensors, object tree, records, chunks and totals (every name from the file through
:func:`~.text.shown`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

from .text import inert, shown, size, table

if TYPE_CHECKING:  # imported by the commands that need them: --help needs no numpy
    from ..inspection import Inspection
    from ..reader import TensorInfo

__all__ = ["render_inspection"]


def tensor_row(t: TensorInfo, shared: set[str]) -> list[str]:
    offset = "-" if t.data_offset is None else \
        f"{t.data_offset + t.storage_offset * t.dtype.itemsize:#x}"
    flags = ("param " if t.is_parameter else "") + ("shared" if t.storage_key in shared else "")
    return [shown(t.name) if t.name else "(root)", t.dtype.name, str(list(t.shape)), str(t.stride),
            shown(t.storage_key), offset, size(t.nbytes), flags.strip()]


def tree_lines(node: Any, by_name: dict[str, TensorInfo], prefix: str, limit: int,
               out: list[str]) -> None:
    items = node.get("items", {})
    pairs = list(items.items()) if isinstance(items, dict) else list(enumerate(items))
    kept = pairs if not limit else pairs[:limit]
    for i, (key, child) in enumerate(kept):
        last = i == len(kept) - 1 and len(kept) == len(pairs)
        out.append(f"{prefix}{'└── ' if last else '├── '}{shown(key)}: "
                   f"{node_label(child, by_name)}")
        if "items" in child:
            tree_lines(child, by_name, prefix + ("    " if last else "│   "), limit, out)
    if len(kept) < len(pairs):
        out.append(f"{prefix}└── … {len(pairs) - len(kept)} more (--limit 0 shows all)")


def node_label(node: Any, by_name: dict[str, TensorInfo]) -> str:
    if "tensor" in node:
        t = by_name.get(node["tensor"])
        if t is None:
            return "tensor"
        kind = "Parameter " if t.is_parameter else ""
        return f"{kind}{t.dtype.name}{list(t.shape)}"
    if "items" in node:
        return f"{shown(node['type'])} ({len(node['items'])})"
    return f"{shown(node['type'])} = {inert(repr(node.get('value', node.get('repr'))))}"[:100]


def render_header(ins: Inspection, out: TextIO) -> None:
    meta = ins.metadata
    kind = meta.get("format", ins.format) if ins.format in ("dcp", "set") else ins.format
    out.write(f"{shown(ins.path or '<stream>')}: {shown(kind)} checkpoint, {size(ins.file_size)}\n")
    keys = ("version", "byteorder", "storage_alignment", "format_version", "prefix", "stage",
            "world_size", "tag", "optimizer", "model_dtype", "ds_version")
    details = " · ".join(f"{k} {shown(meta[k])}" for k in keys if k in meta)
    if details:
        out.write(f"  {details}\n")
    if "serialization_id" in meta:
        out.write(f"  serialization_id {shown(meta['serialization_id'])}\n")


def render_totals(ins: Inspection, out: TextIO) -> None:
    totals = ins.totals
    out.write(f"\nTotals: {totals['tensors']:,} tensors · {totals['parameters']:,} parameters · "
              f"{totals['storages']:,} storages · {size(totals['storage_bytes'])}\n")
    rows = [[dtype, size(n)] for dtype, n in totals["bytes_by_dtype"].items()]
    if rows:
        table(rows, out, "    ")


def render_parts(ins: Inspection, out: TextIO) -> None:
    """A checkpoint set's parts: role, files, format, tensors and bytes of each."""
    rows = [["part", "format", "tensors", "bytes", "files"]]
    for part in ins.parts:
        totals = part["totals"]
        rows.append([shown(part["role"]), part["format"], f"{totals.get('tensors', 0):,}",
                     size(totals.get("storage_bytes", 0)),
                     ", ".join(shown(f) for f in part["files"])])
    out.write(f"\nParts ({len(ins.parts)})\n")
    table(rows, out)


def render_zero(zero: dict[str, Any], out: TextIO) -> None:
    """A ZeRO checkpoint's flat groups (the elements each rank saved) and special names."""
    rows = [["group", "params", "elements", "per rank"]]
    rows += [[str(g["index"]), str(len(g["params"])), f"{g['numel']:,}",
              " ".join(f"{n:,}" for n in g["rank_numels"])] for g in zero["groups"]]
    out.write(f"\nZeRO-{zero['stage']} flat groups ({len(zero['groups'])}, "
              f"{zero['world_size']} ranks)\n")
    table(rows, out)
    for label, names in (("buffers", zero["buffers"]), ("frozen", zero["frozen"]),
                         ("tied", [f"{a} -> {t}" for a, t in zero["tied"].items()])):
        if names:
            out.write(f"  {label}: {', '.join(shown(n) for n in names)}\n")


def render_inspection(ins: Inspection, out: TextIO, limit: int) -> None:
    render_header(ins, out)
    if ins.parts:
        render_parts(ins, out)
    if ins.zero:
        render_zero(ins.zero, out)
    if ins.program is not None:
        out.write("\n" + "".join(inert(line) + "\n" for line in ins.program.lines()))
    shared = set(ins.shared)
    tensors = ins.tensors if not limit else ins.tensors[:limit]
    out.write(f"\nTensors ({len(ins.tensors):,})\n")
    rows = [["name", "dtype", "shape", "stride", "storage", "offset", "bytes", ""]]
    table(rows + [tensor_row(t, shared) for t in tensors], out)
    if len(tensors) < len(ins.tensors):
        out.write(f"  … {len(ins.tensors) - len(tensors):,} more (--limit 0 shows all)\n")
    lines: list[str] = []
    tree_lines(ins.tree, {t.name: t for t in ins.tensors}, "  ", limit, lines)
    root = ins.tree
    out.write(f"\nObject tree: {node_label(root, {t.name: t for t in ins.tensors})}\n")
    out.write("".join(line + "\n" for line in lines))
    if ins.records:
        out.write(f"\nRecords ({len(ins.records):,})\n")
        records = ins.records if not limit else ins.records[:limit]
        rows = [["data offset", "size", "crc32", "name"]]
        rows += [[f"{r.data_offset:#x}", str(r.size), f"{r.crc32:08x}", shown(r.name)] for r in records]
        table(rows, out)
        if len(records) < len(ins.records):
            out.write(f"  … {len(ins.records) - len(records):,} more\n")
    if ins.chunks:
        render_chunks(ins.chunks, out, limit)
    render_totals(ins, out)
    if ins.shared:
        out.write("\nShared storages\n")
        out.writelines(f"  storage {shown(key)}: {', '.join(map(shown, names))}\n" for key, names in list(ins.shared.items())[: limit or None])


def render_chunks(chunks: dict[str, list[dict[str, Any]]], out: TextIO, limit: int) -> None:
    """A DCP checkpoint's chunks: where each tensor's pieces are stored."""
    rows = [[shown(name), str(c["offsets"]), str(c["sizes"]), shown(c["file"]), str(c["offset"]),
             str(c["length"]), " ".join(map(shown, c["transforms"]))]
            for name, found in chunks.items() for c in found]
    out.write(f"\nChunks ({len(rows):,})\n")
    table([["tensor", "offsets", "sizes", "file", "offset", "length", ""],
            *(rows if not limit else rows[:limit])], out)
    if limit and len(rows) > limit:
        out.write(f"  … {len(rows) - limit:,} more (--limit 0 shows all)\n")


