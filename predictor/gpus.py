"""The GPU catalogue: memory, bandwidth, peak throughput, MIG profiles and default prices.

Every hardware number is quoted from ``../shared/validation/gpu_specs.md`` (which cites NVIDIA
datasheets, torchtitan's ``get_peak_flops`` and vendor pages) or from the NVIDIA MIG user guide.
Peaks are *dense* (no 2:4 sparsity). Prices are configurable defaults, not facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache

from .exceptions import UnknownGpuError

__all__ = [
    "GPU_NAMES",
    "GpuType",
    "MigProfile",
    "get_gpu",
    "gpu_catalogue",
    "with_prices",
]

GIB = 1024**3

_MIG_GUIDE = "NVIDIA Multi-Instance GPU User Guide, 'Supported MIG Profiles' (r560)"


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG GPU-instance profile, e.g. ``1g.10gb``.

    ``placements`` are the valid start slots (in compute-slice units, 0..6) from the MIG guide's
    placement table; ``memory_slices`` counts eighths of the GPU's memory.
    """

    name: str
    compute_slices: int
    memory_slices: int
    memory_gib: float
    max_instances: int
    placements: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_gib: float
    hbm_bandwidth_gbps: float
    peak_tflops: Mapping[str, float]
    nvlink_bandwidth_gbps: float
    tdp_w: float
    price_usd_per_hour: float
    mig_profiles: tuple[MigProfile, ...]
    sources: Mapping[str, str] = field(default_factory=dict)

    def peak_tflops_for(self, dtype: str) -> float:
        """Dense peak for a compute dtype; dtypes the GPU lacks run at its bf16 rate.

        A100 has no FP8 tensor cores and only B200 has FP4: frameworks fall back to
        weight-only or emulated paths there, so the bf16 peak is the honest ceiling.
        """
        key = {"fp16": "bf16", "int8": "int8", "int4": "bf16", "nf4": "bf16"}.get(dtype, dtype)
        return self.peak_tflops.get(key, self.peak_tflops["bf16"])

    def mig_profile(self, name: str) -> MigProfile:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        allowed = ", ".join(p.name for p in self.mig_profiles)
        raise UnknownGpuError(
            f"unknown MIG profile {name!r} for {self.name}; valid profiles are {allowed}"
        )


