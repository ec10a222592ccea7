"""MIG on the node: create and destroy the slices a dynamic layout places, check a static one.

A **dynamic** node (``mig = "dynamic"``) starts with no instances: before a job starts, the
worker creates the GPU instance at the placement's start slot (NVML's placement-aware
``nvmlDeviceCreateGpuInstanceWithPlacement``) and one compute instance spanning it, and exposes
only that slice's UUID; when the job ends, both are destroyed. A **static** node's layout is
compared with what NVML reports when the worker starts; on a mismatch the node refuses work and
says why (its node record's ``refuse`` field, which the scheduler and ``snugfit pool`` read).

The MIG *mode* is never changed here: enabling or disabling it needs the GPU idle and reset
(``nvidia-smi -i N -mig 1`` then a reset or reboot), an operator step.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from workers.nvml import Nvml, PynvmlNvml, mig_devices

__all__ = ["MigControl", "MigSlices", "PynvmlMig", "SliceUnavailable", "mig_control"]

log = logging.getLogger("snugfit.worker.mig")

#: Room for every instance one GPU can hold (7 on the 7-slice GPUs), in NVML array calls.
_MAX_INSTANCES = 16
_PROFILE_RE = re.compile(r"(\d+)g\.(\d+)gb", re.IGNORECASE)


class SliceUnavailable(Exception):
    """A MIG slice cannot be given to a job (not found, cannot be created)."""


@runtime_checkable
class MigControl(Protocol):
    """What the worker needs to manage MIG instances. NVML indices, profile names as in the
    pool ("3g.40gb") and GPU-instance placement start slots."""

    def mig_enabled(self, index: int) -> bool | None:
        """True/False: the current MIG mode; None when the device cannot tell."""

    def create_mig(self, index: int, profile: str, start: int) -> str:
        """Create the GPU + compute instance; return the MIG device UUID."""

    def destroy_mig(self, index: int, profile: str, start: int) -> None:
        """Destroy the instance at ``start`` (its compute instances first)."""


def mig_control(nvml: Nvml | None) -> MigControl | None:
    """The MIG control of an NVML edge, or None where it has none (no NVML, old fakes)."""
    if nvml is None:
        return None
    if isinstance(nvml, PynvmlNvml):
        return PynvmlMig(nvml)
    return nvml if isinstance(nvml, MigControl) else None


class MigSlices:
    """The MIG slices of one node's GPUs, as its worker manages them.

    ``layout`` is the pool's static layout per local GPU (None: dynamic). ``local`` maps pool
    GPU index -> NVML index. ``uuids`` is the worker's (pool GPU, profile, start) -> UUID map,
    kept up to date as slices come and go.
    """

    def __init__(
        self,
        nvml: Nvml,
        control: MigControl | None,
        local: dict[int, int],
        layout: Sequence[Sequence[tuple[str, int]]] | None,
        uuids: dict[tuple[int, str, int], str],
    ) -> None:
        self.nvml = nvml
        self.control = control
        self.local = local
        self.layout = layout
        self.uuids = uuids
        self._created: set[tuple[int, str, int]] = set()
        self._lock = threading.Lock()

    @property
    def dynamic(self) -> bool:
        return self.layout is None

    def problems(self) -> list[str]:
        """Why this node cannot run its MIG placements (empty: it can)."""
        out: list[str] = []
        found = mig_devices(self.nvml)
        for k in sorted(self.local.values()):
            enabled = self.control.mig_enabled(k) if self.control is not None else None
            if enabled is False:
                out.append(
                    f"GPU {k}: MIG mode is off; enable it (`nvidia-smi -i {k} -mig 1`, then reset "
                    "the GPU): an operator step, snugfit never changes the MIG mode"
                )
                continue
            have = sorted((m.profile, m.start) for m in found if m.parent_index == k)
            if self.layout is None:
                if self.control is None:
                    out.append(f"GPU {k}: this NVML cannot create MIG instances (dynamic layout)")
                continue
            want = sorted(self.layout[k]) if k < len(self.layout) else []
            if have != want:
                out.append(
                    f"GPU {k}: the pool's static MIG layout is {_fmt(want)} but NVML reports "
                    f"{_fmt(have)}; create it (`nvidia-smi mig -cgi ... -C`) or fix the pool file"
                )
        return out

    def clear_leftovers(self) -> None:
        """Dynamic layout: destroy instances a previous worker left (it owns the whole GPU)."""
        if not self.dynamic or self.control is None:
            return
        nvml_to_pool = {k: g for g, k in self.local.items()}
        for m in mig_devices(self.nvml):
            if m.parent_index in nvml_to_pool:
                try:
                    self.control.destroy_mig(m.parent_index, m.profile, m.start)
                    log.warning("destroyed leftover MIG instance %s@%s", m.profile, m.start)
                except Exception as exc:  # in use by a process we do not know: leave it
                    log.warning("leftover MIG instance %s@%s kept: %s", m.profile, m.start, exc)

    def acquire(self, pool_gpu: int, profile: str, start: int) -> str:
        """The UUID of the slice, created first on a dynamic layout; SliceUnavailable if not."""
        key = (pool_gpu, profile, start)
        k = self.local.get(pool_gpu, pool_gpu)
        with self._lock:
            if not self.dynamic:
                uuid = self.uuids.get(key)
                if uuid is None:
                    raise SliceUnavailable(
                        f"MIG slice {profile}@{start} of GPU {k} not found (static layout); "
                        "refusing to fall back to the whole GPU"
                    )
                return uuid
            if self.control is None:
                raise SliceUnavailable(
                    f"cannot create MIG slice {profile}@{start} on GPU {k}: no NVML MIG control "
                    "on this node; refusing to fall back to the whole GPU"
                )
            try:
                uuid = self.control.create_mig(k, profile, start)
            except Exception as exc:
                raise SliceUnavailable(
                    f"creating MIG slice {profile}@{start} on GPU {k} failed: {exc}; refusing to "
                    "fall back to the whole GPU"
                ) from None
            self._created.add(key)
            self.uuids[key] = uuid
            return uuid

    def release(self, pool_gpu: int, profile: str, start: int) -> None:
        """Destroy a slice this worker created (a static slice stays)."""
        key = (pool_gpu, profile, start)
        with self._lock:
            if key not in self._created or self.control is None:
                return
            self._created.discard(key)
            self.uuids.pop(key, None)
            try:
                self.control.destroy_mig(self.local.get(pool_gpu, pool_gpu), profile, start)
            except Exception as exc:
                # Left in place: the next create at an overlapping slot fails with a reason,
                # and a restarted worker clears it.
                log.error("destroying MIG slice %s@%s failed: %s", profile, start, exc)


def _fmt(items: Sequence[tuple[str, int]]) -> str:
    return "[" + ", ".join(f"{p}@{s}" for p, s in items) + "]" if items else "no instances"


class PynvmlMig:
    """MIG instance management through ``nvidia-ml-py`` (needs root or the MIG capability)."""

    def __init__(self, nvml: PynvmlNvml) -> None:
        self._nvml = nvml
        self._nv: Any = nvml._nv

    def _h(self, index: int) -> Any:
        return self._nv.nvmlDeviceGetHandleByIndex(index)

    def mig_enabled(self, index: int) -> bool | None:
        try:
            current, _pending = self._nv.nvmlDeviceGetMigMode(self._h(index))
        except Exception:  # not MIG-capable, or too old a driver
            return None
        return bool(current == self._nv.NVML_DEVICE_MIG_ENABLE)

    def _gi_profile(self, h: Any, profile: str) -> Any:
        """The GPU-instance profile info whose name (or slices and memory) is ``profile``."""
        nv = self._nv
        m = _PROFILE_RE.fullmatch(profile)
        if m is None:
            raise SliceUnavailable(f"not a MIG profile name: {profile!r}")
        slices, gb = int(m.group(1)), int(m.group(2))
        best: tuple[float, Any] | None = None
        for pid in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, pid)
            except Exception:  # profile not supported on this GPU
                continue
            name = getattr(info, "name", b"")
            name = name.decode() if isinstance(name, bytes) else str(name)
            if profile.lower() in name.lower() and "+" not in name:
                return info
            if int(info.sliceCount) == slices:
                gap = abs(int(info.memorySizeMB) / 1024 - gb)
                if best is None or gap < best[0]:
                    best = (gap, info)
        if best is None:
            raise SliceUnavailable(f"GPU does not offer MIG profile {profile}")
        return best[1]

    def _listed(self, item_type: Any, call: Any, *args: Any) -> list[Any]:
        """What an NVML call that fills an array and its count lists (up to ``_MAX_INSTANCES``)."""
        nv = self._nv
        items = (item_type * _MAX_INSTANCES)()
        count = nv.c_uint(_MAX_INSTANCES)
        call(*args, items, nv.byref(count))
        return [items[i] for i in range(count.value)]

    def create_mig(self, index: int, profile: str, start: int) -> str:
        nv = self._nv
        h = self._h(index)
        info = self._gi_profile(h, profile)
        placements = self._listed(
            nv.c_nvmlGpuInstancePlacement_t,
            nv.nvmlDeviceGetGpuInstancePossiblePlacements,
            h,
            info.id,
        )
        chosen = next((p for p in placements if p.start == start), None)
        if chosen is None:
            valid = [p.start for p in placements]
            raise SliceUnavailable(f"{profile} cannot start at slot {start}; valid: {valid}")
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, nv.byref(chosen))
        try:
            ci_profile = self._full_ci_profile(gi, int(info.sliceCount))
            nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
            for k in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(h))):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except Exception:  # empty MIG device slot
                    continue
                if int(nv.nvmlDeviceGetGpuInstanceId(mh)) == gi_id:
                    uuid = nv.nvmlDeviceGetUUID(mh)
                    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            raise SliceUnavailable(f"created {profile}@{start} but NVML lists no MIG device for it")
        except Exception:
            self._destroy_gi(gi)
            raise

    def _full_ci_profile(self, gi: Any, slices: int) -> Any:
        nv = self._nv
        for pid in reversed(range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                ci = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, pid, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except Exception:  # not offered by this GPU instance
                continue
            if int(ci.sliceCount) == slices:
                return ci
        raise SliceUnavailable(f"no compute-instance profile spans {slices} slices")

    def _destroy_gi(self, gi: Any) -> None:
        nv = self._nv
        for pid in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                cis = self._listed(
                    nv.c_nvmlComputeInstance_t, nv.nvmlGpuInstanceGetComputeInstances, gi, pid
                )
            except Exception:  # profile not offered
                continue
            for ci in cis:
                nv.nvmlComputeInstanceDestroy(ci)
        nv.nvmlGpuInstanceDestroy(gi)

    def destroy_mig(self, index: int, profile: str, start: int) -> None:
        nv = self._nv
        h = self._h(index)
        info = self._gi_profile(h, profile)
        for gi in self._listed(nv.c_nvmlGpuInstance_t, nv.nvmlDeviceGetGpuInstances, h, info.id):
            if int(nv.nvmlGpuInstanceGetInfo(gi).placement.start) == start:
                self._destroy_gi(gi)
                return
        raise SliceUnavailable(f"no {profile} instance at slot {start} on GPU {index}")
