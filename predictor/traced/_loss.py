"""The training step's loss as the job's framework computes it: the model's own loss,
torchtune's chunked loss, transformers < 4.50's shifted fp32 copy, and the K/V a training
forward keeps with ``use_cache``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .._spec_rules import shifts_fp32_logits
from ..spec import Head, JobSpec
from ._build import kv_heads
from ._dispatch import StorageTracker
from ._litgpt import litgpt_loss, uses_litgpt_loss

__all__ = ["train_loss"]

#: Chunks of torchtune's ``CEWithChunkedOutputLoss``.
_LOSS_CHUNKS = 8


def train_loss(
    model: Any, ids: torch.Tensor, spec: JobSpec, tr: StorageTracker
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The step's loss, and what the training loop keeps alive until backward ends."""
    if uses_litgpt_loss(spec, model):
        return litgpt_loss(model, ids, spec, tr)
    with _kept_kv(model, spec, tr):
        return _loss_tensor(model, ids, spec, tr), []


@contextmanager
def _kept_kv(model: Any, spec: JobSpec, tr: StorageTracker) -> Iterator[None]:
    """``use_cache``: each decoder attention's K and V (``(batch, kv_heads, seq, head_dim)``,
    the activations' dtype) kept from its forward until the loss is made, as transformers'
    cache returned in the output: v4.31.0 ``modeling_llama.py`` line 615 (``use_cache`` from
    ``config.use_cache``, default true at ``configuration_llama.py`` line 118), line 324
    (``past_key_value = (key_states, value_states)``), lines 704-716 (collected into
    ``next_decoder_cache`` and returned), turned off only by HF's own checkpointing (lines
    659-663). The loop keeps only ``.loss`` (``loss = model(**batch).loss``), so they go before
    backward; the checkpoint recompute in backward keeps none."""
    if not spec.use_cache:
        yield
        return
    held: list[torch.Tensor] = []
    cfg = model.config

    def hook(_m: Any, args: Any, kwargs: Any, _out: Any) -> None:
        hs = kwargs.get("hidden_states", args[0] if args else None)
        if not isinstance(hs, torch.Tensor) or hs.dim() != 3:
            return
        n_kv, hd = kv_heads(cfg)
        b, s, _ = hs.shape
        with tr.in_phase("forward"):
            for _ in range(2):
                t = torch.empty(b, n_kv, s, hd, dtype=hs.dtype, device=hs.device)
                tr.mark(t, "kv_cache")
                held.append(t)

    hooks = [
        m.register_forward_hook(hook, with_kwargs=True)
        for m in model.modules()
        if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")
    ]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        held.clear()


def _loss_tensor(model: Any, ids: torch.Tensor, spec: JobSpec, tr: StorageTracker) -> torch.Tensor:
    if spec.head is Head.CLASSIFICATION:
        classes = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
        return model(input_ids=ids, labels=classes).loss
    has_head = model.get_output_embeddings() is not None
    if not spec.chunked_loss and has_head and shifts_fp32_logits(spec):
        return _shifted_fp32_loss(model, ids, tr)
    if not spec.chunked_loss or not has_head:
        return model(input_ids=ids, labels=ids, use_cache=False).loss
    # torchtune's CEWithChunkedOutputLoss: 16-bit logits of every chunk live, fp32 one at a time.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    head = base.get_output_embeddings()
    with tr.in_phase("logits"):
        chunks = [head(h) for h in hidden.chunk(_LOSS_CHUNKS, dim=1)]
        labels = ids.chunk(_LOSS_CHUNKS, dim=1)
        total = sum(
            torch.nn.functional.cross_entropy(
                c.float().flatten(0, 1), lab.flatten(), reduction="sum"
            )
            for c, lab in zip(chunks, labels, strict=True)
        )
    return total / ids.numel()  # type: ignore[operator,return-value]


def _shifted_fp32_loss(model: Any, ids: torch.Tensor, tr: StorageTracker) -> torch.Tensor:
    """The loss as transformers v4.31.0 ``models/llama/modeling_llama.py`` computes it:
    ``logits = logits.float()`` (line 825: the 16-bit logits are rebound, so freed, and the
    output holds the fp32 copy), ``shift_logits = logits[..., :-1, :].contiguous()`` (line
    830: a second fp32 copy, whose backward scatters the gradient into a zero-filled fp32
    tensor of the full logits' shape) and ``CrossEntropyLoss()`` on its ``view(-1, vocab)``
    (lines 833-838). The training loop keeps only ``.loss`` (llama-recipes'
    ``loss = model(**batch).loss``), so the fp32 logits go when the loss is made."""
    out = model(input_ids=ids, use_cache=False)
    with tr.in_phase("logits"):
        logits = out.logits.float()
        del out
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = ids[..., 1:].contiguous()
        loss = torch.nn.functional.cross_entropy(
            shift_logits.view(-1, shift_logits.shape[-1]), shift_labels.view(-1)
        )
        del logits, shift_logits
    return loss
