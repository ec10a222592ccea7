"""FSDP1's flat parameters, where they change what a rank holds: accumulation under ``no_sync``.

Sharding is otherwise arithmetic (``_summary.py``). One program is traced with FSDP's own
parameter layout, because autograd, not arithmetic, decides what it allocates:

LitGPT's fine-tuning scripts (framework ``other``) accumulate gradients inside
``fabric.no_backward_sync(model, enabled=is_accumulating)`` (lit-gpt @8641822
``finetune/lora.py``; litgpt ``finetune/lora.py`` since), which Lightning's FSDP strategy turns
into ``FullyShardedDataParallel.no_sync()`` (``lightning/fabric/strategies/fsdp.py``
``_FSDPBackwardSyncControl`` @71aed751, the Lightning commit lit-gpt @8641822 pins). The same
strategy wraps each ``Block`` as one FSDP unit with ``use_orig_params=True`` (its default for
torch >= 2.0). Then, in torch's FSDP1:

* A unit's ``FlatParameter`` requires grad when *any* of its parameters does
  (``_flat_param.py`` ``_validate_tensors_to_flatten``: "For ``use_orig_params=True``, permit
  non-uniform ``requires_grad``"; pytorch/pytorch#91167: "As long as one original parameter
  requires_grad, the current solution is to have the entire FlatParameter require
  gradient"). A LoRA block's frozen weights are views of that flat parameter, so backward
  computes their gradients too, and ``split``'s backward concatenates the block's gradients
  into one unsharded flat gradient.
* Inside ``no_sync()`` the post-backward hook returns before the reduce-scatter
  (``_runtime_utils.py`` ``_post_backward_hook``: ``if not state._sync_gradients: ...
  return``), so each unit keeps that *unsharded* gradient, accumulating into it, until the
  micro-batch that syncs (pytorch/pytorch#90546: "``no_sync()`` introduces a separate case
  where a ``FlatParameter`` maintains an unsharded gradient").

So from the second micro-batch of a step every LoRA block holds its whole gradient, in the
parameter dtype, on every rank: the full blocks' size, whatever the number of GPUs. The
emulation gives each unit a flat parameter (one per dtype) and, before each forward of the
unit, sets its parameters as views of it, as FSDP's ``_use_unsharded_views`` does; both traced
micro-batches accumulate (category ``unsharded_gradients``, not divided by the data-parallel
degree), and the sync is emulated before the optimizer step: each flat gradient is replaced by
a sharded one (category ``gradients``), of which the trainable parameters' gradients are views.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..spec import DType, Framework, JobSpec, Task
from ._patches import QuantLinearStub

__all__ = [
    "ROOT",
    "UNSHARDED",
    "FlatUnits",
    "emulate_flat_units",
    "flat_units",
    "unshard_root",
    "uses_no_sync_accumulation",
]

#: Category of a unit's unsharded flat gradient (one per rank, not divided by DP).
UNSHARDED = "unsharded_gradients"
#: Category of the root unit's parameters while unsharded (sharded as 1 - 1/DP of them).
ROOT = "root_unsharded"
_ATTR = "_snugfit_flat_units"


def uses_no_sync_accumulation(spec: JobSpec) -> bool:
    """LitGPT under FSDP, accumulating: its loop runs ``no_sync()`` between optimizer steps."""
    quantised = spec.weight_dtype in (DType.NF4, DType.INT4, DType.FP4, DType.INT8, DType.FP8)
    return (
        spec.framework is Framework.OTHER
        and spec.task.is_training
        and spec.task is not Task.QLORA
        and not quantised
        and (spec.zero_stage or 0) >= 3
        and spec.data_parallel > 1
        and (spec.gradient_accumulation or 1) > 1
    )


@dataclass
class _Flat:
    """One ``FlatParameter``: its storage and where each original parameter's view goes."""

    param: torch.Tensor
    slots: list[tuple[list[tuple[Any, str]], tuple[int, ...], int]]
    trainable: list[tuple[torch.Tensor, int, int, tuple[int, ...]]] = field(default_factory=list)
    root: bool = False

    def set_views(self, *_: Any) -> None:
        views = torch.split(self.param, [n for _, _, n in self.slots])
        for (owners, shape, _n), v in zip(self.slots, views, strict=True):
            for mod, name in owners:
                setattr(mod, name, v.view(shape))


def _flatten(params: list[tuple[Any, str, torch.Tensor]]) -> list[_Flat]:
    """Replace ``params`` (module, name, parameter) by flat parameters, one per dtype."""
    by_id: dict[int, tuple[list[tuple[Any, str]], torch.Tensor]] = {}
    for mod, name, p in params:
        by_id.setdefault(id(p), ([], p))[0].append((mod, name))
    flats: list[_Flat] = []
    for dtype in dict.fromkeys(p.dtype for _, p in by_id.values()):
        group = [(owners, p) for owners, p in by_id.values() if p.dtype == dtype]
        total = sum(p.numel() for _, p in group)
        grad = any(p.requires_grad for _, p in group)
        flat = torch.empty(total, dtype=dtype, device="meta").requires_grad_(grad)
        slots: list[tuple[list[tuple[Any, str]], tuple[int, ...], int]] = []
        trainable: list[tuple[torch.Tensor, int, int, tuple[int, ...]]] = []
        offset = 0
        for owners, p in group:
            slots.append((owners, tuple(p.shape), p.numel()))
            if p.requires_grad:
                # what the optimizer sees: the original parameter, a view of the flat storage
                leaf = torch.nn.Parameter(flat.detach()[offset : offset + p.numel()].view(p.shape))
                trainable.append((leaf, offset, p.numel(), tuple(p.shape)))
            offset += p.numel()
            for mod, name in owners:
                del mod._parameters[name]
        f = _Flat(flat, slots, trainable)
        f.set_views()
        flats.append(f)
    return flats


