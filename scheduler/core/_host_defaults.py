"""CPU cores and host memory per GPU of a typical node of each GPU type, for pool nodes that
do not state their own.

Each figure is NVIDIA's 8-GPU DGX system of that GPU divided by 8, so an 8-GPU node gets the
DGX figure and a 4-GPU node half of it:

* A100-40GB: DGX A100 320GB, 2x AMD EPYC 7742 (128 cores), 1 TB system memory;
* A100-80GB: DGX A100 640GB, the same CPUs, 2 TB;
* H100-80GB: DGX H100, 2x Intel Xeon Platinum 8480C (112 cores), 2 TB;
* H200-141GB: DGX H200, the same CPUs (112 cores), 2 TB (also NVIDIA's MLPerf Inference v4.1
  system description ``H200-SXM-141GBx8``: 2 x 56 cores, 2 TB);
* B200-180GB: DGX B200, 2x Intel Xeon Platinum 8570 (112 cores), 2 TB standard ("up to 4 TB").

Cores, not hardware threads (Slurm's ``CPUs`` counts threads on hyper-threaded nodes; state
``cpus`` on the node to use threads). "TB" in these datasheets is taken as TiB.
"""

from __future__ import annotations

__all__ = ["HOST_PER_GPU"]

#: GPU type -> (CPU cores per GPU, host memory GiB per GPU).
HOST_PER_GPU: dict[str, tuple[float, float]] = {
    "A100-40GB": (128 / 8, 1024 / 8),
    "A100-80GB": (128 / 8, 2048 / 8),
    "H100-80GB": (112 / 8, 2048 / 8),
    "H200-141GB": (112 / 8, 2048 / 8),
    "B200-180GB": (112 / 8, 2048 / 8),
}