def _mig(total_gib: float, sizes_gb: tuple[int, int, int, int, int, int]) -> tuple[MigProfile, ...]:
    """The six standard profiles of an 8-memory-slice, 7-compute-slice GPU (A100/H100/H200/B200).

    ``sizes_gb`` are the marketing sizes in the profile names (1g, 1g-double, 2g, 3g, 4g, 7g).
    Usable memory is the memory-slice share of the total, which is what ``nvidia-smi mig -lgip``
    reports to within rounding.
    """
    s1, s1d, s2, s3, s4, s7 = sizes_gb
    eighth = total_gib / 8
    return (
        MigProfile(f"1g.{s1}gb", 1, 1, round(eighth * 1, 2), 7, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{s1d}gb", 1, 2, round(eighth * 2, 2), 4, (0, 2, 4, 6)),
        MigProfile(f"2g.{s2}gb", 2, 2, round(eighth * 2, 2), 3, (0, 2, 4)),
        MigProfile(f"3g.{s3}gb", 3, 4, round(eighth * 4, 2), 2, (0, 4)),
        MigProfile(f"4g.{s4}gb", 4, 4, round(eighth * 4, 2), 1, (0,)),
        MigProfile(f"7g.{s7}gb", 7, 8, round(eighth * 8, 2), 1, (0,)),
    )


_SPECS = "../shared/validation/gpu_specs.md"
_PRICE_SRC = (
    "default list prices, USD per GPU-hour, typical 2025 on-demand cloud rates; "
    "override in the pool file or with SNUGFIT_PRICES"
)

# memory_gib is the capacity a CUDA process can see (nvidia-smi "total"), not the marketing GB.
_CATALOGUE: tuple[GpuType, ...] = (
    GpuType(
        name="A100-40GB",
        memory_gib=40.0,
        hbm_bandwidth_gbps=1555.0,
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "int8": 624.0},
        nvlink_bandwidth_gbps=600.0,
        tdp_w=400.0,
        price_usd_per_hour=1.29,
        mig_profiles=_mig(40.0, (5, 10, 10, 20, 20, 40)),
        sources={
            "memory_gib": "A100 SXM4 40GB HBM2; nvidia-smi reports 40960 MiB",
            "hbm_bandwidth_gbps": f"{_SPECS}: Klockwood/A100 datasheet '1.555 TB/s'",
            "peak_tflops": f"{_SPECS}: 'BF16 312 | 624' dense|sparse; torchtitan 312e12",
            "nvlink_bandwidth_gbps": f"{_SPECS}: '300+300 GB/s NVLink'",
            "mig_profiles": _MIG_GUIDE + ", A100-SXM4-40GB",
            "price_usd_per_hour": _PRICE_SRC,
        },
    ),
    GpuType(
        name="A100-80GB",
        memory_gib=80.0,
        hbm_bandwidth_gbps=2039.0,
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "int8": 624.0},
        nvlink_bandwidth_gbps=600.0,
        tdp_w=400.0,
        price_usd_per_hour=1.79,
        mig_profiles=_mig(80.0, (10, 20, 20, 40, 40, 80)),
        sources={
            "memory_gib": "A100 SXM4 80GB HBM2e; nvidia-smi reports 81920 MiB",
            "hbm_bandwidth_gbps": f"{_SPECS}: Thunder Compute '2,039GB/s' (SXM 80GB)",
            "peak_tflops": f"{_SPECS}: same compute as A100 40GB ('Everything else was the same')",
            "nvlink_bandwidth_gbps": f"{_SPECS}: 600 GB/s",
            "mig_profiles": _MIG_GUIDE + ", A100-SXM4-80GB",
            "price_usd_per_hour": _PRICE_SRC,
        },
    ),
    GpuType(
        name="H100-80GB",
        memory_gib=79.65,
        hbm_bandwidth_gbps=3350.0,
        peak_tflops={"fp32": 67.0, "tf32": 494.7, "bf16": 989.0, "fp8": 1979.0, "int8": 1979.0},
        nvlink_bandwidth_gbps=900.0,
        tdp_w=700.0,
        price_usd_per_hour=2.99,
        mig_profiles=_mig(79.65, (10, 20, 20, 40, 40, 80)),
        sources={
            "memory_gib": "H100 SXM5 80GB HBM3; nvidia-smi reports 81559 MiB",
            "hbm_bandwidth_gbps": f"{_SPECS}: HPCTech datasheet '3,350 GB/sec'",
            "peak_tflops": f"{_SPECS}: BF16 989 / FP8 1,979 dense (datasheet halves sparse)",
            "nvlink_bandwidth_gbps": f"{_SPECS}: 'NVLink 900GB/s'",
            "mig_profiles": _MIG_GUIDE + ", H100-SXM5-80GB",
            "price_usd_per_hour": _PRICE_SRC,
        },
    ),
    GpuType(
        name="H200-141GB",
        memory_gib=140.4,
        hbm_bandwidth_gbps=4800.0,
        peak_tflops={"fp32": 67.0, "tf32": 494.7, "bf16": 989.0, "fp8": 1979.0, "int8": 1979.0},
        nvlink_bandwidth_gbps=900.0,
        tdp_w=700.0,
        price_usd_per_hour=3.79,
        mig_profiles=_mig(140.4, (18, 35, 35, 71, 71, 141)),
        sources={
            "memory_gib": "H200 SXM 141GB HBM3e; nvidia-smi reports 143771 MiB",
            "hbm_bandwidth_gbps": f"{_SPECS}: TRT-LLM H200launch '4.8TB/s'",
            "peak_tflops": f"{_SPECS}: torchtitan 989e12; same GH100 compute as H100 SXM",
            "nvlink_bandwidth_gbps": f"{_SPECS}: 900 GB/s",
            "mig_profiles": _MIG_GUIDE + ", H200 (1g.18gb ... 7g.141gb)",
            "price_usd_per_hour": _PRICE_SRC,
        },
    ),
    GpuType(
        name="B200-180GB",
        memory_gib=179.0,
        hbm_bandwidth_gbps=8000.0,
        peak_tflops={
            "fp32": 80.0,
            "tf32": 1100.0,
            "bf16": 2250.0,
            "fp8": 4500.0,
            "int8": 4500.0,
            "fp4": 9000.0,
        },
        nvlink_bandwidth_gbps=1800.0,
        tdp_w=1000.0,
        price_usd_per_hour=5.49,
        mig_profiles=_mig(179.0, (23, 45, 45, 90, 90, 180)),
        sources={
            "memory_gib": f"{_SPECS}: 'nvidia-smi shows ~179 GB'; Vultr 'VRAM 179 GB'",
            "hbm_bandwidth_gbps": f"{_SPECS}: Klockwood B200 '8 TB/s (max)'",
            "peak_tflops": f"{_SPECS}: HGX B200 1000 W 'BF16 2250 | FP8 4500 | FP4 9000' dense",
            "nvlink_bandwidth_gbps": f"{_SPECS}: NVLink 5, 1.8 TB/s",
            "mig_profiles": _MIG_GUIDE + ", B200 (1g.23gb ... 7g.180gb)",
            "price_usd_per_hour": _PRICE_SRC,
        },
    ),
)

GPU_NAMES: tuple[str, ...] = tuple(g.name for g in _CATALOGUE)


def _env_prices() -> dict[str, float]:
    """``SNUGFIT_PRICES="H100-80GB=2.5,A100-80GB=1.5"`` overrides default prices."""
    import os

    raw = os.environ.get("SNUGFIT_PRICES", "").strip()
    out: dict[str, float] = {}
    if not raw:
        return out
    for item in raw.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            raise UnknownGpuError(
                f"SNUGFIT_PRICES entry {item!r} is not NAME=PRICE; e.g. 'H100-80GB=2.5'"
            )
        out[name.strip()] = float(value)
    return out


@lru_cache(maxsize=1)
def _default_catalogue() -> dict[str, GpuType]:
    return with_prices({g.name: g for g in _CATALOGUE}, _env_prices())


def gpu_catalogue() -> dict[str, GpuType]:
    """Every catalogue GPU by contract name, with any ``SNUGFIT_PRICES`` overrides applied."""
    return dict(_default_catalogue())


def get_gpu(name: str) -> GpuType:
    cat = _default_catalogue()
    try:
        return cat[name]
    except KeyError:
        raise UnknownGpuError(
            f"unknown GPU type {name!r}; use one of {', '.join(GPU_NAMES)}"
        ) from None


def with_prices(
    catalogue: Mapping[str, GpuType], prices_usd_per_hour: Mapping[str, float]
) -> dict[str, GpuType]:
    """A copy of ``catalogue`` with some prices replaced; unknown names are an error."""
    out = dict(catalogue)
    for name, price in prices_usd_per_hour.items():
        if name not in out:
            raise UnknownGpuError(
                f"price given for unknown GPU type {name!r}; use one of {', '.join(out)}"
            )
        if not price > 0:
            raise UnknownGpuError(f"price for {name} must be > 0 USD/hour; got {price}")
        out[name] = replace(out[name], price_usd_per_hour=float(price))
    return out
