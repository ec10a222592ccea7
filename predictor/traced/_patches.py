"""What the meta device needs so that HF code runs shape-only with a GPU's memory behaviour.

* **Attention.** On meta, ``scaled_dot_product_attention`` takes the math path, which keeps the
  ``s²`` scores a GPU's flash kernel never stores. :func:`flash_attention` calls the flash op
  directly (its meta kernel and autograd formula exist), repeating K and V for GQA as the
  SDPA wrapper does, and is registered as a transformers attention implementation.
* **Packed sequences.** transformers checks ``position_ids`` for packing with a data-dependent
  ``.all()``; a meta tensor has no data, so the check is bypassed (the traced batch is never
  packed).
* **Autocast.** CUDA autocast never triggers on meta, so :class:`AutocastEmulation` (a
  ``TorchFunctionMode``, above autograd) casts the inputs of the ops autocast runs in 16 bits
  and of those it runs in fp32, caching weight casts for the region as autocast does.
* **bitsandbytes.** Its kernels are CUDA-only: :class:`QuantLinearStub` holds nf4/int8 storage
  at its true size and dequantises into a transient compute-dtype weight per matmul.
* **Dropout.** On meta ATen's dropout multiplies by a noise tensor in the input's dtype, which
  backward keeps; on CUDA it runs the fused ``native_dropout``, keeping a 1-byte mask: the
  traced ``F.dropout`` calls ``native_dropout`` (see :func:`_fused_dropout`).
* **LitGPT's LoRA dropout.** LitGPT's fused ``LoRAQKVLinear`` drops its input once for q, k and
  v together; PEFT on HF's separate projections would drop it once per projection.
  :func:`share_qkv_dropout` gives a block's q/k/v adapters one :class:`SharedDropout`.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "ATTN_IMPLEMENTATION",
    "AutocastEmulation",
    "QuantLinearStub",
    "SharedDropout",
    "flash_attention",
    "install",
    "share_qkv_dropout",
]

ATTN_IMPLEMENTATION = "snugfit_trace"
EXPERTS_IMPLEMENTATION = "snugfit_uniform"
_installed = False


def flash_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: ``(b, h, s, d)`` in, ``(b, s, h, d)`` out."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        # torch's SDPA wrapper repeats K/V before the flash kernel, which needs equal heads.
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, dropout, causal, False, scale=scale
    )[0]
    return out.transpose(1, 2).contiguous(), None


def install() -> None:
    """Register the attention implementation and bypass the packed-sequence check (once)."""
    global _installed
    if _installed:
        return
    from transformers import masking_utils
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, flash_attention)
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, uniform_experts)
    except ImportError:  # older transformers: per-expert nn.Linear modules, no interface
        pass
    torch.nn.functional.dropout = _fused_dropout(torch.nn.functional.dropout)
    _installed = True


def _fused_dropout(dropout: Any) -> Any:
    """Dropout as a GPU runs it: ATen's ``dropout`` takes the fused ``native_dropout`` kernel
    on CUDA (``is_fused_kernel_acceptable``: a CUDA input and 0 < p < 1; Dropout.cpp), whose
    backward keeps a 1-byte bool mask. On meta it falls back to ``input * noise``, whose
    backward keeps the noise in the input's dtype (2-4 bytes per element)."""

    def fused(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        meta = isinstance(input, torch.Tensor) and input.device.type == "meta"
        if meta and training and 0.0 < p < 1.0 and not inplace and input.numel():
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return dropout(input, p, training, inplace)

    fused.__wrapped__ = dropout  # type: ignore[attr-defined]
    return fused


def uniform_experts(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """MoE experts with routing spread evenly (meta tensors carry no router decisions).

    Like transformers' batched/grouped kernels, each token is replicated once per selected
    expert; every expert then runs on an equal share of the ``tokens × top_k`` rows, so the
    saved gate/up/activation tensors have their expected total size.
    """
    if not getattr(self, "has_gate", True) or not getattr(self, "is_concatenated", True):
        raise NotImplementedError("uniform experts: only concatenated gate/up experts")
    k = top_k_index.size(-1)
    n_tokens, hidden = hidden_states.shape
    n_exp = self.num_experts
    x = hidden_states.repeat_interleave(k, dim=0)
    rows = x.shape[0]
    sizes = [rows // n_exp + (1 if i < rows % n_exp else 0) for i in range(n_exp)]
    weights = top_k_weights.reshape(-1, 1)
    outs = []
    start = 0
    for e, chunk in enumerate(x.split(sizes)):
        if chunk.shape[0] == 0:
            continue
        w_gu, w_d = self.gate_up_proj[e], self.down_proj[e]
        if getattr(self, "is_transposed", False):
            w_gu, w_d = w_gu.t(), w_d.t()
        gate, up = torch.nn.functional.linear(chunk, w_gu).chunk(2, dim=-1)
        y = torch.nn.functional.linear(self.act_fn(gate) * up, w_d)
        outs.append(y * weights[start : start + chunk.shape[0]])
        start += chunk.shape[0]
    out = torch.cat(outs).view(n_tokens, k, hidden).sum(dim=1)
    return out.to(hidden_states.dtype)


def use_uniform_experts(model: Any) -> None:
    """Point every experts module of ``model`` at :func:`uniform_experts`."""
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if hasattr(m, "gate_up_proj") and cfg is not None and hasattr(m, "num_experts"):
            cfg._experts_implementation = EXPERTS_IMPLEMENTATION


# ------------------------------------------------------------------------------ autocast
_F = torch.nn.functional
_LOW = {
    _F.linear,
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.mm,
    torch.bmm,
    torch.baddbmm,
    torch.addmm,
    _F.scaled_dot_product_attention,
}
_FP32 = {
    _F.softmax,
    _F.log_softmax,
    torch.softmax,
    torch.log_softmax,
    torch.Tensor.softmax,
    torch.Tensor.log_softmax,
    _F.cross_entropy,
    _F.nll_loss,
    _F.layer_norm,
    _F.mse_loss,
    torch.Tensor.pow,
    torch.pow,
    torch.rsqrt,
    torch.exp,
    torch.log,
}


class AutocastEmulation(TorchFunctionMode):
    """``torch.autocast(dtype=...)`` semantics for meta tensors.

    Floating inputs of matmul-like ops are cast to ``dtype``; 16-bit inputs of the fp32 list
    are cast to fp32. Casts of leaf tensors that require grad (weights) are cached for the
    region, as autocast's weight-cast cache does, so a weight used twice is cast once and its
    16-bit copy lives until the region ends.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, torch.Tensor] = {}
        self.caching = True

    def end_forward(self) -> None:
        """Leave the forward region: drop cached weight casts, cast afresh in recompute."""
        self._cache.clear()
        self.caching = False

    def _cast(self, x: Any, dtype: torch.dtype) -> Any:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == dtype:
            return x
        leaf = self.caching and x.is_leaf and x.requires_grad
        if leaf and id(x) in self._cache:
            return self._cache[id(x)]
        y = x.to(dtype)
        if leaf:
            self._cache[id(x)] = y
        return y

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _LOW:
            args = tuple(self._cast(a, self.dtype) for a in args)
            kwargs = {k: self._cast(v, self.dtype) for k, v in kwargs.items()}
        elif func in _FP32:
            half = (torch.float16, torch.bfloat16)
            args = tuple(
                self._cast(a, torch.float32)
                if isinstance(a, torch.Tensor) and a.dtype in half
                else a
                for a in args
            )
        return func(*args, **kwargs)

    def __exit__(self, *exc: Any) -> Any:
        self._cache.clear()
        return super().__exit__(*exc)


# ------------------------------------------------------------------------------ bitsandbytes
class _DequantMatmul(torch.autograd.Function):
    """bitsandbytes' 4-bit/8-bit matmul: dequantise into a transient weight per call.

    Like ``MatMul4Bit`` in the bitsandbytes releases the published QLoRA runs used (0.41 and
    0.42; from 0.44 it keeps only the weight), it keeps its input even though the quantised
    weight never trains. bitsandbytes keeps it as a ``ctx`` attribute (``ctx.tensors = (A,
    B)``), not through ``save_for_backward``: autograd does not release it after the node's
    backward, and checkpointing's saved-tensor hooks never see it, so it lives as long as the
    graph does. ``in_ctx`` does the same (for LitGPT, whose loop keeps the graph past the step,
    see ``_litgpt.py``); otherwise it is saved, which keeps the tracer's non-reentrant
    checkpointing as HF's reentrant default behaves (no graph kept in the checkpointed
    forward).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        qweight: torch.Tensor,
        shape: Any,
        dtype: Any,
        in_ctx: bool,
        state_dtype: Any = None,
    ) -> Any:
        ctx.shape, ctx.dtype, ctx.state_dtype = shape, dtype, state_dtype or dtype
        x = x.to(dtype)
        if in_ctx:
            ctx.tensors = (x, qweight)
        else:
            ctx.save_for_backward(x)
        return x @ _dequantised(shape, ctx.state_dtype, dtype, x.device).t()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        w = _dequantised(ctx.shape, ctx.state_dtype, ctx.dtype, grad.device)
        return grad @ w, None, None, None, None, None


def _dequantised(shape: Any, state_dtype: Any, dtype: Any, device: Any) -> torch.Tensor:
    """``F.dequantize_4bit(B, state).to(dtype)``: bitsandbytes dequantises into the dtype the
    weight had when quantised (``quant_state``'s), then casts to the input's dtype, so both
    copies are alive at once where they differ."""
    w = torch.empty(shape, dtype=state_dtype, device=device)
    return w if state_dtype == dtype else w.to(dtype)


class QuantLinearStub(torch.nn.Linear):
    """A frozen linear whose weight is stored quantised (nf4/int4 with scales, or int8).

    ``bytes_per_weight`` includes the quantisation scales (bitsandbytes nf4 with double
    quantisation: 0.5 + 1/64 + 4/(64·256) bytes per element). It subclasses ``nn.Linear`` so
    peft adapts it like bitsandbytes' layers; ``weight`` is a shape-only stand-in that the
    tracker skips (``SHAPE_ONLY``), the real storage is ``qweight``.
    """

    SHAPE_ONLY = "_snugfit_shape_only"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bytes_per_weight: float,
        compute_dtype: torch.dtype,
        bias: torch.nn.Parameter | None,
    ) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        n = math.ceil(in_features * out_features * bytes_per_weight)
        self.register_buffer("qweight", torch.empty(n, dtype=torch.uint8, device="meta"))
        w = torch.nn.Parameter(
            torch.empty(out_features, in_features, dtype=compute_dtype, device="meta"),
            requires_grad=False,
        )
        setattr(w, self.SHAPE_ONLY, True)
        self.weight = w
        self.bias = bias  # type: ignore[assignment]
        self.compute_dtype = compute_dtype
        #: keep the input as bitsandbytes <= 0.43 does, for as long as the graph lives
        self.input_in_ctx = False
        #: the dtype the weight was quantised from (bitsandbytes dequantises into it)
        self.state_dtype = compute_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (self.out_features, self.in_features)
        y = _DequantMatmul.apply(
            x, self.qweight, shape, self.compute_dtype, self.input_in_ctx, self.state_dtype
        )
        return y + self.bias if self.bias is not None else y