def _layers(decoder: Any, n_layers: int) -> Any:
    for child in decoder.modules():
        if isinstance(child, torch.nn.ModuleList) and len(child) == n_layers:
            return child
    raise ValueError("no decoder layer list found")


@dataclass
class FlatUnits:
    """The emulated FSDP units of one model (blocks, and the root where it trains)."""

    flats: list[_Flat]

    @property
    def trainable(self) -> list[torch.Tensor]:
        return [leaf for f in self.flats for leaf, *_ in f.trainable]

    @property
    def n_params(self) -> int:
        return sum(f.param.numel() for f in self.flats)

    def mark_grads(self, tr: Any) -> None:
        for f in self.flats:
            if f.param.grad is not None:
                tr.mark(f.param.grad, UNSHARDED)

    def sync(self, tr: Any) -> None:
        """The syncing micro-batch's reduce-scatter: unsharded → sharded gradient per unit,
        the trainable parameters' ``.grad`` views of it (``_use_sharded_grad_views``)."""
        for f in self.flats:
            g = f.param.grad
            if g is None:
                continue
            sharded = torch.empty_like(g)
            tr.mark(sharded, "gradients")
            f.param.grad = None
            del g
            for leaf, offset, n, shape in f.trainable:
                leaf.grad = sharded[offset : offset + n].view(shape)

    def zero_grad(self) -> None:
        for f in self.flats:
            f.param.grad = None
            for leaf, *_ in f.trainable:
                leaf.grad = None


def emulate_flat_units(model: Any, n_layers: int) -> FlatUnits:
    """Give each decoder layer (LitGPT's ``Block``, the auto-wrap unit) a flat parameter, and
    the root one too if any of its parameters trains; attach them to ``model``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    layers = _layers(decoder, n_layers)
    flats: list[_Flat] = []
    in_layer: set[int] = set()
    for layer in layers:
        params = [
            (m, n, p) for m in layer.modules() for n, p in m._parameters.items() if p is not None
        ]
        in_layer.update(id(p) for _, _, p in params)
        unit = _flatten(params)
        for f in unit:
            layer.register_forward_pre_hook(f.set_views)
        flats += unit
    root = [
        (m, n, p)
        for m in base.modules()
        for n, p in m._parameters.items()
        if p is not None and id(p) not in in_layer
    ]
    if any(p.requires_grad for _, _, p in root):
        # The root unit is unsharded from its forward through backward (never resharded
        # after forward): set its views once per forward of the decoder, which runs first.
        for f in (unit := _flatten(root)):
            f.root = True
            decoder.register_forward_pre_hook(f.set_views)
        flats += unit
    units = FlatUnits(flats)
    setattr(model, _ATTR, units)
    return units


def flat_units(model: Any) -> FlatUnits | None:
    """The emulated FSDP units of ``model``, if it has them."""
    return getattr(model, _ATTR, None)


def _root_bytes(model: Any, n_layers: int) -> int:
    """Bytes of the parameters outside the decoder layers (embeddings, final norm, head):
    the root FSDP unit under every auto-wrap policy that wraps the decoder layers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    in_layer = {id(p) for p in _layers(base.get_decoder(), n_layers).parameters()}
    units = flat_units(model)
    total = sum(f.param.nbytes for f in units.flats if f.root) if units else 0
    for p in base.parameters():
        if id(p) not in in_layer and not getattr(p, QuantLinearStub.SHAPE_ONLY, False):
            total += p.nbytes
    return total


def unshard_root(model: Any, spec: JobSpec, tr: Any) -> torch.Tensor | None:
    """The root unit's unsharded parameters, for one micro-batch's forward and backward.

    FSDP never reshards the root after its forward (torch ``_runtime_utils.py``
    ``_post_forward_reshard``: "Do not free the root's parameters in the post-forward for
    ``FULL_SHARD`` with the intention that they are immediately used for backward
    computation", unchanged from torch 2.0 to today; FSDP2 likewise, ``_fully_shard/
    _fsdp_state.py`` ``_lazy_init``: "For the root, do not reshard after forward"); it is
    resharded only by the catch-all at the end of backward.
    So from the root's forward to the end of backward a rank holds the whole root (embeddings,
    final norm, head), 1 - 1/DP of it beyond its shard. None unless ZeRO-3/FSDP shards."""
    if (spec.zero_stage or 0) < 3 or spec.data_parallel <= 1:
        return None
    n_layers = spec.arch.n_layers
    buf = torch.empty(_root_bytes(model, n_layers), dtype=torch.uint8, device="meta")
    tr.mark(buf, ROOT)
    return buf
