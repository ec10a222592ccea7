"""Run one job's real PyTorch program on the meta device under the storage tracker.

Training: forward, loss, backward and the optimizer step, exactly as the task runs them (PEFT
LoRA with its adapter dtype, bitsandbytes-style quantised bases for QLoRA, checkpointing,
autocast or pure-dtype weights, gradient accumulation). The first step is traced as torch runs
it, optimizer states created lazily at its optimizer step; a steady-state second step with the
states in place is appended from the same events (see :func:`_with_second_step`), so the
allocator model sees where the states landed.

Inference: the prefill of one batch, then one decode step at the final KV length, the way HF
``generate`` runs them (a dynamic cache grown by concatenation; only the last token's logits,
upcast to fp32).

The result is a :class:`Timeline`: allocation events in program order and the category each
allocation ended up in. Sharding and the allocator model are applied to it afterwards
(``_summary.py``), so one trace serves every GPU count of the same per-rank shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from .._jobarrays import weight_qbytes
from .._spec_rules import saves_softmax_input
from ..spec import AttnImplementation, DType, Framework, Head, JobSpec, LoraTarget, Optimizer, Task
from ._build import build_meta_model, kv_heads
from ._dispatch import OpCost, StorageTracker
from ._fsdp import emulate_flat_units, flat_units, unshard_root, uses_no_sync_accumulation
from ._legacy import legacy_softmax
from ._litgpt import fuse_qkv_outputs, is_litgpt, untie_head
from ._loss import train_loss
from ._patches import (
    ATTN_IMPLEMENTATION,
    AutocastEmulation,
    QuantLinearStub,
    install,
    share_qkv_dropout,
)

__all__ = ["Timeline", "run_trace"]

_TORCH_DTYPE = {
    DType.FP32: torch.float32,
    DType.BF16: torch.bfloat16,
    DType.FP16: torch.float16,
}
# bytes per element of a quantised weight, scales included (as in predictor._jobarrays)
_QUANT_BYTES = {
    DType.NF4: 0.5 + 1.0 / 64 + 4.0 / (64 * 256),
    DType.INT4: 0.5 + 2.5 / 128,
    DType.FP4: 0.5 + 1.0 / 16,
    DType.INT8: 1.0,
    DType.FP8: 1.0,
}
_BNB_4BIT = (DType.NF4, DType.FP4)  # bitsandbytes 4-bit; LitGPT's int4 is GPTQ
#: Micro-batches traced: the second one shows the steady state with gradients carried.
_MAX_MICRO = 2


@dataclass
class Timeline:
    events: list[tuple[int, int, int]]
    category: dict[int, str]
    costs: dict[str, OpCost] = field(default_factory=dict)
    n_params: int = 0
    phase: dict[int, str] = field(default_factory=dict)  # phase each allocation happened in


def _td(d: DType | None) -> torch.dtype:
    return _TORCH_DTYPE.get(d or DType.BF16, torch.bfloat16)


def _quantise(model: Any, spec: JobSpec, compute: torch.dtype) -> None:
    """Replace every block linear with a quantised-storage stub; the LM head too for LitGPT,
    whose Fabric bitsandbytes plugin replaces every ``nn.Linear``."""
    bpw = weight_qbytes(spec)
    head = None if is_litgpt(spec) else model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child is not head:
                stub = QuantLinearStub(
                    child.in_features, child.out_features, bpw, compute, child.bias
                )
                stub.input_in_ctx = is_litgpt(spec)
                if is_litgpt(spec) and spec.weight_dtype in _BNB_4BIT:
                    # Lightning's bitsandbytes plugin quantises from fp16 (``_Linear4bit.
                    # _quantize_weight``: ``weight.to(dtype=torch.half)``, since the plugin
                    # came in, 2023-09): its 4-bit layers dequantise to fp16, then cast.
                    stub.state_dtype = torch.float16
                setattr(parent, name, stub)


def _lora_targets(model: Any, target: LoraTarget) -> list[str]:
    names: set[str] = set()
    head = model.get_output_embeddings()
    for full, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head and full:
            names.add(full.rsplit(".", 1)[-1])
    names -= {"lm_head", "decoder", "score"}
    if target is LoraTarget.ALL_LINEAR:
        return sorted(names)
    qv = {"q_proj", "v_proj", "query", "value"}
    chosen = names & qv if target is LoraTarget.QV else names & (qv | {"k_proj", "o_proj", "key"})
    if not chosen:
        # Fused q/k/v projections (GPT-NeoX, GPT-2): the adapter sits on the fused linear, as
        # LitGPT's LoRAQKVLinear does; the adapted input is the same tensor.
        chosen = names & {"query_key_value", "c_attn"}
        if target is LoraTarget.ATTENTION:
            chosen |= names & {"dense"}  # GPT-NeoX's attention output (GPT-2's c_proj is ambiguous)
    return sorted(chosen)


def _apply_lora(model: Any, spec: JobSpec) -> Any:
    import peft

    assert spec.lora_rank is not None and spec.lora_target is not None
    cfg = peft.LoraConfig(
        r=spec.lora_rank,
        lora_alpha=2 * spec.lora_rank,
        lora_dropout=spec.lora_dropout or 0.0,
        target_modules=_lora_targets(model, spec.lora_target),
        task_type=None,
    )
    adapter = _td(spec.adapter_dtype or DType.FP32)
    # peft makes adapters in fp32 (autocast_adapter_dtype); other stacks in the compute dtype.
    # On meta, so adapter init (kaiming/zeros) costs nothing, as the rest of the model.
    with torch.device("meta"):
        model = peft.get_peft_model(model, cfg, autocast_adapter_dtype=False)
    for n, p in model.named_parameters():
        if "lora_" in n:
            p.data = torch.empty_like(p, dtype=adapter, device="meta")
    if spec.lora_dropout and spec.framework is Framework.OTHER:
        share_qkv_dropout(model)
    return model


def _optimizer(spec: JobSpec, params: list[Any]) -> Any:
    """The optimizer, with no state yet: as in torch, states appear at the first step."""
    opt = spec.optimizer or Optimizer.NONE
    if opt is Optimizer.ADAMW:
        # HF Trainer's AdamW (``adamw_hf`` per parameter, later ``adamw_torch_fused``) never
        # makes the foreach path's full-size temporaries; plain torch loops (PEFT's scripts,
        # torchtune, LitGPT) get torch's CUDA default, foreach.
        return torch.optim.AdamW(params, lr=1e-5, foreach=spec.framework is not Framework.HF)
    if opt is Optimizer.SGD:
        return torch.optim.SGD(params, lr=1e-5, momentum=0.9, foreach=True)
    if opt is Optimizer.NONE:
        return None
    return []  # bitsandbytes 8-bit / Adafactor: states made by _step_optimizer


def _mark_state(tr: StorageTracker, t: torch.Tensor) -> None:
    """An optimizer state: category ``optimizer``, phase ``optimizer_state`` (apart from the
    step's transient temporaries, which share the category)."""
    h = tr.track(t, "optimizer")
    if h is not None:
        tr.alloc_phase[h] = "optimizer_state"


def _custom_states(opt: Optimizer, params: list[Any]) -> list[torch.Tensor]:
    """bitsandbytes 8-bit AdamW and Adafactor states, at their true sizes."""
    states: list[torch.Tensor] = []
    for p in params:
        if opt in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT):
            # bitsandbytes: two uint8 moments plus one fp32 absmax per 256-element block.
            n = p.numel()
            states += [torch.empty(n, dtype=torch.uint8, device="meta") for _ in range(2)]
            blocks = math.ceil(n / 256)
            states += [torch.empty(blocks, dtype=torch.float32, device="meta") for _ in range(2)]
        elif opt is Optimizer.ADAFACTOR:
            if p.dim() >= 2:
                states += [
                    torch.empty(p.shape[0], device="meta"),
                    torch.empty(p.shape[-1], device="meta"),
                ]
            else:
                states.append(torch.empty_like(p, dtype=torch.float32))
    return states


