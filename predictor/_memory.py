"""Analytical per-GPU peak memory, vectorised over jobs and GPU types.

The model follows the usual accounting (ZeRO paper; Korthikanti et al. 2022 for activations),
adapted to what current frameworks really keep alive:

* flash/SDPA attention everywhere, so no ``s²`` score matrices are stored;
* SwiGLU MLPs keep gate, up, act(gate) and their product (4·ffn per token), plain GELU MLPs 2·ffn;
* eager RMSNorm/LayerNorm in HF-style code upcasts to fp32 and saves those copies; compiled
  stacks (Megatron, Unsloth, vLLM..., or ``compile``) do not; torchtune is eager unless compiled;
* PEFT LoRA adapters keep a copy of each adapted linear's input (PEFT casts it to the adapter
  dtype), and HF ``generate`` computes only the last token's logits;
* the training peak is either the start of backward (activations + logits live, gradients not
  yet materialised except the ones carried across micro-batches) or the optimizer step
  (all gradients live + the foreach-AdamW temporaries), whichever is larger.

All functions are pure numpy over :class:`JobArrays`; results are bytes unless named ``_gib``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._jobarrays import DTYPES, FRAMEWORKS, OPTIMIZERS, TASKS, JobArrays
from .spec import DType, Framework, Optimizer, Task

__all__ = ["MemoryModel", "memory_breakdown_gib"]

GIB = float(1024**3)

_IDX_T = {t: TASKS.index(t) for t in Task}
_IDX_F = {f: FRAMEWORKS.index(f) for f in Framework}
_IDX_O = {o: OPTIMIZERS.index(o) for o in Optimizer}


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Constants of the memory model; the learned tier corrects what these get wrong."""

    # CUDA context + cuBLAS/cuDNN workspaces with lazy module loading (CUDA 12), per GPU type.
    cuda_context_gib: tuple[tuple[str, float], ...] = (
        ("A100-40GB", 0.45),
        ("A100-80GB", 0.45),
        ("H100-80GB", 0.55),
        ("H200-141GB", 0.55),
        ("B200-180GB", 0.70),
    )
    cuda_context_default_gib: float = 0.55
    nccl_buffers_gib: float = 0.5  # per GPU when n_gpus > 1 (NCCL channels, comm buffers)
    serving_engine_extra_gib: float = 1.0  # CUDA graphs, sampler and scheduler buffers
    allocator_slack_train: float = 0.06  # reserved − allocated, share of tensor memory
    allocator_slack_infer: float = 0.03
    serving_prefill_token_cap: float = 8192.0  # chunked prefill (vLLM v1 max_num_batched_tokens)

    def context_gib(self, gpu: str) -> float:
        return dict(self.cuda_context_gib).get(gpu, self.cuda_context_default_gib)


def _isin(values: np.ndarray, members: list[int]) -> np.ndarray:
    return np.isin(values, np.asarray(members, dtype=np.float64))


