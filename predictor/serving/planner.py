"""Serving by SLO: enumerate deployment shapes, predict each, choose the cheapest that meets the
SLOs, and explain why every other option lost (SkyPilot's optimizer table is the model).

One :class:`PlanOption` per runnable shape holds every number of the ``snugfit plan`` JSON
contract; :meth:`ServingPlan.to_contract` is the one place that JSON is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..exceptions import SpecError
from ..spec import JobSpec, Task
from ._cost import cold_start_s, power_w, usd_per_million, wh_per_million
from ._engines import (
    ENGINE_BATCH_CAP,
    PREFILL_CHUNK_TOKENS,
    KvBudget,
    engine_flags,
    engine_values,
    kv_budget,
    tokens_per_sequence,
)
from ._options import Shape, enumerate_shapes
from ._perf import PERF, PerfConstants, ReplicaPerf, replica_perf
from ._queueing import LoadPoint, load_point, max_rate, rate_at_slo

__all__ = [
    "CONTRACT_OPTION_KEYS",
    "EXTRA_OPTION_KEYS",
    "PlanOption",
    "ServingPlan",
    "plan",
    "plan_many",
]

#: Keys of each option in the ``snugfit plan --json`` contract, in order.
CONTRACT_OPTION_KEYS: tuple[str, ...] = (
    "gpu",
    "tensor_parallel",
    "n_gpus",
    "weight_dtype",
    "kv_cache_dtype",
    "max_batch",
    "replicas",
    "max_throughput_tok_s",
    "throughput_at_slo_tok_s",
    "ttft_p95_s",
    "tpot_p95_s",
    "usd_per_hour",
    "usd_per_million_tokens",
    "wh_per_million_tokens",
    "cold_start_s",
    "meets_slo",
    "status",
)

#: Keys each option carries after the contract ones (extra keys are allowed by the contract;
#: ``gpu`` stays the bare catalogue type, so a MIG slice is named here).
EXTRA_OPTION_KEYS: tuple[str, ...] = ("mig_profile",)


@dataclass(frozen=True)
class PlanOption:
    shape: Shape
    perf: ReplicaPerf
    memory: KvBudget
    max_batch: int
    replicas: int | None  # None: no replica count meets the SLO
    max_throughput_tok_s: float
    throughput_at_slo_tok_s: float
    point: LoadPoint  # at the planned per-replica rate (or the lightest load when it misses)
    usd_per_hour: float
    usd_per_million_tokens: float
    wh_per_million_tokens: float
    cold_start_s: float
    miss: str  # empty when the SLO is met; else which target misses and by how much
    miss_ratio: float  # predicted / target of the worst metric at the lightest load (≤1: met)
    status: str = ""

    @property
    def gpu(self) -> str:
        """The catalogue GPU type (the contract's ``gpu``), also for a MIG slice of one."""
        return self.shape.slot.gpu.name

    @property
    def mig_profile(self) -> str | None:
        mig = self.shape.slot.mig
        return None if mig is None else mig.name

    @property
    def where(self) -> str:
        """The slot for people: the type, or the type and its MIG profile."""
        mig = self.mig_profile
        return self.gpu if mig is None else f"{self.gpu} MIG {mig}"

    @property
    def meets_slo(self) -> bool:
        return self.replicas is not None

    @property
    def n_gpus(self) -> int:
        return self.shape.tp

    def to_contract(self) -> dict[str, Any]:
        def num(x: float, nd: int = 4) -> float | None:
            return round(float(x), nd) if math.isfinite(x) else None

        return {
            "gpu": self.gpu,
            "tensor_parallel": self.shape.tp,
            "n_gpus": self.n_gpus,
            "weight_dtype": self.shape.weight.value,
            "kv_cache_dtype": self.shape.kv.value,
            "max_batch": self.max_batch,
            "replicas": self.replicas,
            "max_throughput_tok_s": num(self.max_throughput_tok_s, 1),
            "throughput_at_slo_tok_s": num(self.throughput_at_slo_tok_s, 1),
            "ttft_p95_s": num(self.point.ttft_p95_s),
            "tpot_p95_s": num(self.point.tpot_p95_s, 5),
            "usd_per_hour": num(self.usd_per_hour, 2),
            "usd_per_million_tokens": num(self.usd_per_million_tokens, 4),
            "wh_per_million_tokens": num(self.wh_per_million_tokens, 1),
            "cold_start_s": num(self.cold_start_s, 1),
            "meets_slo": self.meets_slo,
            "status": self.status,
            "mig_profile": self.mig_profile,
        }


@dataclass(frozen=True)
class ServingPlan:
    spec: JobSpec
    options: tuple[PlanOption, ...]
    chosen: int | None
    reason: str  # why the chosen option won, or why none could
    skipped: tuple[tuple[str, str], ...] = field(default=())

    @property
    def id(self) -> str | None:
        return self.spec.id

    @property
    def best(self) -> PlanOption | None:
        return self.options[self.chosen] if self.chosen is not None else None

    def engine_flags(self) -> dict[str, list[str]]:
        """argv per engine for the chosen option (empty when none meets the SLO)."""
        o = self.best
        if o is None:
            return {}
        assert self.spec.framework is not None and self.spec.max_model_len is not None
        return engine_flags(
            self.spec.framework,
            _checkpoint(self.spec),
            o.shape.tp,
            o.max_batch,
            self.spec.max_model_len,
            o.shape.weight,
            o.shape.kv,
        )

    def engine_values(self, k: int | None = None) -> dict[str, str]:
        """Placeholder values (``_engines.ENGINE_PLACEHOLDERS``) of option ``k`` (default: the
        chosen one); empty when there is none."""
        k = self.chosen if k is None else k
        if k is None:
            return {}
        o = self.options[k]
        assert self.spec.framework is not None and self.spec.max_model_len is not None
        return engine_values(
            self.spec.framework,
            o.shape.tp,
            o.max_batch,
            self.spec.max_model_len,
            o.shape.weight,
            o.shape.kv,
        )

    def to_contract(self) -> dict[str, Any]:
        """The ``snugfit plan --json`` object for this job (the contract keys, then the extras)."""
        return {
            "id": self.spec.id,
            "chosen": self.chosen,
            "options": [o.to_contract() for o in self.options],
        }


def _checkpoint(spec: JobSpec) -> str:
    """What the engine loads: the Hugging Face repo id when the spec or catalogue names one."""
    if isinstance(spec.model, str) and "/" in spec.model:
        return spec.model
    found = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", spec.arch.source)
    return found.group(1) if found else spec.model_name


def _evaluate(spec: JobSpec, shape: Shape, constants: PerfConstants) -> PlanOption | str:
    """Predict one shape; a string is the reason it cannot run at all."""
    arch = spec.arch
    fw = spec.framework
    assert fw is not None and spec.input_len and spec.output_len and spec.request_rate
    assert spec.max_model_len is not None
    perf = replica_perf(arch, shape.slot, shape.tp, shape.weight, shape.kv, fw, constants)
    cap = ENGINE_BATCH_CAP[fw]
    if spec.batch_size > 1:  # 1 is the JobSpec default: no cap
        cap = min(cap, spec.batch_size)
    mem = kv_budget(arch, shape.slot, shape.tp, fw, perf.weight_bytes, perf.kv_bytes_token, cap)
    if mem.kv_tokens < spec.max_model_len:
        return (
            f"does not fit: {mem.weights_gib:.1f} GiB weights + {mem.activations_gib:.1f} "
            f"activations + {mem.fixed_gib:.1f} fixed per GPU leave KV room for "
            f"{mem.kv_tokens} tokens < max_model_len {spec.max_model_len}"
        )
    per_seq = tokens_per_sequence(spec.input_len, spec.output_len)
    max_batch = max(1, min(cap, mem.kv_tokens // per_seq))
    i, o = spec.input_len, spec.output_len
    step = perf.iteration_s
    chunk = PREFILL_CHUNK_TOKENS
    peak_rate = max_rate(step, max_batch, i, o)
    slo_rate = rate_at_slo(step, max_batch, i, o, spec.slo_ttft_s, spec.slo_tpot_s, chunk)
    light = load_point(step, peak_rate * 1e-6, max_batch, i, o, chunk)
    miss, ratio = _miss(spec, light)
    replicas = math.ceil(spec.request_rate / slo_rate * (1 - 1e-9)) if slo_rate > 0 else None
    if replicas is not None:
        point = load_point(step, spec.request_rate / replicas, max_batch, i, o, chunk)
    else:
        point = light
    n_rep = replicas or 1
    price = n_rep * shape.tp * shape.slot.price_usd_per_hour
    served_tok_s = spec.request_rate * o
    # Busy when at least one request runs: P(N >= 1) of the Poisson running set.
    util = (
        -math.expm1(-point.running)
        * perf.roofline_share(max(point.running, 1.0), i + o / 2.0, point.rate * point.step_s * i)
        if point.stable
        else 1.0
    )
    watts = n_rep * shape.tp * power_w(shape.slot.gpu.tdp_w, util, shape.slot.compute_share)
    return PlanOption(
        shape=shape,
        perf=perf,
        memory=mem,
        max_batch=max_batch,
        replicas=replicas,
        max_throughput_tok_s=peak_rate * o,
        throughput_at_slo_tok_s=slo_rate * o,
        point=point,
        usd_per_hour=price,
        usd_per_million_tokens=usd_per_million(price, served_tok_s),
        wh_per_million_tokens=wh_per_million(watts, served_tok_s),
        cold_start_s=cold_start_s(perf.weight_bytes),
        miss=miss,
        miss_ratio=ratio,
    )


def _miss(spec: JobSpec, light: LoadPoint) -> tuple[str, float]:
    """Which SLO the shape misses even at the lightest load, and by how much."""
    worst, text = 0.0, ""
    for name, target, got in (
        ("slo_ttft_s", spec.slo_ttft_s, light.ttft_p95_s),
        ("slo_tpot_s", spec.slo_tpot_s, light.tpot_p95_s),
    ):
        if target is None:
            continue
        ratio = got / target
        if ratio > worst:
            worst = ratio
            if ratio > 1.0:
                text = (
                    f"{name.removeprefix('slo_').removesuffix('_s').upper()} p95 {got:.3g} s "
                    f"> {name} {target:g} s even at one request ({(ratio - 1) * 100:.0f}% over)"
                )
    return text, worst


def _sort_key(o: PlanOption) -> tuple[float, ...]:
    # Cheapest first; at equal cost keep the more precise weights (quality is the user's
    # call, so never trade it away for nothing), then the most headroom at the SLO.
    return (
        round(o.usd_per_hour, 6),
        -o.shape.weight.bits,
        -o.throughput_at_slo_tok_s,
        o.n_gpus,
        o.cold_start_s,
    )


def _explain(
    options: list[PlanOption], spec: JobSpec, skipped: list[tuple[str, str]]
) -> tuple[list[PlanOption], int | None, str]:
    """Give every option its status; return them, the chosen index and the headline reason."""
    meeting = [k for k, o in enumerate(options) if o.meets_slo]
    if not meeting:
        out = [replace(o, status=f"MISSES SLO: {o.miss}") for o in options]
        if not options:
            first = f" ({skipped[0][0]}: {skipped[0][1]})" if skipped else ""
            return (
                out,
                None,
                (
                    f"no deployment shape can run {spec.model_name}: {len(skipped)} considered, "
                    f"none fits or is supported{first}. Allow other `allowed_weight_dtypes`, GPU "
                    "types (--gpu / `gpu`) or a larger `tensor_parallel`"
                ),
            )
        near = min(options, key=lambda o: o.miss_ratio)
        return (
            out,
            None,
            (
                f"no option meets the SLO (slo_ttft_s={spec.slo_ttft_s}, slo_tpot_s="
                f"{spec.slo_tpot_s}); nearest is {near.shape.label}: {near.miss}. Relax the target "
                "named there, or allow more weight formats (`allowed_weight_dtypes`) or GPU types"
            ),
        )
    best = min(meeting, key=lambda k: _sort_key(options[k]))
    b = options[best]
    out = []
    for k, o in enumerate(options):
        if k == best:
            status = "CHOSEN"
        elif not o.meets_slo:
            status = f"MISSES SLO: {o.miss}"
        elif round(o.usd_per_hour, 6) > round(b.usd_per_hour, 6):
            status = f"costlier: ${o.usd_per_hour:.2f}/h vs ${b.usd_per_hour:.2f}/h"
        elif o.shape.weight.bits < b.shape.weight.bits:
            status = f"same cost, lower-precision weights ({o.shape.weight.value})"
        else:
            status = "same cost, less headroom at the SLO or more GPUs"
        out.append(replace(o, status=status))
    reason = (
        f"{b.shape.label} x{b.replicas} replica(s) meets TTFT p95 {b.point.ttft_p95_s:.3g} s / "
        f"TPOT p95 {b.point.tpot_p95_s * 1e3:.3g} ms at {spec.request_rate:g} req/s for "
        f"${b.usd_per_hour:.2f}/h (${b.usd_per_million_tokens:.3g} per 1M output tokens)"
    )
    return out, best, reason


def plan(
    spec: JobSpec, gpus: Sequence[str] | None = None, constants: PerfConstants = PERF
) -> ServingPlan:
    """Plan one ``serve`` spec over ``gpus`` (default: every catalogue type)."""
    if spec.task is not Task.SERVE:
        raise SpecError(
            f"`snugfit plan` plans `serve` jobs; job {spec.id!r} has task `{spec.task.value}`. "
            "Set `task: serve` with `request_rate`, or use `snugfit predict`"
        )
    shapes, skipped = enumerate_shapes(spec, gpus)
    options: list[PlanOption] = []
    for shape in shapes:
        got = _evaluate(spec, shape, constants)
        if isinstance(got, str):
            if shape.slot.mig is None:
                skipped.append((shape.label, got))
        else:
            options.append(got)
    options.sort(key=lambda o: (not o.meets_slo, *_sort_key(o)))
    options, chosen, reason = _explain(options, spec, skipped)
    return ServingPlan(spec, tuple(options), chosen, reason, tuple(skipped))


def plan_many(specs: Sequence[JobSpec], gpus: Sequence[str] | None = None) -> list[ServingPlan]:
    return [plan(s, gpus) for s in specs]