def _step_optimizer(opt: Any, params: list[Any], spec: JobSpec, tr: StorageTracker) -> None:
    if isinstance(opt, torch.optim.Optimizer):
        opt.step()
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    _mark_state(tr, v)
        return
    if opt is not None:
        if not opt:
            opt += _custom_states(spec.optimizer or Optimizer.NONE, params)
            for st in opt:
                _mark_state(tr, st)
        # 8-bit / factored optimizers update in place through small per-tensor temporaries.
        for p in params:
            if p.grad is not None:
                tmp = torch.empty_like(p, dtype=torch.float32)
                del tmp


def _train_model(spec: JobSpec) -> Any:
    """The model as the job trains it, built outside the tracker (loading is not the peak)."""
    compute = _td(spec.compute_dtype)
    weight = torch.float32 if spec.weight_dtype == DType.FP32 else compute
    if spec.weight_dtype in (DType.BF16, DType.FP16):
        weight = _td(spec.weight_dtype)
    classify = spec.head is Head.CLASSIFICATION
    model = build_meta_model(spec.arch, weight, _attn_impl(spec), classify=classify)
    if is_litgpt(spec):
        untie_head(model)
    if spec.task is Task.QLORA or (
        spec.task.is_peft and spec.weight_dtype in (DType.INT8, DType.INT4, DType.NF4)
    ):
        _quantise(model, spec, compute)
    for p in model.parameters():
        p.requires_grad_(not spec.task.is_peft)
    if spec.task.is_peft:
        model = _apply_lora(model, spec)
    if is_litgpt(spec):
        fuse_qkv_outputs(model)
    if uses_no_sync_accumulation(spec):
        emulate_flat_units(model, spec.arch.n_layers)
    return model


