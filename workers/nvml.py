"""NVML behind a tiny interface: device facts, memory used, and a peak-sampling thread.

The profiler and the service worker both need "how much VRAM is in use right now" from outside
the job's own process (the CUDA context and allocator slack never show up in PyTorch's
counters). :class:`Nvml` is the edge: :class:`PynvmlNvml` talks to the driver through
``nvidia-ml-py`` (import name ``pynvml``); :class:`FakeNvml` is an in-memory stand-in for tests
and CPU machines. :class:`PeakSampler` polls either one from a daemon thread.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "DEFAULT_SAMPLE_INTERVAL_S",
    "FakeGpu",
    "FakeNvml",
    "MigDevice",
    "Nvml",
    "PeakSampler",
    "PynvmlNvml",
    "index_for_uuid",
    "mig_devices",
    "open_nvml",
]

#: NVML's own memory counters refresh roughly every few ms; 5 ms catches short-lived peaks
#: (a logits tensor that lives for one kernel) without costing a core.
DEFAULT_SAMPLE_INTERVAL_S = 0.005


@runtime_checkable
class Nvml(Protocol):
    """What snugfit reads from NVML. Indices are NVML indices (PCI order), not CUDA ordinals."""

    def device_count(self) -> int: ...

    def device_name(self, index: int) -> str: ...

    def device_uuid(self, index: int) -> str: ...

    def memory_total_bytes(self, index: int) -> int: ...

    def memory_used_bytes(self, index: int) -> int: ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance as NVML sees it. ``start`` is its GPU-instance placement start slot,
    which is the pool's ``mig_start`` (the MIG guide's placement slots, 0..6)."""

    parent_index: int
    profile: str
    start: int
    uuid: str
    memory_total_bytes: int


_MIG_PROFILE_RE = re.compile(r"(\d+g\.\d+gb)", re.IGNORECASE)


def mig_devices(nvml: Nvml) -> list[MigDevice]:
    """Every MIG instance on the node; empty where MIG is off or the NVML edge cannot tell.

    A separate function, not a :class:`Nvml` method, so edges written before MIG support keep
    satisfying the protocol.
    """
    fn = getattr(nvml, "mig_devices", None)
    if fn is None:
        return []
    try:
        return list(fn())
    except Exception:  # MIG queries fail on drivers/GPUs without MIG: no slices to name
        return []


def index_for_uuid(nvml: Nvml, uuid: str) -> int | None:
    """NVML index of the device whose UUID matches (CUDA and NVML may order devices differently).

    PyTorch reports UUIDs without the ``GPU-`` prefix NVML uses, so both forms match.
    """
    want = uuid.lower().removeprefix("gpu-")
    for i in range(nvml.device_count()):
        if nvml.device_uuid(i).lower().removeprefix("gpu-") == want:
            return i
    return None


