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

**Speed.** Many aten ops' meta kernels are Python decompositions (``torch._refs``), about half
a millisecond each, and a transformer repeats the same op on the same shapes once per layer.
Ops that neither mutate nor alias their inputs and return only new tensors are therefore
memoised on their arguments' metadata (shape, stride, dtype, offset) and plain values: a
repeat gets fresh ``empty_strided`` outputs of the recorded metadata, which is all a meta
kernel produces. A result whose storage size differs from what ``empty_strided`` would make is
never memoised, so the storages the tracker sees are the ones the real kernel would have made.
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


def _describe(out: Any) -> tuple[_Desc, ...] | None:
    """The metadata to remake ``out`` from, or None when ``empty_strided`` would not make the
    same storage (an offset, a larger buffer) or ``out`` is not all meta tensors."""
    outs = out if isinstance(out, tuple | list) else (out,)
    descs: list[_Desc] = []
    for t in outs:
        if not isinstance(t, torch.Tensor) or t.device.type != "meta" or t.storage_offset():
            return None
        size, stride = tuple(t.shape), t.stride()
        need = t.element_size() * (
            1 + sum((n - 1) * st for n, st in zip(size, stride, strict=True)) if all(size) else 0
        )
        if t.untyped_storage().nbytes() != need:
            return None
        descs.append((size, stride, t.dtype))
    return tuple(descs)


def _shares_storage(out: Any, args: tuple[Any, ...]) -> bool:
    ins = {t.untyped_storage()._cdata for t in _tensors(args) if t.device.type == "meta"}
    outs = _tensors(out if isinstance(out, tuple | list) else (out,))
    return any(t.untyped_storage()._cdata in ins for t in outs)


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


_Desc = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)


def _pure(func: Any) -> bool:
    """True for ops that return only new tensors: no mutation, no alias, no non-tensor."""
    schema = getattr(func, "_schema", None)
    if schema is None or schema.is_mutable or not schema.returns:
        return False
    return all(r.alias_info is None and str(r.type) == "Tensor" for r in schema.returns)


def _arg_key(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type != "meta":
            raise TypeError
        return (tuple(x.shape), x.stride(), x.dtype, x.storage_offset())
    if isinstance(x, _PLAIN):
        return x
    if isinstance(x, tuple | list):
        return tuple(_arg_key(y) for y in x)
    raise TypeError


class StorageTracker(TorchDispatchMode):
    """Records ``(op, handle, nbytes)`` events for meta storages; see the module docstring."""

    def __init__(self, memoise: bool = True) -> None:
        super().__init__()
        self.memoise = memoise
        self.events: list[tuple[int, int, int]] = []
        self.alloc_phase: dict[int, str] = {}
        self.alloc_bytes: dict[int, int] = {}
        self.label: dict[int, str] = {}
        self.phase = "init"
        self.costs: dict[str, OpCost] = {"gemm": OpCost(), "attention": OpCost(), "other": OpCost()}
        self._memo: dict[Any, tuple[_Desc, ...] | None] = {}
        self._pure: dict[Any, bool] = {}
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
        out = self._call(func, args, kwargs)
        outs = _tensors(out if isinstance(out, tuple | list) else (out,))
        for t in outs:
            self.track(t)
        self._count(func, args, outs)
        return out

    def _call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        pure = self._pure.get(func) if self.memoise else False
        if pure is None:
            pure = self._pure[func] = _pure(func)
        if not pure:
            return func(*args, **kwargs)
        try:
            key = (func, _arg_key(args), _arg_key(tuple(sorted(kwargs.items()))))
        except TypeError:
            return func(*args, **kwargs)
        if key in self._memo:
            descs = self._memo[key]
            if descs is not None:
                made = [
                    torch.empty_strided(sz, st, dtype=dt, device="meta") for sz, st, dt in descs
                ]
                return made[0] if len(made) == 1 else tuple(made)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        descs = _describe(out)
        if descs is not None and _shares_storage(out, args):
            # an alias the schema does not declare (``_unsafe_view``): never memoise the op
            self._pure[func] = False
            descs = None
        self._memo[key] = descs
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