def _train(spec: JobSpec, model: Any, tr: StorageTracker) -> Timeline:
    compute = _td(spec.compute_dtype)
    units = flat_units(model)
    params = units.trainable if units else [p for p in model.parameters() if p.requires_grad]
    # Autocast runs where the stored dtype of anything trained differs from the compute dtype
    # (fp32 master weights, fp32 PEFT adapters under Trainer(bf16=True)).
    amp = compute != torch.float32 and any(p.dtype == torch.float32 for p in params)
    if spec.gradient_checkpointing:
        _enable_checkpointing(model, compute if amp else None, saves_softmax_input(spec))
    model.train()
    _track_model(model, tr)
    opt = _optimizer(spec, params)
    _hook_logits(model, tr)
    assert spec.seq_len is not None
    ids = torch.zeros(spec.batch_size, spec.seq_len, dtype=torch.long, device="meta")
    micro = min(spec.gradient_accumulation or 1, _MAX_MICRO)
    offload = (
        torch.autograd.graph.save_on_cpu(pin_memory=False)
        if spec.activation_offload
        else nullcontext()
    )
    # LitGPT's loop rebinds `logits` and `loss` only when the next micro-batch computes them,
    # so the last graph (and what its nodes keep: bitsandbytes' inputs, the logits chunks)
    # lives through the optimizer step and the next forward.
    carry = is_litgpt(spec)
    prev: Any = None
    start = len(tr.events)
    fwd_end = start
    for i in range(micro):
        autocast = AutocastEmulation(compute) if amp else None
        with autocast or nullcontext(), offload:
            with tr.in_phase("forward"):
                root = unshard_root(model, spec, tr)  # FSDP: to the end of backward
                loss, kept = train_loss(model, ids, spec, tr)
            prev = None
            fwd_end = len(tr.events) if i == 0 else fwd_end
            if autocast is not None:
                autocast.end_forward()
            with tr.in_phase("logits"):
                loss.backward()
        prev = (loss, kept) if carry else None
        del loss, kept, root
        _mark_grads(params, units, tr)
    if units is not None:
        units.sync(tr)
    with tr.in_phase("optimizer"):
        _step_optimizer(opt, params, spec, tr)
    # torch >= 2.0 frees the gradients here (pytorch#92731); before, `zero_grad()` zeroed them
    # in place, so they stay allocated through the next step's forward, and its backward
    # accumulates into them (the replayed step then allocates none: `_with_second_step`).
    model.zero_grad(set_to_none=spec.zero_grad_set_to_none is not False)
    if units is not None:
        units.zero_grad()
    end = len(tr.events)
    del prev  # the next step's loss would drop the last graph: after this step's events
    carried = [h for op, h, _ in tr.events[end:] if not op]
    n_params = sum(p.numel() for p in model.parameters()) + (units.n_params if units else 0)
    del model, opt, params, units
    return _timeline(tr, n_params, second_step=(start, end), carried=(fwd_end, carried))


