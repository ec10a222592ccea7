"""Bounds on job specs and on what is read to validate them, defined once.

:class:`predictor.spec.JobSpec` and the scheduler's request record
(``scheduler.service.store.records.RequestRecord``) both use these, so a spec the client
accepts is never refused later as a malformed record. The read caps keep hostile input (a YAML
alias bomb, a 1 GB ``config.json``, deep nesting) from taking the machine's memory or stack.
"""

from __future__ import annotations

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CPUS",
    "MAX_GPUS",
    "MAX_HOST_MEMORY_GIB",
    "MAX_JOB_FILE_BYTES",
    "MAX_MODEL_NAME_CHARS",
    "MAX_NESTING",
    "MAX_PARALLEL",
    "MAX_PRIORITY",
    "MAX_RUNTIME_S",
    "MAX_VRAM_GIB",
    "MAX_YAML_NODES",
    "MIN_PRIORITY",
]

#: GPUs one job may ask for (the largest published training runs use 16,384 GPUs; the
#: measured data holds 2,048-GPU jobs).
MAX_GPUS = 65536

#: Tensor / pipeline parallel degree.
MAX_PARALLEL = 1024

MIN_PRIORITY = -(10**6)
MAX_PRIORITY = 10**6

#: Per-GPU VRAM figures (a prediction, a reservation floor after an OOM), GiB.
MAX_VRAM_GIB = 1.0e5

#: CPU cores one job or one node may name (the largest two-socket x86 servers have 384 cores,
#: 768 threads; a 4096 figure is a typo, not a node).
MAX_CPUS = 4096

#: Host memory one job or one node may name, GiB (the largest servers hold 32 TiB).
MAX_HOST_MEMORY_GIB = 65536.0

#: Runtimes and deadlines, seconds (about 31 years).
MAX_RUNTIME_S = 1.0e9

#: A model name or config.json path (Linux PATH_MAX is 4096; a file name at most 255).
MAX_MODEL_NAME_CHARS = 1024

#: A Hugging Face config.json is a few KB; anything this big is not one.
MAX_CONFIG_BYTES = 4 << 20

#: A job file (JSON, JSONL or YAML): millions of jobs fit; a multi-GB file is refused unread.
MAX_JOB_FILE_BYTES = 256 << 20

#: YAML nodes after alias expansion (a 1 KB "billion laughs" file expands to billions).
MAX_YAML_NODES = 2_000_000

#: Nesting depth of a JSON/YAML document or an explicit model object.
MAX_NESTING = 64