def _components(j: JobArrays, mm: MemoryModel) -> dict[str, np.ndarray]:
    """Per-job tensor memory (bytes, shape ``(n_jobs,)``) before GPU-dependent overhead."""
    task, fw, opt = j.task, j.framework, j.optimizer
    is_infer = task == _IDX_T[Task.INFERENCE]
    is_peft = _isin(task, [_IDX_T[Task.LORA], _IDX_T[Task.QLORA]])
    is_full = ~is_infer & ~is_peft
    serving = _isin(
        fw, [_IDX_F[Framework.VLLM], _IDX_F[Framework.TRTLLM], _IDX_F[Framework.SGLANG]]
    )
    # Fused norms and SwiGLU come from a compiled stack: serving engines, Megatron/TE, Unsloth,
    # or any job with `compile` (torchtune runs eagerly unless compiled).
    fused_norms = _isin(
        fw,
        [
            _IDX_F[f]
            for f in (
                Framework.VLLM,
                Framework.TRTLLM,
                Framework.SGLANG,
                Framework.MEGATRON,
                Framework.UNSLOTH,
            )
        ],
    ) | (j.compiled > 0)
    master_weights = _isin(fw, [_IDX_F[Framework.DEEPSPEED], _IDX_F[Framework.MEGATRON]]) & (
        j.weight_bytes < 4
    )
    tp, pp, dp = j.tp, j.pp, j.dp
    zero = np.where(is_infer, 0.0, j.zero_stage)
    a = j.compute_bytes

    # Weights: quantised formats keep embeddings and the lm head in bf16 (bitsandbytes, GPTQ,
    # AWQ, ModelOpt all skip them).
    body = j.total_params - j.embed_params
    embed_bytes = j.embed_params * np.where(j.weight_is_quantised > 0, 2.0, j.weight_bytes)
    embed_share = np.where(pp > 1, 0.5, 1.0)  # first stage holds the input table, last the head
    weights = body * j.weight_bytes / (tp * pp) + embed_bytes * embed_share / tp
    gather = np.where(zero >= 3, 2.0 * j.layer_params * a / tp, 0.0)  # ZeRO-3 prefetch buffers
    weights = np.where(zero >= 3, weights / dp + gather, weights)

    # Trainable parameters: PEFT adapters in `adapter_dtype` (fp32 in HF PEFT by default,
    # autocast_adapter_dtype); full fine-tunes train the weights in their stored dtype.
    trainable = np.where(is_peft, j.lora_params, np.where(is_full, j.total_params, 0.0)) / (tp * pp)
    param_bytes = np.where(is_peft, j.adapter_bytes, j.weight_bytes)
    adapters = np.where(is_peft, trainable * param_bytes, 0.0)
    adapters = np.where(zero >= 3, adapters / dp, adapters)
    weights = weights + adapters
    # Autocast (fp32 weights, 16-bit compute) caches a 16-bit copy of every trainable weight
    # for the whole forward/backward.
    amp = is_full & (j.weight_bytes == 4.0) & (a == 2.0)
    weights = weights + np.where(amp, j.total_params / (tp * pp) * a, 0.0)

    grads = trainable * param_bytes
    grads = np.where(zero >= 2, grads / dp, grads)
    grad_first = np.where(is_full, j.embed_params / tp * param_bytes, 0.0)  # head grad comes first

    state_bytes = np.select(
        [
            opt == _IDX_O[Optimizer.ADAMW],
            _isin(opt, [_IDX_O[Optimizer.ADAMW_8BIT], _IDX_O[Optimizer.PAGED_ADAMW_8BIT]]),
            opt == _IDX_O[Optimizer.SGD],
            opt == _IDX_O[Optimizer.ADAFACTOR],
        ],
        [
            np.where(master_weights, 8.0, 2.0 * param_bytes),
            np.full_like(param_bytes, 2.0),
            np.where(master_weights, 4.0, param_bytes),
            8.0 / np.maximum(j.hidden, 1.0) * 2.0,  # factored row + column second moments
        ],
        default=0.0,
    )
    state_bytes = state_bytes + np.where(master_weights & (opt != _IDX_O[Optimizer.NONE]), 4.0, 0.0)
    optimizer = trainable * state_bytes
    optimizer = np.where(zero >= 1, optimizer / dp, optimizer)
    # torch's foreach AdamW materialises one moment-sized temporary during the step.
    foreach = (opt == _IDX_O[Optimizer.ADAMW]) & ~master_weights
    step_temp = np.where(foreach, trainable * param_bytes, 0.0)
    step_temp = np.where(zero >= 1, step_temp / dp, step_temp)

    # Training activations per micro-batch (bytes per token per layer, then scaled).
    norm_bytes = np.where(fused_norms, a, a + 4.0)  # eager norms also save their fp32 upcast
    attn = a * (j.hidden + 2.0 * j.attn_dim + j.kv_width)
    # A frozen MLP (PEFT) needs no inputs for weight gradients: only what the activation
    # function's backward reads (gate and up outputs, act(gate)) survives.
    # Fused SwiGLU (torch.compile in torchtune, Unsloth, Megatron/TE) saves gate and up only
    # and recomputes act(gate) in backward.
    fused_act = j.gated * np.where(fused_norms, 1.0, 0.0)
    # bitsandbytes' 4-bit matmul saves its input whether or not the weight trains, so QLoRA
    # keeps every linear's input like a full fine-tune; plain frozen nn.Linear does not.
    is_qlora = task == _IDX_T[Task.QLORA]
    mlp = np.where(
        is_peft & ~is_qlora,
        a * j.ffn * (1.0 + 2.0 * j.gated - fused_act),
        a * (j.hidden + j.ffn * (2.0 + 2.0 * j.gated - fused_act)),
    )
    # LoRA adapters save their inputs for the adapter weight gradients. PEFT casts each
    # adapted linear's input to the adapter dtype and, under autocast, back: every adapter
    # keeps its own 16-bit copy (down_proj's is act(gate)·up). Adapters in the compute dtype
    # share the layer's input, so only inputs a frozen layer would not keep are new.
    peft_casts = (j.adapter_bytes != a) & is_peft
    lora_saved = np.where(
        peft_casts, a * j.lora_in_width, np.where(is_peft, a * j.lora_new_width, 0.0)
    )
    # LoRA dropout: each adapter also keeps its 1-byte mask; its dropped copy replaces the
    # (cast) input it saved. Separate compute-dtype adapters on one input (torchtune's q/v)
    # keep a copy each as well, which only the traced tier counts.
    lora_saved = lora_saved + np.where(is_peft & (j.lora_dropout > 0), j.lora_in_width, 0.0)
    route = j.is_moe * a * j.hidden * j.n_active_experts * 2.0
    # Eager attention materialises the s×s scores: flash kernels do not run in fp32, and HF's
    # encoder models (BERT) predate SDPA. Per score: scores + softmax + dropout output (fp32
    # under autocast, 4 bytes each at most) + the 1-byte dropout mask.
    fp32 = j.compute_dtype == DTYPES.index(DType.FP32)
    hf_like = _isin(fw, [_IDX_F[Framework.HF], _IDX_F[Framework.PEFT]])
    eager_attn = fp32 | ((j.encoder_only > 0) & hf_like) | (j.eager_attn > 0)
    score_bytes = np.where(fp32, 13.0, a + 9.0)
    # torch < 1.11 also keeps softmax's input (fp32 in fp32 runs and under autocast).
    score_bytes = score_bytes + np.where(j.softmax_keeps_input > 0, 4.0, 0.0)
    scores = np.where(eager_attn, j.n_heads * j.seq_len * score_bytes, 0.0)
    per_token_layer = attn + mlp + lora_saved + route + scores + 2.0 * j.hidden * norm_bytes
    tokens_mb = j.batch * j.seq_len
    layers_here = j.n_layers / pp
    inflight = np.where(pp > 1, np.minimum(pp, j.grad_accum), 1.0)
    full_layer = tokens_mb * per_token_layer / tp
    layer_input = tokens_mb * a * j.hidden / tp
    acts_train = (
        np.where(
            j.act_offload > 0,
            full_layer,  # saved activations wait in host memory; one layer's are on the GPU
            np.where(
                j.checkpointing > 0,
                layer_input * layers_here * inflight + full_layer,
                full_layer * layers_here * inflight,
            ),
        )
        + 2.0 * layer_input
    )
    logit_bytes = np.select(
        [
            fw == _IDX_F[Framework.UNSLOTH],
            j.chunked_loss > 0,
            _isin(fw, [_IDX_F[Framework.FSDP], _IDX_F[Framework.MEGATRON]]),
        ],
        # Unsloth fuses the loss; a chunked loss (torchtune's default) keeps 16-bit logit
        # chunks and upcasts one at a time.
        [np.full_like(a, 4.0), a + 1.5, a + 8.0],
        default=a + 12.0,  # bf16 logits, fp32 upcast, log-softmax and its gradient (HF)
    )
    # transformers < 4.50's Llama loss also copies the shifted fp32 logits (`.contiguous()`).
    logit_bytes = logit_bytes + np.where(
        (j.shifted_logits > 0) & (j.chunked_loss == 0) & (fw != _IDX_F[Framework.UNSLOTH]), 4.0, 0.0
    )
    # A sequence-classification head's logits are batch × labels: nothing next to these.
    logits_train = np.where(j.classify > 0, 0.0, tokens_mb * j.vocab / tp * logit_bytes)

    # Inference: KV cache for every sequence in the batch at full length, one layer's prefill
    # activations, and logits: only the last token's, as HF `generate` (logits_to_keep=1) and
    # the engines compute them; generate also keeps an fp32 copy for sampling.
    # A preallocated cache (`kv_cache_max_len`) holds its full length from the start; one that
    # stores K/V expanded to the query heads (`kv_cache_query_heads`) is that much wider.
    kv = (
        (1.0 - j.encoder_only)
        * j.n_layers
        / pp
        * j.kv_dim
        * j.kv_heads_scale
        / tp
        * j.kv_bytes
        * j.batch
        * j.kv_len
    )
    prefill_tokens = j.batch * j.input_len
    prefill_tokens = np.where(
        serving, np.minimum(prefill_tokens, mm.serving_prefill_token_cap), prefill_tokens
    )
    acts_infer = (
        prefill_tokens
        * (
            a * (3.0 * j.hidden + j.ffn * (1.0 + 2.0 * j.gated))
            + fp32 * j.n_heads * j.input_len * 8.0
        )
        / tp
    )
    logits_infer = np.where(serving, j.batch * j.vocab * 4.0, j.batch * j.vocab * (a + 4.0)) / tp

    # Gradients are all alive at the start of backward when an earlier micro-batch made them,
    # or when `zero_grad` only zeroed the last step's (torch < 2.0's `set_to_none=False`).
    all_grads = (j.grad_accum > 1) | (j.grads_kept > 0)
    # `use_cache` in training: every layer's K and V live with the logits at the loss.
    kv_train = j.train_kv * j.n_layers / pp * j.kv_dim / tp * a * tokens_mb
    start_of_backward = (
        acts_train + logits_train + kv_train + np.where(all_grads, grads, grad_first)
    )
    optimizer_step = grads + step_temp
    backward_wins = start_of_backward >= optimizer_step

    zeros = np.zeros_like(a)
    out = {
        "weights": weights,
        "gradients": np.where(
            is_infer,
            zeros,
            np.where(backward_wins, np.where(all_grads, grads, grad_first), grads),
        ),
        "optimizer": np.where(
            is_infer, zeros, optimizer + np.where(backward_wins, zeros, step_temp)
        ),
        "activations": np.where(is_infer, acts_infer, np.where(backward_wins, acts_train, zeros)),
        "kv_cache": np.where(is_infer, kv, np.where(backward_wins, kv_train, zeros)),
        "logits": np.where(is_infer, logits_infer, np.where(backward_wins, logits_train, zeros)),
    }
    out["_serving"] = serving.astype(np.float64)
    out["_multi_gpu"] = (j.n_gpus > 1).astype(np.float64)
    out["_is_infer"] = is_infer.astype(np.float64)
    return out


def memory_breakdown_gib(
    j: JobArrays, gpu_names: tuple[str, ...], mm: MemoryModel | None = None
) -> dict[str, np.ndarray]:
    """Per-GPU peak breakdown in GiB, each of shape ``(n_jobs, n_gpu_types)``.

    ``overhead`` is memory no tensor holds: CUDA context, NCCL buffers, serving-engine extras
    and allocator slack. The peak is the sum of all keys.
    """
    mm = mm or MemoryModel()
    comp = _components(j, mm)
    serving, multi, is_infer = comp.pop("_serving"), comp.pop("_multi_gpu"), comp.pop("_is_infer")
    tensors = sum(comp.values())
    slack = np.where(is_infer > 0, mm.allocator_slack_infer, mm.allocator_slack_train) * tensors
    fixed = slack + multi * mm.nccl_buffers_gib * GIB + serving * mm.serving_engine_extra_gib * GIB
    context = np.array([mm.context_gib(g) for g in gpu_names]) * GIB
    n_g = len(gpu_names)
    out = {k: np.repeat((v / GIB)[:, None], n_g, axis=1) for k, v in comp.items()}
    out["overhead"] = (fixed[:, None] + context[None, :]) / GIB
    return out