def _mark_grads(params: list[Any], units: Any, tr: StorageTracker) -> None:
    """Label the gradients a micro-batch left: the parameters' own, or FSDP's flat ones."""
    if units is not None:
        units.mark_grads(tr)
        return
    for p in params:
        if p.grad is not None:
            tr.mark(p.grad, "gradients")


def _recompute_autocast(dtype: torch.dtype) -> AutocastEmulation:
    mode = AutocastEmulation(dtype)
    mode.caching = False
    return mode


def _enable_checkpointing(model: Any, amp: torch.dtype | None, legacy: bool) -> None:
    """Non-reentrant checkpointing whose recompute re-enters the emulations the forward ran
    under (autocast's, as checkpoint re-enters autocast; old torch's softmax outside it)."""
    kwargs: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": False}
    if amp is not None or legacy:
        kwargs["context_fn"] = lambda: (nullcontext(), _recompute_modes(amp, legacy))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@contextmanager
def _recompute_modes(amp: torch.dtype | None, legacy: bool) -> Iterator[None]:
    with (
        legacy_softmax() if legacy else nullcontext(),
        _recompute_autocast(amp) if amp is not None else nullcontext(),
    ):
        yield


def _infer_model(spec: JobSpec) -> Any:
    compute = _td(spec.compute_dtype)
    weight = compute if spec.weight_dtype not in _TORCH_DTYPE else _td(spec.weight_dtype)
    model = build_meta_model(spec.arch, weight, _attn_impl(spec))
    if is_litgpt(spec):
        untie_head(model)
    if spec.weight_dtype in _QUANT_BYTES:
        _quantise(model, spec, compute)
    return model


def _infer(spec: JobSpec, model: Any, tr: StorageTracker) -> Timeline:
    from transformers import DynamicCache

    compute = _td(spec.compute_dtype)
    model.eval()
    _track_model(model, tr)
    _hook_logits(model, tr)
    b = spec.batch_size
    assert spec.input_len is not None and spec.output_len is not None
    kv = _td(spec.kv_cache_dtype) if spec.kv_cache_dtype in _TORCH_DTYPE else compute
    encoder = spec.arch.encoder_only
    if spec.kv_cache_max_len is not None and not encoder:
        return _infer_static(spec, model, tr, kv)
    with torch.no_grad():
        ids = torch.zeros(b, spec.input_len, dtype=torch.long, device="meta")
        with tr.in_phase("forward"):
            if encoder:
                out = model(input_ids=ids)
                del out
                return _timeline(tr, sum(p.numel() for p in model.parameters()))
            cache = DynamicCache(config=model.config)
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            with tr.in_phase("logits"):
                nxt = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
            _mark_cache(cache, tr)
            del out
        del cache, nxt
        # The last decode step: the cache holds input + output − 1 tokens and grows by one.
        ctx = spec.input_len + spec.output_len - 1
        cfg = model.config
        n_kv, hd = kv_heads(cfg)
        with tr.in_phase("kv_cache"):
            cache = DynamicCache(config=cfg)
            for layer in range(cfg.num_hidden_layers):
                k = torch.empty(b, n_kv, ctx, hd, dtype=kv, device="meta")
                v = torch.empty(b, n_kv, ctx, hd, dtype=kv, device="meta")
                cache.update(k, v, layer)
                del k, v
            _mark_cache(cache, tr)
            # K/V expanded to the query heads before caching: the extra heads' storage, at
            # the length the cache reaches in the last step.
            wide = _query_head_storage(spec, cfg, b, ctx + 1, kv, tr)
        one = torch.zeros(b, 1, dtype=torch.long, device="meta")
        with tr.in_phase("forward"):
            out = model(input_ids=one, past_key_values=cache, use_cache=True, logits_to_keep=1)
            with tr.in_phase("logits"):
                nxt = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
            _mark_cache(cache, tr)
            del out, nxt
    n_params = sum(p.numel() for p in model.parameters())
    del model, cache, wide
    return _timeline(tr, n_params)