class SharedDropout(torch.nn.Dropout):
    """A dropout that returns its last output again for the same input tensor: one dropped
    copy (and mask) per input however many adapters read it, as a fused QKV adapter has."""

    def __init__(self, p: float) -> None:
        super().__init__(p)
        self._last: tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._last is not None:
            seen, out = self._last[0](), self._last[1]()
            if seen is x and out is not None:
                return out
        y = super().forward(x)
        # Weak references: the memo never keeps a tensor alive past its real lifetime.
        self._last = (weakref.ref(x), weakref.ref(y))
        return y


_QKV = ("q_proj", "k_proj", "v_proj", "query", "key", "value")


def share_qkv_dropout(model: Any) -> None:
    """Give the adapted q/k/v projections of each attention block one :class:`SharedDropout`
    (in place), as LitGPT's ``LoRAQKVLinear`` applies a single dropout to the shared input."""
    for parent in model.modules():
        drops = [getattr(getattr(parent, name, None), "lora_dropout", None) for name in _QKV]
        adapted = [d for d in drops if isinstance(d, torch.nn.ModuleDict) and "default" in d]
        ps = [float(getattr(d["default"], "p", 0.0)) for d in adapted]
        if len(adapted) < 2 or not all(ps):
            continue
        shared = SharedDropout(ps[0])
        for d in adapted:
            d["default"] = shared
