"""Storage tracking below autograd: every tensor storage the traced program creates, and when
it dies, in program order.

A :class:`StorageTracker` is a ``TorchDispatchMode``: it sees every aten op, including those
autograd runs in backward and the optimizer's foreach kernels. Each new storage on the meta
device becomes an allocation event with its byte size and the phase label current at the time
(``forward``, ``backward``, ``optimizer``...); a weakref callback on the storage records the
free. Categories (weights, gradients, optimizer states, KV cache, logits) are decided after the
run, when it is known which storage ended up where (a ``.grad``, an optimizer state, the
cache), so the breakdown at the peak is exact rather than guessed at allocation time.

The same mode counts FLOPs and bytes moved per operator class (GEMM, attention, other) from
the ops' shapes, as a by-product.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCost", "StorageTracker"]

_aten = torch.ops.aten
_GEMM = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten.baddbmm.default,
}
_ATTN = {
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_backward.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_efficient_attention_backward.default,
}


@dataclass
class OpCost:
    """FLOPs and bytes touched (inputs + outputs) of one operator class."""

    flops: float = 0.0
    bytes: float = 0.0


def _tensors(items: Any) -> list[torch.Tensor]:
    """Tensors among ``items`` and one level of nested lists/tuples (aten's argument shapes);
    cheaper than a pytree flatten on every op."""
    out: list[torch.Tensor] = []
    for x in items:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, tuple | list):
            out.extend(y for y in x if isinstance(y, torch.Tensor))
    return out


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def _gemm_flops(func: Any, args: tuple[Any, ...], out: Any) -> float:
    if func in (_aten.mm.default, _aten.addmm.default):
        a, b = (args[0], args[1]) if func is _aten.mm.default else (args[1], args[2])
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    a, b = (args[0], args[1]) if func is _aten.bmm.default else (args[1], args[2])
    return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


def _attn_flops(func: Any, args: tuple[Any, ...]) -> float:
    # (b, h, s_q, d) x (b, h, s_k, d): QK^T and PV, causal halves neither on meta (upper bound)
    q, k = args[0], args[1]
    if func in (
        _aten._scaled_dot_product_flash_attention_backward.default,
        _aten._scaled_dot_product_efficient_attention_backward.default,
    ):
        q, k = args[1], args[2]
        mult = 2.5  # backward recomputes scores and takes four matmuls
    else:
        mult = 1.0
    b, h, sq, d = q.shape
    sk = k.shape[2]
    return mult * 4.0 * b * h * sq * sk * d


class StorageTracker(TorchDispatchMode):
    """Records ``(op, handle, nbytes)`` events for meta storages; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, int, int]] = []
        self.alloc_phase: dict[int, str] = {}
        self.alloc_bytes: dict[int, int] = {}
        self.label: dict[int, str] = {}
        self.phase = "init"
        self.costs: dict[str, OpCost] = {"gemm": OpCost(), "attention": OpCost(), "other": OpCost()}
        self._live: dict[int, int] = {}  # storage cdata -> handle
        self._refs: dict[int, Any] = {}
        self._next = 0

    # -- recording
    def _on_free(self, cdata: int, handle: int) -> None:
        if self._live.get(cdata) == handle:
            del self._live[cdata]
            self._refs.pop(handle, None)
            self.events.append((0, handle, self.alloc_bytes[handle]))

    def _finaliser(self, cdata: int, handle: int) -> Any:
        return lambda _ref: self._on_free(cdata, handle)

    def track(self, t: torch.Tensor, label: str | None = None) -> int | None:
        """Register ``t``'s storage if new (tensors made before the mode, too); label it."""
        if not isinstance(t, torch.Tensor) or t.device.type != "meta":
            return None
        st = t.untyped_storage()
        cdata = st._cdata
        handle = self._live.get(cdata)
        if handle is None:
            handle = self._next
            self._next += 1
            n = int(st.nbytes())
            self._live[cdata] = handle
            self.alloc_bytes[handle] = n
            self.alloc_phase[handle] = self.phase
            self.events.append((1, handle, n))
            self._refs[handle] = weakref.ref(st, self._finaliser(cdata, handle))
        if label is not None:
            self.label[handle] = label
        return handle

    def mark(self, t: torch.Tensor, label: str) -> None:
        """Label an already tracked tensor's storage (e.g. a parameter's ``.grad``)."""
        self.track(t, label)

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        old, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = old

    def live_bytes(self) -> int:
        return sum(self.alloc_bytes[h] for h in self._live.values())

    # -- the mode
    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = _tensors(out if isinstance(out, tuple | list) else (out,))
        for t in outs:
            self.track(t)
        self._count(func, args, outs)
        return out

    def _count(self, func: Any, args: tuple[Any, ...], outs: list[Any]) -> None:
        if func in _GEMM:
            cls, flops = "gemm", _gemm_flops(func, args, outs)
        elif func in _ATTN:
            cls, flops = "attention", _attn_flops(func, args)
        else:
            cls, flops = "other", 0.0
        moved = sum(_nbytes(t) for t in _tensors(args)) + sum(_nbytes(t) for t in outs)
        c = self.costs[cls]
        c.flops += flops
        c.bytes += moved
