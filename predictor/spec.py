"""The JobSpec contract: what a user submits, validated strictly at the boundary.

Fields that do not apply to a job's task are rejected rather than ignored, so a typo'd or
misplaced setting never silently changes a prediction. Optional fields that do apply get
documented defaults (see ``TASK_DEFAULTS``) filled in after validation, so a dumped spec is
complete and round-trips.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .exceptions import SpecError
from .gpus import GPU_NAMES
from .models import ModelArch, resolve_model

__all__ = [
    "TASK_DEFAULTS",
    "DType",
    "Framework",
    "JobSpec",
    "LoraTarget",
    "Optimizer",
    "Task",
    "iter_spec_dicts",
    "load_specs",
    "parse_spec",
]


class Task(StrEnum):
    INFERENCE = "inference"
    FULL_FINETUNE = "full_finetune"
    LORA = "lora"
    QLORA = "qlora"
    PRETRAIN = "pretrain"
    SERVE = "serve"  # a long-running deployment planned by SLO (predictor.serving)

    @property
    def is_training(self) -> bool:
        return self not in (Task.INFERENCE, Task.SERVE)

    @property
    def is_peft(self) -> bool:
        return self in (Task.LORA, Task.QLORA)


class Framework(StrEnum):
    HF = "hf"
    VLLM = "vllm"
    TRTLLM = "trtllm"
    SGLANG = "sglang"
    TORCHTUNE = "torchtune"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"
    MEGATRON = "megatron"
    PEFT = "peft"
    UNSLOTH = "unsloth"
    OTHER = "other"

    @property
    def is_serving_engine(self) -> bool:
        """Engines that pre-allocate a KV-cache pool up to ``gpu_memory_utilization``."""
        return self in (Framework.VLLM, Framework.TRTLLM, Framework.SGLANG)


class DType(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    NF4 = "nf4"
    FP4 = "fp4"

    @property
    def bits(self) -> float:
        return _DTYPE_BITS[self]


# Storage bits per element, without quantisation scales (the memory model adds those).
_DTYPE_BITS: dict[DType, float] = {
    DType.FP32: 32,
    DType.BF16: 16,
    DType.FP16: 16,
    DType.FP8: 8,
    DType.INT8: 8,
    DType.INT4: 4,
    DType.NF4: 4,
    DType.FP4: 4,
}


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw_8bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    SGD = "sgd"
    ADAFACTOR = "adafactor"
    NONE = "none"


class LoraTarget(StrEnum):
    ALL_LINEAR = "all_linear"
    ATTENTION = "attention"
    QV = "qv"


_TRAINING_FIDELITY = ("activation_offload", "chunked_loss")
_INFERENCE_ONLY = ("input_len", "output_len", "num_requests", "kv_cache_dtype")
_TRAINING_ONLY = (
    "seq_len",
    "steps",
    "gradient_accumulation",
    "optimizer",
    "gradient_checkpointing",
    "zero_stage",
    *_TRAINING_FIDELITY,
)
_PEFT_ONLY = ("lora_rank", "lora_target", "adapter_dtype")
_SERVE_ONLY = (
    "request_rate",
    "slo_ttft_s",
    "slo_tpot_s",
    "max_model_len",
    "allowed_weight_dtypes",
    "duration_s",
)

# Documented defaults, applied only to fields that apply to the task.
TASK_DEFAULTS: dict[str, Any] = {
    "input_len": 512,
    "output_len": 256,
    "seq_len": 2048,
    "steps": 1000,
    "gradient_accumulation": 1,
    "optimizer": Optimizer.ADAMW,
    "gradient_checkpointing": False,
    "zero_stage": 0,
    "activation_offload": False,
    "lora_rank": 16,
    "lora_target": LoraTarget.ALL_LINEAR,
}


def _model_key(model: str | dict[str, Any]) -> str:
    return model if isinstance(model, str) else "\x00" + json.dumps(model, sort_keys=True)


@lru_cache(maxsize=4096)
def _resolve_cached(key: str) -> ModelArch:
    # Keyed by the JSON text so explicit-architecture dicts cache too; catalogue lookups and
    # config.json reads then happen once per distinct model, not once per job.
    if key.startswith("\x00"):
        return resolve_model(json.loads(key[1:]))
    return resolve_model(key)


def _default_compute(weight: DType) -> DType:
    # Weight-only quantisation (int8/int4/nf4) dequantises into bf16 matmuls; fp8/fp4 weights
    # imply the low-precision tensor-core path on GPUs that have it.
    if weight in (DType.FP32, DType.BF16, DType.FP16, DType.FP8, DType.FP4):
        return weight
    return DType.BF16


def _check_serve(spec: JobSpec) -> None:
    """Validate and fill a ``serve`` spec in place (the frozen model is still being built).

    The rules and defaults live in :mod:`predictor.serving._specrules` so this file stays a
    thin contract; that module imports nothing from here at import time.
    """
    from .serving._specrules import check_serve_spec

    check_serve_spec(spec, lambda name, value: object.__setattr__(spec, name, value))


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
    n_gpus: int = Field(default=1, gt=0)
    tensor_parallel: int = Field(default=1, gt=0)
    pipeline_parallel: int = Field(default=1, gt=0)
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    gpu: str | None = None
    command: list[str] | None = None
    priority: int = 0
    deadline_s: float | None = Field(default=None, gt=0)
    # `serve` deployments (see predictor.serving and ``_check_serve``).
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
    compile: bool | None = None
    activation_offload: bool | None = None
    chunked_loss: bool | None = None
    adapter_dtype: DType | None = None

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_and_strings(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise SpecError(f"a job spec must be a JSON/YAML object; got {type(data).__name__}")
        allowed = set(cls.model_fields)
        for key in data:
            if key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1)
                did = f"; did you mean `{hint[0]}`?" if hint else ""
                raise SpecError(
                    f"unknown field `{key}` (got {data[key]!r}){did} "
                    f"Allowed fields: {', '.join(sorted(allowed))}"
                )
        cmd = data.get("command")
        if isinstance(cmd, str):
            raise SpecError(
                f"`command` must be an argv list, not a shell string; got {cmd!r}. "
                f"Write it as {json.dumps(cmd.split())}"
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _known_dtypes(cls, data: Any) -> Any:
        value = data.get("allowed_weight_dtypes") if isinstance(data, Mapping) else None
        if value is None:
            return data
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise SpecError(
                f"`allowed_weight_dtypes` must be a list of dtypes; got {value!r}. "
                "Example: ['bf16', 'fp8']"
            )
        names = [d.value for d in DType]
        for item in value:
            if str(getattr(item, "value", item)) not in names:
                raise SpecError(
                    f"`allowed_weight_dtypes`: unknown dtype {item!r}; use {', '.join(names)}"
                )
        return data

    @model_validator(mode="after")
    def _check_and_fill(self) -> JobSpec:
        task = self.task
        inapplicable: list[str] = []
        if task is not Task.SERVE:
            inapplicable += [f for f in _SERVE_ONLY if getattr(self, f) is not None]
        else:
            inapplicable += [f for f in ("num_requests",) if getattr(self, f) is not None]
        if task.is_training:
            inapplicable += [f for f in _INFERENCE_ONLY if getattr(self, f) is not None]
            if not task.is_peft:
                inapplicable += [f for f in _PEFT_ONLY if getattr(self, f) is not None]
        else:
            inapplicable += [f for f in _TRAINING_ONLY + _PEFT_ONLY if getattr(self, f) is not None]
        if inapplicable:
            f = inapplicable[0]
            fix = {
                "seq_len": "for inference give `input_len` and `output_len`",
                "output_len": "training jobs use `seq_len`",
                "input_len": "training jobs use `seq_len`",
                "lora_rank": "use task `lora` or `qlora`, or drop the field",
                "lora_target": "use task `lora` or `qlora`, or drop the field",
                "num_requests": "a `serve` deployment takes `request_rate` and `duration_s`",
            }.get(f, "use task `serve`, or drop the field" if f in _SERVE_ONLY else "remove it")
            raise SpecError(
                f"`{f}` does not apply to `{task.value}` jobs (got {getattr(self, f)!r}); {fix}"
            )

        applicable = (
            _TRAINING_ONLY + (_PEFT_ONLY if task.is_peft else ())
            if task.is_training
            else _INFERENCE_ONLY
        )
        for f in applicable:
            if getattr(self, f) is None and f in TASK_DEFAULTS:
                object.__setattr__(self, f, TASK_DEFAULTS[f])

        self._fill_fidelity_defaults()
        if task is Task.SERVE:
            _check_serve(self)
        weight = self.weight_dtype or (DType.NF4 if task is Task.QLORA else DType.BF16)
        object.__setattr__(self, "weight_dtype", weight)
        if self.compute_dtype is None:
            object.__setattr__(self, "compute_dtype", _default_compute(weight))
        if not task.is_training:
            # A serve spec's unset KV dtype follows each planned weight format (serving._options).
            if self.kv_cache_dtype is None and task is not Task.SERVE:
                kv = self.compute_dtype if self.compute_dtype != DType.FP4 else DType.FP8
                object.__setattr__(self, "kv_cache_dtype", kv)
            if self.num_requests is None and task is Task.INFERENCE:
                object.__setattr__(self, "num_requests", self.batch_size)

        if task is Task.QLORA and weight not in (DType.NF4, DType.INT4, DType.FP4):
            raise SpecError(
                f"`qlora` keeps a 4-bit base model; `weight_dtype` must be nf4, int4 or fp4, "
                f"got {weight.value}. Use task `lora` for {weight.value} weights"
            )
        if task.is_training and self.compute_dtype in (DType.INT8, DType.INT4, DType.NF4):
            raise SpecError(
                f"training cannot compute in {self.compute_dtype}; set `compute_dtype` to "
                "bf16, fp16, fp32 or fp8"
            )

        model_parallel = self.tensor_parallel * self.pipeline_parallel
        if self.n_gpus % self.tensor_parallel:
            raise SpecError(
                f"`tensor_parallel` must divide `n_gpus`; got {self.tensor_parallel} and "
                f"{self.n_gpus}"
            )
        if self.n_gpus % model_parallel:
            raise SpecError(
                f"`tensor_parallel` × `pipeline_parallel` must divide `n_gpus`; got "
                f"{self.tensor_parallel} × {self.pipeline_parallel} = {model_parallel} and "
                f"{self.n_gpus}"
            )
        if self.gpu is not None and self.gpu not in GPU_NAMES:
            hint = difflib.get_close_matches(self.gpu, GPU_NAMES, n=1)
            did = f"did you mean {hint[0]!r}? " if hint else ""
            raise SpecError(
                f"`gpu` {self.gpu!r} is not a catalogue GPU type; {did}"
                f"use one of {', '.join(GPU_NAMES)}"
            )
        if self.command is not None and not self.command:
            raise SpecError("`command` must be a non-empty argv list, e.g. ['python', 'train.py']")

        arch = _resolve_cached(_model_key(self.model))
        if (
            self.tensor_parallel > 1
            and arch.n_kv_heads % self.tensor_parallel
            and (self.tensor_parallel % arch.n_kv_heads)
        ):
            raise SpecError(
                f"`tensor_parallel` {self.tensor_parallel} cannot split {arch.n_kv_heads} KV heads "
                f"of {arch.name}; use a divisor or multiple of {arch.n_kv_heads}"
            )
        if arch.n_layers < self.pipeline_parallel:
            raise SpecError(
                f"`pipeline_parallel` {self.pipeline_parallel} exceeds the {arch.n_layers} layers "
                f"of {arch.name}"
            )
        return self

    def _fill_fidelity_defaults(self) -> None:
        """Defaults that depend on the framework, documented in the README ("Predicting")."""
        task, fw = self.task, self.framework
        if self.compile is None:
            # torchtune and HF run eagerly unless told otherwise; Unsloth's kernels are compiled.
            object.__setattr__(self, "compile", fw is Framework.UNSLOTH)
        if not task.is_training:
            return
        if task is Task.QLORA and "gradient_checkpointing" not in self._explicit:
            # peft's prepare_model_for_kbit_training (and torchtune's QLoRA recipes) turn it on.
            object.__setattr__(self, "gradient_checkpointing", True)
        if self.chunked_loss is None:
            object.__setattr__(self, "chunked_loss", fw in (Framework.TORCHTUNE, Framework.UNSLOTH))
        if task.is_peft and self.adapter_dtype is None:
            fp32 = fw in (None, Framework.HF, Framework.PEFT, Framework.OTHER)
            compute = self.compute_dtype or DType.BF16
            if compute not in (DType.FP32, DType.BF16, DType.FP16):
                compute = DType.BF16  # fp8/fp4 recipes keep their adapters in bf16
            object.__setattr__(self, "adapter_dtype", DType.FP32 if fp32 else compute)
        if self.adapter_dtype is not None and self.adapter_dtype not in (
            DType.FP32,
            DType.BF16,
            DType.FP16,
        ):
            raise SpecError(
                f"`adapter_dtype` must be fp32, bf16 or fp16; got {self.adapter_dtype.value}"
            )

    @property
    def _explicit(self) -> set[str]:
        return set(self.model_fields_set)

    # Derived quantities, used throughout the predictor.
    @property
    def arch(self) -> ModelArch:
        return _resolve_cached(_model_key(self.model))

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


def iter_spec_dicts(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, object)`` for each job in a .json/.jsonl/.yaml file.

    ``where`` is "file:line" for JSONL and "file[#i]" otherwise, so errors point at the job.
    """
    p = Path(path)
    if not p.exists():
        raise SpecError(f"job file {str(p)!r} does not exist")
    text = p.read_text()
    suffix = p.suffix.lower()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    is_jsonl = suffix == ".jsonl" or (
        suffix not in (".json", ".yaml", ".yml")
        and lines
        and all(ln.lstrip().startswith(("{", "#")) for ln in lines)
    )
    if is_jsonl:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                yield f"{p.name}:{i}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(f"{p.name}:{i}: not valid JSON ({exc.msg})") from None
        return
    docs: list[Any]
    if suffix == ".json":
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{p.name}: not valid JSON ({exc})") from None
        docs = loaded if isinstance(loaded, list) else [loaded]
    else:
        import yaml

        try:
            raw_docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise SpecError(f"{p.name}: not valid YAML ({exc})") from None
        docs = []
        for d in raw_docs:
            docs.extend(d if isinstance(d, list) else [d])
    for i, d in enumerate(docs):
        yield f"{p.name}[#{i}]", d


def load_specs(path: str | Path) -> list[JobSpec]:
    """Read and validate every job in a file; the first bad job raises with its location."""
    out = []
    for where, obj in iter_spec_dicts(path):
        try:
            out.append(parse_spec(obj))
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
    return out
