"""openb trace files for the replay, core-replay and ``snugfit simulate openb`` tests: the CSV
headers of the Alibaba openb node and pod lists, and a writer for a pod list."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["G2_T4_NODES", "NODE_HEAD", "POD_HEAD", "write_pods"]

NODE_HEAD = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEAD = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
#: Two 8-GPU G2 nodes and one 2-GPU T4 node, the head of each test's node list.
G2_T4_NODES = NODE_HEAD + "n0,64000,262144,8,G2\nn1,64000,262144,8,G2\nn2,32000,131072,2,T4\n"


def write_pods(folder: Path, rows: Iterable[str], name: str = "pods.csv") -> Path:
    """A pod list of these CSV rows (no header) in ``folder``."""
    path = folder / name
    path.write_text(POD_HEAD + "\n".join(rows) + "\n")
    return path
