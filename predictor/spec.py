"""The JobSpec contract: what a user submits, validated strictly at the boundary.

Fields that do not apply to a job's task are rejected rather than ignored, so a typo'd or
misplaced setting never silently changes a prediction. Optional fields that do apply get
documented defaults (see ``TASK_DEFAULTS``) filled in after validation, so a dumped spec is
complete and round-trips.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ._execution import MAX_TIME_LIMIT_S, check_env, check_workdir
from ._node_selector import canonical_selector
from ._resources import check_cpus, check_host_memory_gib
from ._spec_array import INDEX_PLACEHOLDER, expand_array, parse_array
from ._spec_fields import check_allowed_weight_dtypes, check_raw_spec
from ._spec_files import iter_spec_dicts
from ._spec_parallel import check_max_tensor_parallel, tensor_parallel_steps
from ._spec_rules import (
    TASK_DEFAULTS,
    check_kv_cache,
    check_layout,
    check_serve,
    check_training_dtypes,
    fill_dtypes,
    fill_fidelity_defaults,
    fill_task_defaults,
    reject_inapplicable,
    resolve_arch,
)
from ._spec_types import AttnImplementation, DType, Framework, Head, LoraTarget, Optimizer, Task
from ._spec_workflow import check_depends_on, check_name, check_no_self_dependency
from .exceptions import SpecError
from .limits import MAX_GPUS, MAX_PARALLEL, MAX_PRIORITY, MAX_RUNTIME_S, MIN_PRIORITY
from .models import ModelArch

__all__ = [
    "INDEX_PLACEHOLDER",
    "TASK_DEFAULTS",
    "AttnImplementation",
    "DType",
    "Framework",
    "Head",
    "JobSpec",
    "LoraTarget",
    "Optimizer",
    "Task",
    "expand_array",
    "iter_spec_dicts",
    "load_specs",
    "parse_array",
    "parse_spec",
    "tensor_parallel_steps",
]


class JobSpec(BaseModel):
    """One job, as submitted. See DESIGN.md "JobSpec" for the contract.

    ``seq_len`` (training) is the longest padded or packed sequence one micro-batch step
    sees: the length activations and logits are sized by, not the dataset's mean length.

    ``zero_stage`` > 0 without ``framework`` is predicted as PyTorch FSDP / ZeRO without fp32
    master weights (optimizer states in the parameter dtype). DeepSpeed keeps fp32 master
    weights and fp32 states, 3× the optimizer memory of bf16 states: set
    ``framework: deepspeed`` for it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    id: str | None = Field(default=None, min_length=1, max_length=200)
    model: str | dict[str, Any]
    task: Task
    framework: Framework | None = None
    weight_dtype: DType | None = None
    kv_cache_dtype: DType | None = None
    # `kv_cache_max_len` (inference): the KV cache is allocated for this many tokens before
    # generation starts, whatever the prompt and output lengths: torchtune's
    # `model.setup_caches(...)` (each layer's `KVCache` at the model's `max_seq_len`), HF's
    # `StaticCache` / `cache_implementation="static"` (`max_cache_len`), gpt-fast. At least
    # `input_len + output_len`. Unset: the cache grows with the tokens (HF's dynamic cache).
    # `kv_cache_query_heads` (inference): the cache stores K and V repeated to the query heads
    # (GQA expanded before caching, as torchtune's `MultiHeadAttention` did at 20747cd87:
    # `k.expand(...)` to `num_heads` before `kv_cache.update`). Unset: false (the KV heads).
    kv_cache_max_len: int | None = Field(default=None, gt=0)
    kv_cache_query_heads: bool | None = None
    compute_dtype: DType | None = None
    batch_size: int = Field(default=1, gt=0)
    gradient_accumulation: int | None = Field(default=None, gt=0)
    seq_len: int | None = Field(default=None, gt=0)
    input_len: int | None = Field(default=None, gt=0)
    output_len: int | None = Field(default=None, gt=0)
    num_requests: int | None = Field(default=None, gt=0)
    steps: int | None = Field(default=None, gt=0)
    optimizer: Optimizer | None = None
    gradient_checkpointing: bool | None = None
    lora_rank: int | None = Field(default=None, gt=0)
    lora_target: LoraTarget | None = None
    n_gpus: int = Field(default=1, gt=0, le=MAX_GPUS)
    tensor_parallel: int = Field(default=1, gt=0, le=MAX_PARALLEL)
    # How far an OOM retry may raise `tensor_parallel` (see predictor/_spec_parallel.py).
    max_tensor_parallel: int | None = Field(default=None, gt=0, le=MAX_PARALLEL)
    pipeline_parallel: int = Field(default=1, gt=0, le=MAX_PARALLEL)
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    gpu: str | None = None
    command: list[str] | None = None
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    deadline_s: float | None = Field(default=None, gt=0, le=MAX_RUNTIME_S)
    # `serve` deployments (see predictor.serving and ``_spec_rules.check_serve``).
    request_rate: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    max_model_len: int | None = None
    allowed_weight_dtypes: tuple[DType, ...] | None = None
    duration_s: float | None = None
    # Memory fidelity (second wave). `compile`: the job runs under torch.compile or a compiled
    # stack (fused norms/SwiGLU; the traced tier then defers to the analytical one).
    # `activation_offload`: saved activations live in host memory. `chunked_loss`: the loss
    # upcasts one chunk of logits at a time (default on for torchtune and Unsloth).
    # `adapter_dtype`: dtype of LoRA adapters and their optimizer states (default fp32 for
    # hf/peft/other as in PEFT, else the compute dtype).
    # `lora_dropout`: dropout probability on each adapter's input (PEFT's `LoraConfig`,
    # LitGPT's and torchtune's `lora_dropout`); above 0 every adapted input keeps a dropped
    # copy and a 1-byte mask for backward. Unset: 0, PEFT's default.
    # `attn_implementation`: HF's name for the attention kernel; `eager` stores the s×s scores
    # (transformers before 4.36 ran Llama eagerly). Unset: flash/SDPA (fp32 and encoders eager).
    compile: bool | None = None
    activation_offload: bool | None = None
    chunked_loss: bool | None = None
    adapter_dtype: DType | None = None
    lora_dropout: float | None = Field(default=None, ge=0.0, lt=1.0)
    attn_implementation: AttnImplementation | None = None
    # `double_quant`: nf4 weights whose absmax scales are quantised again (bitsandbytes'
    # `bnb_4bit_use_double_quant`, LitGPT's `bnb.nf4-dq`): 0.516 instead of 0.5625 bytes per
    # weight. Unset: true for torchtune (torchao NF4) and unsloth, false otherwise.
    double_quant: bool | None = None
    # `zero_grad_set_to_none`: whether the training loop's `zero_grad()` frees the gradients
    # (torch's `set_to_none`). False keeps every gradient allocated, zeroed, through the next
    # forward: torch < 2.0's default (pytorch#92731 flipped it in 2.0), which HF's Trainer
    # used until transformers#22136 (2023-03) passed `set_to_none=True`. Unset: true.
    zero_grad_set_to_none: bool | None = None
    # `head` (training): `lm` (vocabulary logits) or `classification` (a sequence-classification
    # head: no vocabulary logits). Unset: lm.
    # `torch_version` (training): the torch release the job runs ("1.10", "2.1.0"). Unset: a
    # current one.
    # Below 1.11 softmax's backward node also keeps its input (pytorch#65242 stopped that).
    # `transformers_version` (training): the transformers release the job runs ("4.31"). Unset:
    # a current one. Before 4.50 Llama's loss upcast the whole logits to fp32 and copied the
    # shifted logits (`logits[..., :-1, :].contiguous()`); 4.50 shifts the labels instead.
    # `use_cache` (training): the training forward keeps every layer's K and V (HF's
    # `use_cache`, which the Llama config defaults to true) until the loop drops the output:
    # left on when the loop checkpoints with FSDP's wrapper instead of HF's own (which turns it
    # off), e.g. llama-recipes @e5970e2e. Unset: false.
    use_cache: bool | None = None
    head: Head | None = None
    torch_version: str | None = Field(default=None, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    transformers_version: str | None = Field(default=None, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    # Execution (read by the worker, not the predictor): see predictor/_execution.py.
    time_limit_s: float | None = Field(default=None, gt=0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)
    env: dict[str, str] | None = None
    workdir: str | None = None
    # Workflow and identity (see predictor/_spec_workflow.py): who runs it, and the job ids
    # that must succeed before it is placed (afterok). The client fills `user` at submit.
    user: str | None = None
    team: str | None = None
    depends_on: tuple[str, ...] | None = None

    @field_validator("user", "team", mode="before")
    @classmethod
    def _names(cls, v: Any, info: Any) -> str | None:
        return check_name(info.field_name, v)

    @field_validator("depends_on", mode="before")
    @classmethod
    def _depends_on(cls, v: Any) -> tuple[str, ...] | None:
        return check_depends_on(v)

    # Host resources (predictor/_resources.py): unset, the node's share per GPU the job uses.
    cpus: float | None = None
    host_memory_gib: float | None = None
    # Nodes the job may run on (predictor/_node_selector.py): per label key, the accepted
    # values, e.g. {"gpu-model": ["V100M16", "V100M32"]}; unset: any node.
    node_selector: dict[str, tuple[str, ...]] | None = None

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str] | None:
        return check_env(v)

    @field_validator("workdir", mode="before")
    @classmethod
    def _workdir(cls, v: Any) -> str | None:
        return check_workdir(v)

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpus(cls, v: Any) -> float | None:
        return check_cpus(v)

    @field_validator("node_selector", mode="before")
    @classmethod
    def _node_selector(cls, v: Any) -> dict[str, tuple[str, ...]] | None:
        try:
            sel = canonical_selector(v, "`node_selector`")
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        return None if sel is None else dict(sel)

    @field_validator("host_memory_gib", mode="before")
    @classmethod
    def _host_memory(cls, v: Any) -> float | None:
        return check_host_memory_gib(v)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_and_strings(cls, data: Any) -> Any:
        return check_raw_spec(data, set(cls.model_fields))

    @model_validator(mode="before")
    @classmethod
    def _known_dtypes(cls, data: Any) -> Any:
        return check_allowed_weight_dtypes(data)

    @model_validator(mode="after")
    def _check_and_fill(self) -> JobSpec:
        # Order matters: applicability before defaults, fidelity and serve defaults before
        # dtypes, every fill before the checks that read the filled values.
        reject_inapplicable(self)
        check_no_self_dependency(self.id, self.depends_on)
        fill_task_defaults(self)
        fill_fidelity_defaults(self)
        if self.task is Task.SERVE:
            check_serve(self)
        fill_dtypes(self)
        check_training_dtypes(self)
        check_kv_cache(self)
        check_layout(self)
        check_max_tensor_parallel(self)
        return self

    @property
    def _explicit(self) -> set[str]:
        return set(self.model_fields_set)

    # Derived quantities, used throughout the predictor.
    @property
    def arch(self) -> ModelArch:
        return resolve_arch(self.model)

    @property
    def data_parallel(self) -> int:
        return self.n_gpus // (self.tensor_parallel * self.pipeline_parallel)

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step processes across the whole job (training only)."""
        assert self.seq_len is not None and self.gradient_accumulation is not None
        return self.batch_size * self.gradient_accumulation * self.data_parallel * self.seq_len

    @property
    def model_name(self) -> str:
        return self.arch.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict without ``None`` fields; parses back to an equal spec."""
        return self.model_dump(mode="json", exclude_none=True)


def _format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        ctx_inp = err.get("input")
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if loc in JobSpec.model_fields and err["type"] not in ("value_error",):
            parts.append(f"`{loc}`: {msg} (got {ctx_inp!r})")
        else:
            parts.append(msg)
    return "; ".join(dict.fromkeys(parts))


def parse_spec(data: Mapping[str, Any] | JobSpec) -> JobSpec:
    """Validate one spec; raise :class:`SpecError` with a single readable message."""
    if isinstance(data, JobSpec):
        return data
    try:
        return JobSpec.model_validate(data)
    except SpecError:
        raise
    except ValidationError as exc:
        # Errors raised inside validators arrive wrapped; surface our own message unchanged.
        for err in exc.errors():
            original = (err.get("ctx") or {}).get("error")
            if isinstance(original, SpecError):
                raise original from None
        raise SpecError(_format_validation_error(exc)) from None


_MAX_REPORTED_ERRORS = 50


def load_specs(path: str | Path) -> list[JobSpec]:
    """Read and validate every job in a file. Every bad job is reported (one line each, with
    its location, up to 50), not only the first, so a file is fixed in one pass."""
    out = []
    errors: list[str] = []
    for where, obj in iter_spec_dicts(path):
        try:
            out.append(parse_spec(obj))
        except SpecError as exc:
            errors.append(f"{where}: {exc}")
    if errors:
        more = len(errors) - _MAX_REPORTED_ERRORS
        shown = errors[:_MAX_REPORTED_ERRORS] + ([f"... and {more} more"] if more > 0 else [])
        raise SpecError("\n".join(shown))
    return out
