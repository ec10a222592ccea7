"""The NVML edge: the fake behaves like the driver, and the peak sampler keeps the true peak."""

from __future__ import annotations

import threading

import pytest

from workers.nvml import FakeGpu, FakeNvml, Nvml, PeakSampler, index_for_uuid, open_nvml

GIB = 1024**3


def test_fake_satisfies_the_interface() -> None:
    fake = FakeNvml()
    assert isinstance(fake, Nvml)
    assert fake.device_count() == 1
    assert fake.device_name(0) == "NVIDIA H200"
    assert fake.memory_total_bytes(0) > 140 * 10**9
    assert fake.driver_version()


def test_fake_rejects_a_missing_device_with_the_count() -> None:
    with pytest.raises(IndexError, match="1 device"):
        FakeNvml().memory_used_bytes(3)


def test_used_script_replays_then_holds_the_last_value() -> None:
    fake = FakeNvml([FakeGpu(used_script=[1, 5, 2])])
    assert [fake.memory_used_bytes(0) for _ in range(5)] == [1, 5, 2, 2, 2]


def test_sampler_keeps_the_peak_not_the_last_value() -> None:
    fake = FakeNvml([FakeGpu(used_script=[1 * GIB, 7 * GIB, 3 * GIB])])
    sampler = PeakSampler(fake, (0,))
    for _ in range(3):
        sampler.sample()
    assert sampler.peak_bytes == 7 * GIB
    assert sampler.n_samples == 3


def test_sampler_thread_sees_a_peak_set_while_it_runs() -> None:
    gpu = FakeGpu(used_bytes=GIB)
    fake = FakeNvml([gpu])
    seen = threading.Event()
    with PeakSampler(fake, (0,), interval_s=0.001) as sampler:
        gpu.used_bytes = 9 * GIB
        # Wait until the thread has read the new value (not a timing assertion: it must happen).
        while fake.reads < 5:
            seen.wait(0.001)
        gpu.used_bytes = 2 * GIB
    assert sampler.peak_bytes == 9 * GIB


def test_sampler_sums_devices_per_poll() -> None:
    fake = FakeNvml([FakeGpu(used_bytes=2 * GIB), FakeGpu(used_bytes=3 * GIB, uuid="GPU-b")])
    sampler = PeakSampler(fake, (0, 1))
    sampler.sample()
    assert sampler.peak_bytes == 5 * GIB
    assert sampler.per_device_peak_bytes == {0: 2 * GIB, 1: 3 * GIB}


def test_sampler_reset_forgets_a_setup_peak() -> None:
    gpu = FakeGpu(used_bytes=30 * GIB)
    sampler = PeakSampler(FakeNvml([gpu]), (0,))
    sampler.sample()
    gpu.used_bytes = 10 * GIB
    sampler.reset()
    assert sampler.peak_bytes == 10 * GIB


def test_a_failing_read_is_kept_not_raised() -> None:
    class Broken(FakeNvml):
        def memory_used_bytes(self, index: int) -> int:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    sampler = PeakSampler(Broken(), (0,))
    assert sampler.sample() is None
    assert sampler.peak_bytes is None
    assert "GPU_IS_LOST" in sampler.errors[0]


def test_sampler_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        PeakSampler(FakeNvml(), (0,), interval_s=0)
    with pytest.raises(ValueError, match="at least one"):
        PeakSampler(FakeNvml(), ())


def test_index_for_uuid_accepts_torch_and_nvml_spellings() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-aaaa"), FakeGpu(uuid="GPU-1234-abcd")])
    assert index_for_uuid(fake, "1234-ABCD") == 1
    assert index_for_uuid(fake, "GPU-aaaa") == 0
    assert index_for_uuid(fake, "ffff") is None


def test_open_nvml_is_none_or_a_working_driver() -> None:
    nvml = open_nvml()
    if nvml is None:
        return  # no driver here: callers record VRAM as null, which is the contract
    try:
        assert nvml.device_count() >= 1
        assert nvml.memory_total_bytes(0) > 0
    finally:
        nvml.close()
