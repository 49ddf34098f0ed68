# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0"]
# ///
"""Writes ``tiny_export.pt2``: the ``.pt2`` example of docs/formats.md, read there without torch.

An exported program with a parameter pair, a buffer, a lifted tensor constant, a dynamic
batch size (``torch.export.Dim``), a keyword constant and a tuple-with-dict output.  Run
from this folder: ``python make_tiny_export.py``.
"""

from __future__ import annotations

import torch


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("steps", torch.tensor(7))
        self.offset = torch.tensor([0.5, -0.5])  # a tensor constant

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, dict]:
        y = self.lin(x) * scale + self.offset
        return y, {"total": y.sum() + self.steps}


if __name__ == "__main__":
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(Tiny(), (torch.randn(4, 3),), {"scale": 2.0},
                                  dynamic_shapes={"x": {0: batch}, "scale": None})
    torch.export.save(program, "tiny_export.pt2")
