"""The traced tier: exact peak memory from the real PyTorch program, traced on the CPU.

The job's model is built from its architecture with transformers on the meta device and one
training step (or a prefill plus the last decode step) runs under a storage tracker; a model of
the CUDA caching allocator turns the allocation sequence into the allocated and reserved
peaks. Traces run in a small worker pool with a time limit and land in an on-disk cache keyed
by a fingerprint, so a prediction never waits for torch unless asked to:

* :class:`TracedPredictor` answers from the cache (``wait=False``, the default) or traces what
  is missing first (``wait=True``); jobs without a trace get the analytical answer;
* :func:`trace_specs` warms the cache (``snugfit trace``);
* :func:`wait_for_traces` (one job: :func:`wait_for_trace`) is the submit path's wait: the
  client waits up to a budget (default :data:`SUBMIT_BUDGET_S`) for the jobs' traces, then
  predicts with whatever is there;
* :func:`unsupported_reason` says why a job is not traced (serving engines that preallocate
  by fraction, ``torch.compile``, DeepSpeed and Megatron internals, Unsloth kernels, fp8/fp4
  compute, MLA attention); those jobs and failed traces fall back to the analytical tier, and
  a failure is recorded in the cache.

Without torch, transformers and peft (``pip install 'snugfit[trace]'``) :func:`is_available`
is false and every job gets the analytical answer.
"""

from __future__ import annotations

from ._api import (
    DEFAULT_TIMEOUT_S,
    METHOD,
    SUBMIT_BUDGET_S,
    TracedPredictor,
    TraceOutcome,
    is_available,
    trace_specs,
    unsupported_reason,
    wait_for_trace,
    wait_for_traces,
)
from .cache import TRACER_VERSION, TraceCache, fingerprint
from .exceptions import TraceError, TraceTimeout, TraceUnavailable, TraceUnsupported

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "METHOD",
    "SUBMIT_BUDGET_S",
    "TRACER_VERSION",
    "TraceCache",
    "TraceError",
    "TraceOutcome",
    "TraceTimeout",
    "TraceUnavailable",
    "TraceUnsupported",
    "TracedPredictor",
    "fingerprint",
    "is_available",
    "trace_specs",
    "unsupported_reason",
    "wait_for_trace",
    "wait_for_traces",
]