def _query_head_storage(
    spec: JobSpec, cfg: Any, b: int, length: int, kv: torch.dtype, tr: StorageTracker
) -> list[torch.Tensor]:
    """With ``kv_cache_query_heads``, what the cache holds beyond the KV heads: K and V of
    ``num_attention_heads - num_key_value_heads`` more heads per layer at ``length`` tokens
    (torchtune @20747cd87's ``MultiHeadAttention`` expands k/v to ``num_heads`` before
    ``kv_cache.update``, so its ``KVCache`` buffers are ``num_heads`` wide). HF's cache takes
    the KV heads, so the extra heads are held beside it, as ``kv_cache``."""
    n_kv, hd = kv_heads(cfg)
    extra = cfg.num_attention_heads - n_kv
    if not spec.kv_cache_query_heads or extra <= 0:
        return []
    held = [
        torch.empty(b, extra, length, hd, dtype=kv, device="meta")
        for _ in range(2 * cfg.num_hidden_layers)
    ]
    for t in held:
        tr.mark(t, "kv_cache")
    return held


def _infer_static(spec: JobSpec, model: Any, tr: StorageTracker, kv: torch.dtype) -> Timeline:
    """Generation with a cache preallocated for ``kv_cache_max_len`` tokens before the prefill
    (torchtune's ``setup_caches``, HF's ``StaticCache``): HF's ``StaticCache`` sized up front
    (``early_initialization``), the prefill and the last decode step writing into it at
    explicit cache positions (its ``get_seq_length`` reads the cache's values, which meta
    tensors do not have)."""
    from transformers import StaticCache

    assert spec.kv_cache_max_len is not None and spec.input_len is not None
    assert spec.output_len is not None
    b, n, cfg = spec.batch_size, spec.kv_cache_max_len, model.config
    n_kv, hd = kv_heads(cfg)
    with torch.no_grad():
        with tr.in_phase("kv_cache"):
            cache = StaticCache(config=cfg, max_cache_len=n)
            cache.early_initialization(b, n_kv, hd, kv, torch.device("meta"))
            _mark_cache(cache, tr)
            wide = _query_head_storage(spec, cfg, b, n, kv, tr)
        ids = torch.zeros(b, spec.input_len, dtype=torch.long, device="meta")
        pos = torch.arange(spec.input_len, device="meta")
        last = torch.tensor([spec.input_len + spec.output_len - 1], device="meta")
        for step_ids, step_pos in ((ids, pos), (ids[:, :1], last)):
            with tr.in_phase("forward"):
                out = model(
                    input_ids=step_ids,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                    cache_position=step_pos,
                )
                with tr.in_phase("logits"):
                    nxt = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
                del out, nxt
    n_params = sum(p.numel() for p in model.parameters())
    del model, cache, wide
    return _timeline(tr, n_params)


def _attn_impl(spec: JobSpec) -> str:
    # HF's encoders (BERT), fp32 runs and jobs that ask for it take the eager path that stores
    # the s² scores.
    eager = spec.attn_implementation is AttnImplementation.EAGER
    if eager or spec.arch.encoder_only or spec.compute_dtype == DType.FP32:
        return "eager"
    return ATTN_IMPLEMENTATION


def _mark_cache(cache: Any, tr: StorageTracker) -> None:
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                tr.mark(t, "kv_cache")


