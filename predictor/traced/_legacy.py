"""Memory behaviours of older torch releases that a job's ``torch_version`` asks for.

Before 1.11 softmax's autograd node saved its input (``self``) beside its output, although
the backward reads only the output: ``derivatives.yaml`` had ``_softmax_backward_data(grad,
result, dim, self)``. pytorch#65242 (fixing pytorch#64000) replaced ``self`` by its dtype; it
landed in October 2021, after the 1.10 branch (pytorch/xla#3150 followed the new signature on
2021-10-04), so 1.11 is the first release without it. The input saved is the one
``aten::_softmax`` received: an fp32 copy when autocast or ``dtype=`` upcast a 16-bit input
(CUDA's fp16-to-fp32 ``half_to_float`` path keeps the fp16 input itself).

The emulation runs torch's own softmax, then chains an identity node that saves that input
with ``save_for_backward``, so checkpointing's saved-tensor hooks drop and recompute it as
they would the real node's. ``log_softmax`` (inside ``cross_entropy``) is not emulated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["LegacySoftmax", "legacy_softmax"]


class _KeepInput(torch.autograd.Function):
    """Identity on the softmax output whose node keeps the softmax input alive."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(saved)
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


_SOFTMAX = {torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax}


class LegacySoftmax(TorchFunctionMode):
    """``softmax`` as torch < 1.11's autograd kept it. Entered before autocast's emulation, it
    sees the arguments autocast already cast, as ``aten::_softmax`` would."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        y = func(*args, **kwargs)
        if func not in _SOFTMAX or not (torch.is_grad_enabled() and y.requires_grad):
            return y
        x, dtype = args[0], kwargs.get("dtype")
        half_to_float = x.dtype == torch.float16 and dtype == torch.float32
        saved = x if y.dtype == x.dtype or half_to_float else x.to(y.dtype)
        return _KeepInput.apply(y, saved)


def legacy_softmax() -> LegacySoftmax:
    """The mode to trace a job whose torch keeps softmax's input (see the module docstring)."""
    return LegacySoftmax()
