"""LitGPT's program, where it allocates differently from the HF model the tracer builds.

Framework ``other`` is traced as LitGPT (Lightning AI's ``litgpt``/``lit-gpt``), the non-HF
stack whose published rows the data holds; :func:`share_qkv_dropout` already gives it LitGPT's
one dropout per fused QKV input. Read in LitGPT's code (``lit_gpt/model.py``, ``lora.py``,
``utils.py`` @8641822 and ``litgpt/`` @00af8b0d), four more differences change what a
training step holds:

* **Fused QKV.** ``CausalSelfAttention`` runs one ``attn`` linear for q, k and v and splits
  its output with views; q and k are copied by RoPE, but with as many KV heads as query heads
  (MHA) v stays a view, so the attention kernel's saved v keeps the whole ``(B, T, q+k+v)``
  output alive, where HF's separate ``v_proj`` keeps only v. (With fewer KV heads LitGPT
  expands or repeats k and v into copies, and the fused output is freed, as in HF.)
* **Untied head.** ``GPT`` has its own ``lm_head`` and ``wte``; a checkpoint with tied
  embeddings is converted into two copies, so the model holds both tables.
* **Loss.** Fine-tuning runs ``model(x, lm_head_chunk_size=128)`` and
  ``chunked_cross_entropy``: the head runs on 128-token chunks, and Fabric's wrapper returns
  them converted to fp32 (the precision plugin's ``convert_output``), so each chunk's
  cross-entropy is taken in fp32 on an fp32 copy (not HF's whole-sequence upcast). Under QLoRA
  the Fabric bitsandbytes plugin replaces every ``nn.Linear``, the head too.
* **The loop keeps the last graph.** ``logits`` and ``loss`` are rebound only when the next
  micro-batch computes them, so the previous graph lives through the optimizer step and the
  next forward; bitsandbytes 0.41/0.42 (the releases LitGPT pinned) keep each 4-bit matmul's
  input in that graph (see ``_DequantMatmul``), so those inputs, and the logits chunks, are
  alive during the next micro-batch's forward (``_step._train``; at the traced length, an
  upper estimate when the previous micro-batch was shorter).
"""

from __future__ import annotations

from typing import Any

import torch

from ..spec import Framework, JobSpec, Task

__all__ = [
    "LM_HEAD_CHUNK",
    "fuse_qkv_outputs",
    "is_litgpt",
    "litgpt_loss",
    "untie_head",
    "uses_litgpt_loss",
]

#: ``lm_head_chunk_size`` of LitGPT's fine-tuning scripts (finetune/lora.py, full.py, adapter.py).
LM_HEAD_CHUNK = 128
_V = ("v_proj", "value")
_QK = (("q_proj", "k_proj"), ("query", "key"))


def is_litgpt(spec: JobSpec) -> bool:
    """Whether the job is traced as LitGPT's program (framework ``other``)."""
    return spec.framework is Framework.OTHER


def untie_head(model: Any) -> None:
    """Give a tied model its own head weight, as LitGPT's converted checkpoints have."""
    head = model.get_output_embeddings()
    if head is None or head.weight is not model.get_input_embeddings().weight:
        return
    w = head.weight
    head.weight = torch.nn.Parameter(torch.empty_like(w), requires_grad=w.requires_grad)
    model.config.tie_word_embeddings = False
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().tie_word_embeddings = False


def _fused_view(_module: Any, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
    """v as the last third of a fused ``(…, 3·C)`` output, so it keeps the whole buffer."""
    c = out.shape[-1]
    fused = out.new_empty(*out.shape[:-1], 3 * c)
    v = fused[..., 2 * c :]
    v.copy_(out)
    return v


def fuse_qkv_outputs(model: Any) -> int:
    """Make each MHA attention's v a view of a fused QKV-sized output (training only: at
    inference LitGPT copies k and v into its cache). Returns the number of layers hooked."""
    n = 0
    for attn in model.modules():
        names = [v for v in _V if isinstance(getattr(attn, v, None), torch.nn.Module)]
        if not names or not any(all(hasattr(attn, x) for x in qk) for qk in _QK):
            continue
        cfg = getattr(attn, "config", None)
        heads = getattr(cfg, "num_attention_heads", None)
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        if heads is None or kv != heads:
            continue
        getattr(attn, names[0]).register_forward_hook(_fused_view)
        n += 1
    return n


def litgpt_loss(
    model: Any, ids: torch.Tensor, spec: JobSpec, tr: Any
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """LitGPT's fine-tuning loss; returns it and the logits chunks the loop keeps alive."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    hidden = base.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    with tr.in_phase("logits"):
        chunks = [head(h) for h in hidden.split(LM_HEAD_CHUNK, dim=1)]
        # Fabric hands the module's floating outputs back in the default dtype, fp32:
        # ``_FabricModule.forward`` calls the precision plugin's ``convert_output``
        # (``apply_to_collection(..., dst_type=torch.get_default_dtype())`` in the bf16-true,
        # mixed, bitsandbytes and FSDP plugins, lightning @71aed751 as at HEAD), a new list
        # built while the old one is alive.
        chunks = [c.to(torch.float32) for c in chunks]
        chunks[-1] = chunks[-1][..., :-1, :]
        targets = ids[..., 1:].split(LM_HEAD_CHUNK, dim=1)
        losses = [
            torch.nn.functional.cross_entropy(
                c.reshape(-1, c.size(-1)), t.reshape(-1), reduction="none"
            )
            for c, t in zip(chunks, targets, strict=True)
        ]
        loss = torch.cat(losses).mean()
    return loss, chunks


def uses_litgpt_loss(spec: JobSpec, model: Any) -> bool:
    """LitGPT's fine-tuning scripts chunk the head; its pretraining script does not."""
    return (
        is_litgpt(spec)
        and spec.task is not Task.PRETRAIN
        and model.get_output_embeddings() is not None
    )
