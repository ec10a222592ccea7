"""The real-hardware paths on a GPU node (``pytest -m gpu``): MIG create/destroy through NVML
and an MPS daemon per GPU. Each skips with the reason when the node cannot run it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workers.mig import MigSlices, mig_control
from workers.mps import MPS_CONTROL, MpsDaemons
from workers.nvml import mig_devices, open_nvml

pytestmark = pytest.mark.gpu


def test_dynamic_mig_slice_round_trip_on_a_real_gpu() -> None:
    nvml = open_nvml()
    if nvml is None:
        pytest.skip("no NVML on this machine")
    control = mig_control(nvml)
    assert control is not None
    gpu = next((k for k in range(nvml.device_count()) if control.mig_enabled(k)), None)
    if gpu is None:
        pytest.skip("no GPU with MIG mode on (enable it: nvidia-smi -i N -mig 1 + reset)")
    if any(m.parent_index == gpu for m in mig_devices(nvml)):
        pytest.skip(f"GPU {gpu} already has MIG instances; run on an empty MIG GPU")
    uuids: dict[tuple[int, str, int], str] = {}
    name = nvml.device_name(gpu)
    profile = "1g.18gb" if "H200" in name else "1g.23gb" if "B200" in name else "1g.10gb"
    slices = MigSlices(nvml, control, {gpu: gpu}, None, uuids)
    try:
        uuid = slices.acquire(gpu, profile, 0)
        assert uuid.startswith("MIG-")
        assert any(m.uuid == uuid for m in mig_devices(nvml))
    finally:
        slices.release(gpu, profile, 0)
    assert not any(m.parent_index == gpu for m in mig_devices(nvml))


def test_mps_daemon_starts_and_answers_on_a_real_gpu(tmp_path: Path) -> None:
    if shutil.which(MPS_CONTROL) is None:
        pytest.skip(f"{MPS_CONTROL} is not on PATH")
    nvml = open_nvml()
    if nvml is None or nvml.device_count() == 0:
        pytest.skip("no NVIDIA GPU")
    d = MpsDaemons(tmp_path, [0], {0: nvml.device_uuid(0)})
    try:
        assert d.ensure() == []
        assert d.answers(0)
    finally:
        d.stop()