class PynvmlNvml:
    """The real driver, through ``nvidia-ml-py``. Construct with :func:`open_nvml`."""

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        self._nv.nvmlInit()
        self._closed = False

    def _handle(self, index: int) -> Any:
        return self._nv.nvmlDeviceGetHandleByIndex(index)

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def device_name(self, index: int) -> str:
        return _text(self._nv.nvmlDeviceGetName(self._handle(index)))

    def device_uuid(self, index: int) -> str:
        return _text(self._nv.nvmlDeviceGetUUID(self._handle(index)))

    def memory_total_bytes(self, index: int) -> int:
        return int(self._nv.nvmlDeviceGetMemoryInfo(self._handle(index)).total)

    def memory_used_bytes(self, index: int) -> int:
        return int(self._nv.nvmlDeviceGetMemoryInfo(self._handle(index)).used)

    def driver_version(self) -> str:
        return _text(self._nv.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> str | None:
        try:
            v = int(self._nv.nvmlSystemGetCudaDriverVersion_v2())
        except Exception:  # older drivers lack the call; the version is informative only
            return None
        return f"{v // 1000}.{(v % 1000) // 10}"

    def mig_devices(self) -> list[MigDevice]:
        nv = self._nv
        out: list[MigDevice] = []
        for i in range(self.device_count()):
            h = self._handle(i)
            try:
                current, _pending = nv.nvmlDeviceGetMigMode(h)
            except Exception:  # not MIG-capable
                continue
            if current != 1:  # NVML_DEVICE_MIG_ENABLE
                continue
            for k in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(h))):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except Exception:  # empty MIG slot
                    continue
                match = _MIG_PROFILE_RE.search(_text(nv.nvmlDeviceGetName(mh)))
                gi = nv.nvmlDeviceGetGpuInstanceById(h, int(nv.nvmlDeviceGetGpuInstanceId(mh)))
                info = nv.nvmlGpuInstanceGetInfo(gi)
                out.append(
                    MigDevice(
                        parent_index=i,
                        profile=match.group(1).lower() if match else "",
                        start=int(info.placement.start),
                        uuid=_text(nv.nvmlDeviceGetUUID(mh)),
                        memory_total_bytes=int(nv.nvmlDeviceGetMemoryInfo(mh).total),
                    )
                )
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._nv.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml() -> PynvmlNvml | None:
    """The real NVML, or ``None`` where ``nvidia-ml-py`` or an NVIDIA driver is missing.

    ``None`` (rather than an error) because a CPU machine is a normal place to run snugfit:
    callers record VRAM fields as null there.
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        return PynvmlNvml(pynvml)
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        return None


@dataclass
class FakeGpu:
    """One simulated device. ``used_script`` values are returned by successive reads of
    ``memory_used_bytes`` (the last one repeats); empty means ``used_bytes`` is returned."""

    name: str = "NVIDIA H200"
    total_bytes: int = 143_771_369_472
    used_bytes: int = 0
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    used_script: list[int] = field(default_factory=list)
    #: MIG instances as (profile, start slot, memory bytes); their UUIDs are derived.
    mig: list[tuple[str, int, int]] = field(default_factory=list)
    #: MIG mode; None: on exactly when ``mig`` lists instances. Creating needs it True.
    mig_mode: bool | None = None


class FakeNvml:
    """In-memory NVML for tests: set ``gpus[i].used_bytes`` or give a ``used_script``."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu] | None = None,
        *,
        driver: str = "560.35.03",
        cuda: str | None = "12.6",
    ) -> None:
        self.gpus = list(gpus) if gpus is not None else [FakeGpu()]
        self._driver = driver
        self._cuda = cuda
        self.reads = 0
        self.closed = False
        self.mig_log: list[tuple[str, int, str, int]] = []
        self._lock = threading.Lock()

    def _gpu(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise IndexError(
                f"fake NVML has {len(self.gpus)} device(s); index {index} is out of range"
            )
        return self.gpus[index]

    def device_count(self) -> int:
        return len(self.gpus)

    def device_name(self, index: int) -> str:
        return self._gpu(index).name

    def device_uuid(self, index: int) -> str:
        return self._gpu(index).uuid

    def memory_total_bytes(self, index: int) -> int:
        return self._gpu(index).total_bytes

    def memory_used_bytes(self, index: int) -> int:
        gpu = self._gpu(index)
        with self._lock:
            self.reads += 1
            if gpu.used_script:
                value = gpu.used_script.pop(0) if len(gpu.used_script) > 1 else gpu.used_script[0]
                gpu.used_bytes = value
            return gpu.used_bytes

    def driver_version(self) -> str:
        return self._driver

    def mig_devices(self) -> list[MigDevice]:
        return [
            MigDevice(
                parent_index=i,
                profile=profile,
                start=start,
                uuid=f"MIG-{g.uuid.removeprefix('GPU-')[:-4]}{i:02d}{start:02d}",
                memory_total_bytes=mem,
            )
            for i, g in enumerate(self.gpus)
            for profile, start, mem in g.mig
        ]

    def mig_enabled(self, index: int) -> bool | None:
        g = self._gpu(index)
        return bool(g.mig) if g.mig_mode is None else g.mig_mode

    def create_mig(self, index: int, profile: str, start: int) -> str:
        """Like NVML: needs MIG mode on and the start slot free; ``log`` records each call."""
        g = self._gpu(index)
        if not self.mig_enabled(index):
            raise RuntimeError(f"fake NVML: MIG mode is off on GPU {index}")
        if any(s == start for _, s, _ in g.mig):
            raise RuntimeError(f"fake NVML: slot {start} of GPU {index} is taken (In use)")
        gb = int(profile.split(".")[1].removesuffix("gb"))
        g.mig.append((profile, start, gb << 30))
        self.mig_log.append(("create", index, profile, start))
        return next(
            m.uuid for m in self.mig_devices() if (m.parent_index, m.start) == (index, start)
        )

    def destroy_mig(self, index: int, profile: str, start: int) -> None:
        g = self._gpu(index)
        before = len(g.mig)
        g.mig = [m for m in g.mig if (m[0], m[1]) != (profile, start)]
        if len(g.mig) == before:
            raise RuntimeError(f"fake NVML: no {profile} instance at slot {start} of GPU {index}")
        self.mig_log.append(("destroy", index, profile, start))

    def cuda_driver_version(self) -> str | None:
        return self._cuda

    def close(self) -> None:
        self.closed = True


class PeakSampler:
    """Polls ``memory_used_bytes`` of the given devices from a daemon thread; keeps the peak.

    Use as a context manager around the work to measure. ``peak_bytes`` is the largest sum over
    ``indices`` seen in one poll (a job spanning two GPUs peaks on the pair, per poll). A read
    that raises stops nothing: the error is kept in ``errors`` and sampling goes on, because a
    lost sample must not kill the job being measured.
    """

    def __init__(
        self,
        nvml: Nvml,
        indices: Iterable[int] = (0,),
        *,
        interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}; try 0.005")
        self._nvml = nvml
        self.indices = tuple(indices)
        if not self.indices:
            raise ValueError("PeakSampler needs at least one device index, got none")
        self.interval_s = interval_s
        self.peak_bytes: int | None = None
        self.per_device_peak_bytes: dict[int, int] = {}
        self.n_samples = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample(self) -> int | None:
        """Take one reading now (also called by the thread); returns the summed used bytes."""
        try:
            values = {i: self._nvml.memory_used_bytes(i) for i in self.indices}
        except Exception as exc:
            with self._lock:
                if len(self.errors) < 10:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            return None
        total = sum(values.values())
        with self._lock:
            self.n_samples += 1
            if self.peak_bytes is None or total > self.peak_bytes:
                self.peak_bytes = total
            for i, v in values.items():
                if v > self.per_device_peak_bytes.get(i, -1):
                    self.per_device_peak_bytes[i] = v
        return total

    def reset(self) -> None:
        """Forget the peak so far (e.g. after a set-up phase that is not part of the job)."""
        with self._lock:
            self.peak_bytes = None
            self.per_device_peak_bytes = {}
        self.sample()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> PeakSampler:
        if self._thread is not None:
            raise RuntimeError("PeakSampler already started; create a new one per measurement")
        self.sample()
        self._thread = threading.Thread(target=self._run, name="snugfit-nvml-peak", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int | None:
        """Stop the thread, take a final reading, return the peak (None if nothing was read)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 10 * self.interval_s))
        self.sample()
        return self.peak_bytes

    def __enter__(self) -> PeakSampler:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
