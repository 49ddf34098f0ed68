"""ZipReader on fresh torch.save output: torch's computed storage offsets (spec §6)."""

from __future__ import annotations

import io

import pytest

from archive_helpers import torch_save_options
from ptfile._io.local import BytesSource
from ptfile.archive import ZipReader, computed_data_offset, computed_next_header_offset

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("alignment", [1, 2, 64, 100, 4096])
def test_reader_computed_offsets_equal_local_headers(alignment: int) -> None:
    tensors = [torch.full((i % 4,), float(i)) for i in range(40)]  # every fourth one empty
    out = io.BytesIO()
    with torch_save_options(alignment=alignment):
        torch.save(tensors, out)
    reader = ZipReader(BytesSource(out.getvalue()))
    prefix = reader.prefix
    first = reader.get(f"{prefix}/data/0")
    assert first is not None
    header, data = first.header_offset, reader.data_offset(first)
    for key in range(len(tensors)):
        name = f"{prefix}/data/{key}"
        record = reader.get(name)
        assert record is not None
        assert record.header_offset == header
        assert computed_data_offset(header, name, record.size, alignment) == data
        assert reader.data_offset(record) == data
        assert data % alignment == 0
        header = computed_next_header_offset(header, data, record.size)
        next_name = f"{prefix}/data/{key + 1}"
        if key + 1 < len(tensors):
            size = tensors[key + 1].nbytes
            data = computed_data_offset(header, next_name, size, alignment)
