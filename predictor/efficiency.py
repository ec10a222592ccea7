"""Efficiency tables of the operator-class runtime model: what share of a GPU's peak each kind
of work reaches.

The roofline in :mod:`predictor._runtime` splits every job into GEMMs, attention, memory-bound
elementwise work, collectives and fixed overheads. Each class has its own efficiency per GPU
architecture (Ampere = A100, Hopper = H100/H200, Blackwell = B200) and per kernel or
framework. :data:`PARAMETERS` lists every constant with its prior, its bounds and where the
prior comes from. Parameters marked ``fitted`` are refitted on the measured rows by
:func:`fit_efficiencies` (a ridge towards the prior in log space, so a parameter that no row
informs stays at its prior); ``quoted`` ones keep the quoted value.

``python -m predictor._fit`` refits on every calibratable measured row and writes
``datasets/artifacts/efficiencies.json``, which :func:`default_efficiencies` loads. Accuracy is
only ever reported out of source (:func:`cross_validate_efficiencies`, leave one source out).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ._paths import datasets_dir

__all__ = [
    "ARCHITECTURES",
    "PARAMETERS",
    "Efficiencies",
    "Parameter",
    "default_efficiencies",
    "efficiency_table_text",
    "gpu_architecture",
    "load_efficiencies",
    "prior_efficiencies",
]

ARCHITECTURES: tuple[str, ...] = ("ampere", "hopper", "blackwell")
ARTIFACT_NAME = "efficiencies.json"


def gpu_architecture(gpu_name: str) -> str:
    """``ampere`` | ``hopper`` | ``blackwell`` for a catalogue GPU name (e.g. ``H200-141GB``)."""
    head = gpu_name.upper()
    if head.startswith("A100"):
        return "ampere"
    if head.startswith(("H100", "H200")):
        return "hopper"
    if head.startswith("B200"):
        return "blackwell"
    raise ValueError(f"no GPU architecture known for {gpu_name!r}; expected A100/H100/H200/B200")


@dataclass(frozen=True, slots=True)
class Parameter:
    """One constant of the runtime model: prior value, bounds, and whether rows refit it."""

    name: str
    prior: float
    lo: float
    hi: float
    fitted: bool
    source: str
    #: The prior is on the ratio to this parameter (e.g. Blackwell's GEMM share relative to
    #: Hopper's), so an architecture without rows follows the ones with rows.
    tie: str | None = None


_FA = "FlashAttention-2/3 papers (Dao 2023; Shah et al. 2024): fwd+bwd share of peak"
#: Quoted from the MAMF table of stas00/ml-engineering (compute/accelerator/README.md): the best
#: bf16 matmul TFLOP/s measured per GPU. Whole-model MFU (dgxc 54%, llm-foundry ~60%) is no
#: GEMM prior here: it also counts attention, elementwise work and communication, which this
#: model times as classes of their own.
_MAMF = "best bf16 matmul / dense peak (ml-engineering MAMF): A100 85.9%, H100 80.1%, B200 77.6%"
_NCCL = "nccl-tests all_reduce_perf small-message latency, NVSwitch systems (order of magnitude)"
_ENGINE = (
    "serving-engine CPU work per step (scheduling, sampling) and per request (tokenise, "
    "detokenise); order of magnitude from vLLM V1 / SGLang overhead write-ups (prior)"
)


def _p(
    name: str,
    prior: float,
    lo: float,
    hi: float,
    source: str,
    fitted: bool = True,
    tie: str | None = None,
) -> Parameter:
    return Parameter(name, prior, lo, hi, fitted, source, tie)


#: Every constant of the runtime model. Names are ``<class>.<qualifier>``.
PARAMETERS: tuple[Parameter, ...] = (
    # GEMMs: share of dense peak at large sizes, per architecture; sizes below the knees lose.
    _p("gemm.ampere", 0.859, 0.2, 0.95, _MAMF),
    _p("gemm.hopper", 0.803, 0.2, 0.95, _MAMF),
    _p("gemm.blackwell", 0.776, 0.15, 0.95, _MAMF, tie="gemm.hopper"),
    _p("gemm.knee_hidden", 400.0, 20.0, 4000.0, "GEMM tile-quantisation/launch knee (prior)"),
    _p(
        "gemm.knee_ridge",
        1.0,
        0.1,
        10.0,
        "tokens per GEMM at half efficiency, in units of the GPU's ridge point (roofline: "
        "compute time equals weight-read time there; prior 1)",
    ),
    _p(
        "gemm.roofline_p",
        2.0,
        1.0,
        8.0,
        "shape of a GEMM's transition from weight-read- to compute-bound: p-norm of the two "
        "times (1 = their sum, no overlap; large = their maximum, the ideal roofline); prior 2, "
        "chosen among 1, 2 and 4 by the leave-one-source-out CV of benchmarks/bench_eval.py",
    ),
    _p("gemm.fp8_scale", 0.67, 0.3, 1.0, "dgxc 70B: FP8 MFU 36.2% of FP8 peak vs BF16 54.1%"),
    _p("gemm.fp4_scale", 0.5, 0.2, 1.0, "NVFP4 recipes: scaling and casts (prior)"),
    _p(
        "gemm.moe_scale",
        1.0,
        0.2,
        1.0,
        "MoE GEMMs beyond what is timed explicitly (prior 1: no penalty): the experts' few "
        "tokens sit on the ridge-point knee, token permutation is elementwise traffic and "
        "dispatch/combine are all-to-alls of their own",
    ),
    _p("gemm.eager_scale", 0.8, 0.4, 1.0, "HF/PEFT without compile or fused kernels (prior)"),
    _p("gemm.qlora_scale", 0.65, 0.3, 1.0, "4-bit dequantisation in every matmul (prior)"),
    # Attention kernels: FA2 everywhere; FA3 / cuDNN fused attention on Hopper and Blackwell.
    _p(
        "attn.fa2.ampere",
        0.45,
        0.1,
        0.9,
        _FA + ": FA2 ~50-70% of A100 fwd, less bwd",
        tie="attn.fa2.hopper",
    ),
    _p("attn.fa2.hopper", 0.30, 0.05, 0.9, _FA + ": FA2 reaches ~35% of H100"),
    _p("attn.fa2.blackwell", 0.30, 0.05, 0.9, _FA + " (prior, as Hopper)", tie="attn.fa2.hopper"),
    _p("attn.fa3.hopper", 0.50, 0.1, 0.9, _FA + ": FA3 ~75% fwd on H100, less bwd"),
    _p("attn.fa3.blackwell", 0.45, 0.1, 0.9, _FA + " (prior)", tie="attn.fa3.hopper"),
    _p("attn.knee_seq", 512.0, 32.0, 8192.0, "short sequences underfill the attention tiles"),
    # Memory-bound elementwise work (norms, activations, residuals, rotary, softmax of logits).
    _p("elem.bytes_scale", 1.0, 0.2, 5.0, "Korthikanti et al. activation bytes as traffic"),
    _p("mem.stream", 0.75, 0.4, 0.95, "STREAM-like share of HBM peak (prior)", fitted=False),
    # Fixed per-layer cost of one forward (kernel launches), eager and graph-captured stacks.
    _p("launch.train_s", 4e-5, 1e-6, 1e-3, "~40 kernels/layer fwd+bwd x ~1 us (prior)"),
    _p("launch.prefill_s", 3e-5, 1e-6, 1e-3, "per-layer launch floor of one prefill (prior)"),
    _p("launch.decode_engine_s", 1e-5, 1e-7, 5e-4, "CUDA graphs: per-layer floor (prior)"),
    _p("launch.decode_other_s", 6e-5, 1e-6, 1e-3, "partly captured stacks (prior)"),
    _p("launch.decode_eager_s", 3e-4, 1e-5, 3e-3, "HF eager: Python + launches per layer"),
    # Collectives: ring all-reduce, latency per hop + bytes over the achieved bus bandwidth.
    _p("comm.latency_s", 6e-6, 5e-7, 1e-4, _NCCL + ": fixed part"),
    _p("comm.latency_log2_s", 3e-6, 1e-7, 5e-5, _NCCL + ": growth per doubling of the group"),
    _p(
        "comm.uncaptured_latency_s",
        4.2e-5,
        1e-6,
        3e-4,
        "host sync per collective per doubling of the TP group without CUDA graphs / custom "
        "all-reduce (each rank's host issues eagerly; the all-reduce waits for the slowest), "
        "at the A100 clock. Quoted: OPT-175B on 8xA100 (TP8) decodes in ~95 ms/token eager vs "
        "~66 ms with CUDA graphs (facebookresearch/metaseq#270): 302 us per layer; Llama-2-7B "
        "TP1 eager vs graphs, 1.2 vs 1.05 s for 100 tokens (vllm-project/vllm#1440): 47 us per "
        "layer; (302 - 47) / (2 all-reduces x log2 8) = 42 us",
    ),
    _p("comm.link_efficiency", 0.75, 0.2, 1.0, "nccl-tests busbw / NVLink peak (prior)"),
    _p("comm.tp_exposed_train", 0.5, 0.05, 1.0, "Megatron overlaps TP comm with GEMMs"),
    _p("comm.dp_exposed", 0.3, 0.01, 1.0, "gradient all-reduce hidden behind backward"),
    _p(
        "comm.a2a_exposed",
        1.0,
        0.05,
        1.0,
        "MoE dispatch/combine all-to-alls on the critical path (prior 1: Megatron-Core runs "
        "them between the router and the expert GEMMs unless a2a overlap is switched on)",
    ),
    _p("comm.inter_node_gbps", 50.0, 10.0, 100.0, "400 Gb/s InfiniBand per GPU", fitted=False),
    _p("comm.pcie_gbps", 32.0, 8.0, 64.0, "PCIe Gen4 x16 one direction", fitted=False),
    # Prefill: GEMM share of peak per architecture (serving engines, bf16).
    _p("prefill.ampere", 0.859, 0.15, 0.95, "prefill GEMMs: " + _MAMF),
    _p("prefill.hopper", 0.803, 0.15, 0.95, "prefill GEMMs: " + _MAMF, tie="gemm.hopper"),
    _p(
        "prefill.blackwell",
        0.776,
        0.1,
        0.95,
        "prefill GEMMs: " + _MAMF,
        tie="prefill.hopper",
    ),
    _p(
        "prefill.unfused_scale",
        0.8,
        0.3,
        1.0,
        "prefill outside the serving engines (HF, LitGPT, research stacks): unfused QKV/MLP "
        "and eager kernels; prior as gemm.eager_scale",
    ),
    # Decode: achieved share of HBM bandwidth (MBU) per architecture, then per stack.
    _p(
        "decode.mbu.ampere",
        0.75,
        0.3,
        0.95,
        "decode MBU of tuned engines (prior)",
        tie="decode.mbu.hopper",
    ),
    _p("decode.mbu.hopper", 0.70, 0.3, 0.95, "decode MBU of tuned engines (prior)"),
    _p(
        "decode.mbu.blackwell",
        0.65,
        0.3,
        0.95,
        "decode MBU of tuned engines (prior)",
        tie="decode.mbu.hopper",
    ),
    _p("decode.eager_scale", 0.75, 0.3, 1.0, "HF generate reads weights less efficiently"),
    _p("decode.compute_eff", 0.4, 0.1, 0.9, "large-batch decode GEMMs (prior)"),
    # Serving-engine overheads per framework: per decode/prefill step and per request.
    _p("engine.step_s.vllm", 1.5e-3, 1e-5, 2e-2, _ENGINE),
    _p("engine.step_s.sglang", 1.0e-3, 1e-5, 2e-2, _ENGINE),
    _p("engine.step_s.trtllm", 5e-4, 1e-5, 2e-2, _ENGINE),
    _p("engine.step_s.hf", 3e-3, 1e-5, 5e-2, _ENGINE),
    _p("engine.step_s.other", 1e-3, 1e-5, 2e-2, _ENGINE),
    _p("engine.seq_step_s.vllm", 2e-5, 1e-7, 2e-3, _ENGINE + "; per running sequence"),
    _p("engine.seq_step_s.sglang", 2e-5, 1e-7, 2e-3, _ENGINE + "; per running sequence"),
    _p("engine.seq_step_s.trtllm", 1e-5, 1e-7, 2e-3, _ENGINE + "; per running sequence"),
    _p("engine.seq_step_s.hf", 2e-4, 1e-6, 5e-3, _ENGINE + "; per running sequence"),
    _p("engine.seq_step_s.other", 5e-5, 1e-7, 2e-3, _ENGINE + "; per running sequence"),
    _p("engine.request_s.vllm", 5e-3, 1e-5, 0.1, _ENGINE),
    _p("engine.request_s.sglang", 4e-3, 1e-5, 0.1, _ENGINE),
    _p("engine.request_s.trtllm", 2e-3, 1e-5, 0.1, _ENGINE),
    _p("engine.request_s.hf", 1e-2, 1e-5, 0.2, _ENGINE),
    _p("engine.request_s.other", 3e-3, 1e-5, 0.1, _ENGINE),
)


_BY_NAME: dict[str, Parameter] = {p.name: p for p in PARAMETERS}


@dataclass(frozen=True)
class Efficiencies:
    """A value for every name in :data:`PARAMETERS` (missing names take their prior)."""

    values: Mapping[str, float] = field(default_factory=dict)
    fitted_on: str = "prior"
    n_rows: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.values) - set(_BY_NAME)
        if unknown:
            raise ValueError(f"unknown efficiency parameter(s) {sorted(unknown)}")

    def __getitem__(self, name: str) -> float:
        if name not in _BY_NAME:
            raise KeyError(f"unknown efficiency parameter {name!r}")
        return float(self.values.get(name, _BY_NAME[name].prior))

    def per_arch(self, prefix: str, gpu_names: Sequence[str]) -> np.ndarray:
        """``(1, n_gpus)`` values of ``<prefix>.<architecture>`` for each GPU."""
        return np.array([[self[f"{prefix}.{gpu_architecture(g)}"] for g in gpu_names]])

    def with_values(self, values: Mapping[str, float], **kw: Any) -> Efficiencies:
        return replace(self, values={**self.values, **values}, **kw)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fitted_on": self.fitted_on,
            "n_rows": self.n_rows,
            "values": {p.name: round(self[p.name], 8) for p in PARAMETERS},
        }


def prior_efficiencies() -> Efficiencies:
    """Every parameter at its quoted prior (no data)."""
    return Efficiencies()


def load_efficiencies(path: str | Path) -> Efficiencies:
    doc = json.loads(Path(path).read_text())
    known = {k: float(v) for k, v in doc.get("values", {}).items() if k in _BY_NAME}
    return Efficiencies(known, str(doc.get("fitted_on", path)), int(doc.get("n_rows", 0)))


def artifact_path() -> Path:
    return datasets_dir() / "artifacts" / ARTIFACT_NAME


@lru_cache(maxsize=1)
def default_efficiencies() -> Efficiencies:
    """The shipped fitted table (``datasets/artifacts/efficiencies.json``), else the priors."""
    path = artifact_path()
    return load_efficiencies(path) if path.exists() else prior_efficiencies()


def efficiency_table_text(eff: Efficiencies | None = None) -> str:
    """A plain-text table of every parameter: value, prior, kind and source.

    Kind: ``fitted`` (refitted and moved), ``prior`` (refitted, but no row moved it),
    ``quoted`` (never refitted).
    """
    eff = eff or default_efficiencies()
    lines = [
        f"runtime-model efficiencies ({eff.fitted_on}; {eff.n_rows} measured rows)",
        f"{'parameter':28s} {'value':>11s} {'prior':>11s}  {'kind':7s} source",
    ]
    for p in PARAMETERS:
        # A fitted parameter that no row informs stays at its prior: say so.
        moved = abs(eff[p.name] / p.prior - 1.0) > 1e-3
        kind = ("fitted" if moved else "prior") if p.fitted else "quoted"
        lines.append(f"{p.name:28s} {eff[p.name]:11.4g} {p.prior:11.4g}  {kind:7s} {p.source}")
    return "\n".join(lines)