def _track_model(model: Any, tr: StorageTracker) -> None:
    units = flat_units(model)
    for f in units.flats if units else []:
        tr.track(f.param, "weights")
    for p in model.parameters():
        if not getattr(p, QuantLinearStub.SHAPE_ONLY, False):
            tr.track(p, "weights")
    for buf in model.buffers():
        tr.track(buf, "weights")


def _hook_logits(model: Any, tr: StorageTracker) -> None:
    """Allocations from the LM head's input to the end of forward are logits; in backward,
    from the loss to the head's output gradient."""
    head = model.get_output_embeddings()
    if head is None:
        return

    def pre(_m: Any, _inp: Any) -> None:
        tr.phase = "logits"

    def bwd_pre(_m: Any, _g: Any) -> None:
        tr.phase = "backward"

    head.register_forward_pre_hook(pre)
    head.register_full_backward_pre_hook(bwd_pre)


def _timeline(
    tr: StorageTracker,
    n_params: int,
    second_step: tuple[int, int] | None = None,
    carried: tuple[int, list[int]] = (0, []),
) -> Timeline:
    cat: dict[int, str] = {}
    by_phase = {
        "optimizer": "optimizer",
        "optimizer_state": "optimizer",
        "logits": "logits",
        "kv_cache": "kv_cache",
        "init": "weights",
    }
    for h, ph in tr.alloc_phase.items():
        cat[h] = tr.label.get(h) or by_phase.get(ph, "activations")
    events = list(tr.events)
    phases = dict(tr.alloc_phase)
    if second_step is not None:
        events = _with_second_step(events, *second_step, cat, phases, carried)
    return Timeline(
        events=events,
        category=cat,
        costs=dict(tr.costs),
        n_params=n_params,
        phase=phases,
    )


def _with_second_step(
    events: list[tuple[int, int, int]],
    start: int,
    end: int,
    cat: dict[int, str],
    phase: dict[int, str],
    carried: tuple[int, list[int]] = (0, []),
) -> list[tuple[int, int, int]]:
    """The traced first step followed by a steady-state second one.

    The first step creates the optimizer states at its optimizer step, as torch does, in
    whatever the freed activations left in the caching allocator; the second runs the same
    program with them in place. Its events are the first step's with fresh handles, less the
    allocations that outlive the step (the states): the program and its shapes are the same,
    so re-running the trace would record the same sequence. The allocated peak is the second
    step's; the reserved one depends on the first step's layout, which is why both are kept.

    ``carried`` is ``(event index where the first micro-batch's loss is computed, handles
    freed only after the step)``: what a training loop keeps of the step's last graph. The
    first step's copies are freed where the second step computes its first loss, and the
    second step's own are replayed (they would live into a third step, which is not traced).
    """
    fwd_end, held = carried
    held_set = set(held)
    body = events[start:end]
    freed = {h for op, h, _ in body if not op}
    persistent = {h for op, h, _ in body if op and h not in freed and h not in held_set}
    offset = 1 + max((h for _, h, _ in events), default=0)
    again: list[tuple[int, int, int]] = []
    for j, (op, h, n) in enumerate(body):
        if j == fwd_end - start:
            again += [(0, x, 0) for x in held]
        if h in persistent:
            continue
        nh = h + offset
        if op:
            cat[nh] = cat.get(h, "activations")
            phase[nh] = phase.get(h, "forward")
        again.append((op, nh, n))
    tail = [e for e in events[end:] if e[0] or e[1] not in held_set]
    return events[:end] + again + tail


def run_trace(spec: JobSpec) -> Timeline:
    """Trace ``spec`` (one rank, unsharded shapes) and return its timeline."""
    install()
    model = _train_model(spec) if spec.task.is_training else _infer_model(spec)
    tr = StorageTracker()
    legacy = legacy_softmax() if spec.task.is_training and saves_softmax_input(spec) else None
    with tr, legacy or nullcontext():
        return _train(spec, model, tr) if spec.task.is_training else _infer(spec, model, tr)
