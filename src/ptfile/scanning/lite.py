"""The lite interpreter's program: ``bytecode.pkl`` judged by what it would call.

``torch.jit.mobile._load_for_lite_interpreter`` (``_save_for_lite_interpreter``
writes its files; :mod:`ptfile.scanning.loaders.zipfamily` lists what it reads) never
compiles ``code/``: it runs ``bytecode.pkl``, a pickle of tuples (torch 2.13 writes
bytecode version 8)::

    (8, ("__torch__.M.forward",
         (("instructions", (("STOREN", 1, 2), ("OP", 0, 0), ...)),
          ("operators", (("aten::linear", "", 3), ...)),
          ("constants", (...)), ("types", ("Tuple[Tensor, bool]", ...)),
          ("register_size", 3)),
         (("arguments", ...), ("returns", ...))), ...)

An ``OP`` instruction calls an entry of the operator table, which the loader resolves
among every operator torch has registered: ``aten::save`` writes any value to any path
(a ``__setstate__`` that calls it runs while loading: observed in torch 2.13).  Types
name ``__torch__.torch.classes.<ns>.<Class>`` custom classes, native code.  So the
program is judged by its names, as :func:`ptfile.scanning.torchscript.judge_code`
judges source: every text constant of the pickle that reads as an operator name
(``<ns>::<op>``, the form the loader resolves) is judged as ``ops.<ns>.<op>``, and every
custom class named anywhere in a text as that class: :data:`~.torchscript.DANGEROUS_OPS`,
a namespace outside :data:`~.torchscript.STANDARD_OP_NAMESPACES` or
:data:`~.torchscript.STANDARD_CLASS_NAMESPACES` is ``dangerous``.  Every text is
judged, not only the operator table's: a table built through the memo, or a
version whose layout ptfile does not know, is judged alike.  (A string constant such
as ``"aten::save"`` that the program only prints is judged too: the verdict errs on
danger.)  The pickle's globals are the scanner's, as in any record.
"""

from __future__ import annotations

import re
from typing import Final

from ..errors import PtfileError
from ..limits import Limits
from ..picklevm.decoder import genops
from .torchscript import judge_name
from .verdicts import Verdict

__all__ = ["judge_bytecode"]

#: An operator name as the lite interpreter resolves it (``c10::OperatorName``).
_OPERATOR: Final = re.compile(r"([A-Za-z_]\w*)::(\w+)(?:\.\w*)?")
#: A custom class named in a type string.
_CUSTOM_CLASS: Final = re.compile(r"__torch__\.torch\.classes(?:\.\w+)*")


def _names(text: str) -> list[str]:
    """The dotted names ``text`` stands for, as :func:`judge_name` takes them."""
    found = _OPERATOR.fullmatch(text)
    names = [f"ops.{found[1]}.{found[2]}"] if found else []
    return names + _CUSTOM_CLASS.findall(text)


def judge_bytecode(data: bytes, limits: Limits) -> tuple[Verdict, str]:
    """The verdict and message of one ``bytecode.pkl`` (rules: the module doc).

    Examples
    --------
    >>> import pickle
    >>> from ptfile.limits import DEFAULT_LIMITS
    >>> ok = pickle.dumps((8, ("f", (("operators", (("aten::add", "Tensor", 2),)),))))
    >>> judge_bytecode(ok, DEFAULT_LIMITS)[0]
    <Verdict.ALLOWED: 'allowed'>
    >>> bad = pickle.dumps((8, ("f", (("operators", (("aten::save", "", 2),)),))))
    >>> judge_bytecode(bad, DEFAULT_LIMITS)
    (<Verdict.DANGEROUS: 'dangerous'>, 'the lite interpreter program calls aten::save')
    """
    texts: dict[str, None] = {}
    try:
        for op in genops(data, limits=limits):
            arg = op.arg
            if isinstance(arg, bytes):
                arg = arg.decode("latin-1")
            if isinstance(arg, str) and ("::" in arg or "classes" in arg):
                texts[arg] = None
    except PtfileError:
        pass  # the texts before the damage are judged; the stream's scan reports it
    dangerous: dict[str, None] = {}
    operators = 0
    for text in texts:
        for name in _names(text):
            operators += name.startswith("ops.")
            if judge_name(name) is not Verdict.ALLOWED:
                dangerous[text if name.startswith("ops.") else name] = None
    if dangerous:
        return Verdict.DANGEROUS, ("the lite interpreter program calls "
                                   f"{', '.join(dangerous)[:300]}")
    return Verdict.ALLOWED, (f"the lite interpreter program ({operators} operators): "
                             "only standard operators and classes")
