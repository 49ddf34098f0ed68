"""DeepSpeed's own checkpoint classes, read as inert data (``../shared/spec/deepspeed-zero.md`` §3).

The optimizer files of a ZeRO checkpoint (``*_optim_states.pt``) pickle a few DeepSpeed
objects beside their tensors; ``torch.load(weights_only=True)`` refuses them, which is
why DeepSpeed loads with ``weights_only=False``.  ptfile resolves exactly these names
(:func:`ptfile.formats.policies.deepspeed`), never importing DeepSpeed:

==============================================================  ==============================
global                                                          becomes
==============================================================  ==============================
``deepspeed.runtime.zero.config.ZeroStageEnum`` (called with    the int 0 to 3
its value)
``deepspeed.runtime.fp16.loss_scaler.LossScaler``,              a :class:`Record` made for the
``DynamicLossScaler``,                                          load (``NEWOBJ`` then at most
``deepspeed.utils.tensor_fragment.fragment_address``            one ``BUILD`` of a dict)
==============================================================  ==============================

Every other name goes to the base policy (torch's weights-only allowlist: the tensors,
``torch.Size``, the dtype of a ``DynamicLossScaler``).
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import FormatError, brief

__all__ = ["DEEPSPEED_CLASSES", "ZERO_STAGE", "Record", "built", "zero_stage"]

#: (module, name) of every DeepSpeed class a ZeRO checkpoint pickles with ``NEWOBJ``.
DEEPSPEED_CLASSES: Final = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)
#: The enum of ZeRO stages, pickled as ``REDUCE(cls, (value,))``.
ZERO_STAGE: Final = ("deepspeed.runtime.zero.config", "ZeroStageEnum")


class Record:
    """What ``NEWOBJ`` of a DeepSpeed class makes: its name and its one ``BUILD`` state.

    Examples
    --------
    >>> cls = type("LossScaler", (Record,), {"__slots__": (), "name": "LossScaler"})
    >>> r = cls.__new__(cls)
    >>> r.__setstate__({"cur_scale": 1.0})
    >>> r
    LossScaler({'cur_scale': 1.0})
    """

    __slots__ = ("state",)
    name: str = ""
    state: Any  # unset until BUILD

    def __setstate__(self, state: Any) -> None:
        if built(self) is not None:
            raise FormatError(f"{self.name} is built twice")
        if not isinstance(state, dict):
            raise FormatError(f"{self.name} is built from {brief(state, 80)}, not a dict")
        self.state = state

    def __repr__(self) -> str:
        return f"{self.name}({brief(built(self) or {}, 200)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and built(other) == built(self)

    __hash__ = None  # type: ignore[assignment]


def built(record: Record) -> Any:
    """The BUILD state of ``record``; None when it had none."""
    return getattr(record, "state", None)


def zero_stage(value: Any) -> int:
    """``ZeroStageEnum(value)``: the stage, an int from 0 to 3.

    Raises
    ------
    FormatError
        Any other value.
    """
    if type(value) is not int or not 0 <= value <= 3:
        raise FormatError(f"ZeroStageEnum has no value {brief(value, 80)}")
    return value


def record_classes() -> dict[tuple[str, str], type[Record]]:
    """One fresh :class:`Record` subclass per DeepSpeed class, for one load."""
    return {key: type(key[1], (Record,), {"__slots__": (), "name": key[1]})
            for key in DEEPSPEED_CLASSES}
