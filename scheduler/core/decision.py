"""What the scheduler decided for one job, with every option it weighed and why each lost.

A :class:`Decision` is the unit of the placement log: the service stores ``to_dict()`` in Redis
and ``snugfit explain`` renders it. Both classes are plain dataclasses (built by the thousand per
tick, so no validation cost here); ``from_dict`` is the exact inverse of ``to_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Literal

import orjson

from scheduler.core.reasons import encode_reasons, word_reasons
from scheduler.core.stored import encode_runs, expand_runs
from scheduler.exceptions import SchedulerError

__all__ = ["Decision", "DecisionState", "Option", "OptionKind", "option_label"]

OptionKind = Literal["whole", "mig", "shared"]
DecisionState = Literal["placed", "pending", "rejected"]

_KINDS: frozenset[str] = frozenset({"whole", "mig", "shared"})
_STATES: frozenset[str] = frozenset({"placed", "pending", "rejected"})


@dataclass(slots=True)
class Option:
    """One way to run a job: whole GPUs of a type, a MIG slice, or a share of one GPU.

    Memory figures are per GPU in GiB. ``capacity_gib`` is the slot size (the whole GPU, the
    MIG slice, or the shared GPU); ``reserved_gib`` is what the job holds in it, never below
    ``vram_upper_gib``. ``leftover_gib`` is the memory of the chosen GPU(s) this job leaves
    unreserved (for a shared GPU: what stays free on it). ``cpus`` and ``host_memory_gib`` are
    what the job takes of its node's cores and RAM (set once the option is bound to a node;
    None on older records, which take none). ``runtime_s`` is the predicted runtime
    *on this option* (a MIG slice is slower than its whole GPU). ``gpu_indices`` index the pool's
    GPUs and are empty when the option does not fit now. Treat instances as immutable once they
    are inside a :class:`Decision`: :meth:`to_dict` keeps its first answer (the leader asks
    for the chosen and runner-up options' dicts several times per placed job).
    """

    kind: OptionKind
    gpu_type: str
    node: str | None
    gpu_indices: tuple[int, ...]
    mig_profile: str | None
    n_gpus: int
    capacity_gib: float
    reserved_gib: float
    vram_gib: float | None
    vram_upper_gib: float | None
    runtime_s: float | None
    cost_usd: float | None
    fits_now: bool
    fits_empty: bool
    reason: str = ""
    mig_start: int | None = None
    leftover_gib: float | None = None
    cpus: float | None = None
    host_memory_gib: float | None = None
    #: Nodes a whole-GPU option spans (a multi-node gang, :mod:`scheduler.core.gang`); then
    #: ``node`` is the rendezvous master's, ``gpu_indices`` run in rank order, and ``cpus`` /
    #: ``host_memory_gib`` are what each node gives.
    n_nodes: int = 1
    _dict: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def label(self) -> str:
        """Short human name: ``H100-80GB x2``, ``A100-80GB MIG 1g.10gb``, ``H100-80GB shared``,
        ``H100-80GB x16 (2 nodes)``."""
        return option_label(self.kind, self.gpu_type, self.mig_profile, self.n_gpus, self.n_nodes)

    def to_dict(self) -> dict[str, Any]:
        """The record (a new dict each call)."""
        cached = self._dict
        if cached is None:
            cached = dict(zip(_OPTION_NAMES, _ROW(self), strict=True))
            for key in _FLOAT_FIELDS:
                cached[key] = _finite_or_none(cached[key])
            self._dict = cached
        return {**cached, "gpu_indices": list(self.gpu_indices)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Option:
        unknown = set(data) - _OPTION_FIELDS
        if unknown:
            raise SchedulerError(
                f"option record has unknown keys {sorted(unknown)}; "
                f"expected {sorted(_OPTION_FIELDS)}"
            )
        kind = data.get("kind")
        if kind not in _KINDS:
            raise SchedulerError(f"option kind must be one of {sorted(_KINDS)}; got {kind!r}")
        kwargs = dict(data)
        kwargs["gpu_indices"] = tuple(int(i) for i in data.get("gpu_indices", ()))
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise SchedulerError(f"option record is incomplete: {exc}") from None


def option_label(
    kind: str, gpu_type: str, mig_profile: str | None, n_gpus: int, n_nodes: int = 1
) -> str:
    """:attr:`Option.label` from the fields it reads (a stored option dict names them)."""
    if kind == "mig":
        return f"{gpu_type} MIG {mig_profile}"
    if kind == "shared":
        return f"{gpu_type} shared"
    if n_nodes > 1:
        return f"{gpu_type} x{n_gpus} ({n_nodes} nodes)"
    return f"{gpu_type} x{n_gpus}"


# Field order, computed once: dataclasses.fields() per option was a third of to_dict's cost.
_OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Option) if f.init)
_OPTION_FIELDS: frozenset[str] = frozenset(_OPTION_NAMES)
_FLOAT_FIELDS: tuple[str, ...] = (
    "vram_gib",
    "vram_upper_gib",
    "runtime_s",
    "cost_usd",
    "leftover_gib",
    "cpus",
    "host_memory_gib",
)


def _finite_or_none(v: Any) -> Any:
    # JSON has no inf/NaN; an unknown figure is stored as null instead.
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class Decision:
    """The outcome for one job at one scheduling tick.

    ``chosen`` and ``runner_up`` index ``options``; ``chosen`` is set only when ``state`` is
    ``placed``. ``reason`` explains the outcome as a whole (why this option, why waiting, why
    rejected); each option's own ``reason`` says why it lost.

    Policies decide for thousands of queued jobs per tick, so ``options`` and ``reason`` may
    be given as thunks over immutable arrays (``options_thunk``, ``reason_thunk``) and are only
    built when first read. Until then a lazy decision keeps its tick's option arrays alive
    (the whole queue's): keep ``to_dict()`` rather than the object when storing many.
    """

    __slots__ = (
        "_columns_json_thunk",
        "_columns_thunk",
        "_committed",
        "_option_thunk",
        "_options",
        "_reason",
        "_reason_thunk",
        "_runner",
        "_thunk",
        "chosen",
        "job_id",
        "policy",
        "runner_up",
        "state",
        "time_s",
    )

    def __init__(
        self,
        job_id: str,
        policy: str,
        state: DecisionState,
        options: list[Option] | None = None,
        chosen: int | None = None,
        reason: str = "",
        runner_up: int | None = None,
        time_s: float = 0.0,
        *,
        options_thunk: Callable[[], list[Option]] | None = None,
        reason_thunk: Callable[[], str] | None = None,
        committed: Option | None = None,
        option_thunk: Callable[[int], Option] | None = None,
        columns_thunk: Callable[[], dict[str, list[Any]]] | None = None,
        columns_json_thunk: Callable[[], tuple[int, bytes]] | None = None,
    ) -> None:
        self.job_id = job_id
        self.policy = policy
        self.state: DecisionState = state
        self._options = options
        self._thunk = options_thunk if options is None else None
        self.chosen = chosen
        self._reason = reason
        self._reason_thunk = reason_thunk if not reason else None
        self.runner_up = runner_up
        self.time_s = time_s
        # A placed decision carries the option it committed (the one the pool state holds),
        # and optionally builds one option, or every option's columns, straight from the
        # policy's arrays, so the commit path never builds the whole option list.
        self._committed = committed
        self._option_thunk = option_thunk if options is None else None
        self._columns_thunk = columns_thunk if options is None else None
        self._columns_json_thunk = columns_json_thunk if options is None else None
        # The runner-up, once built from the arrays: the placement record, the RQ meta and the
        # stored decision all read it.
        self._runner: Option | None = None

    @property
    def options(self) -> list[Option]:
        if self._options is None:
            self._options = self._thunk() if self._thunk is not None else []
            self._thunk = None
        return self._options

    @options.setter
    def options(self, value: list[Option]) -> None:
        self._options = value
        self._thunk = self._option_thunk = self._columns_thunk = None
        self._columns_json_thunk = None

    @property
    def reason(self) -> str:
        if self._reason_thunk is not None:
            self._reason = self._reason_thunk()
            self._reason_thunk = None
        return self._reason

    @reason.setter
    def reason(self, value: str) -> None:
        self._reason = value
        self._reason_thunk = None

    @property
    def chosen_option(self) -> Option | None:
        """The chosen option; for a placed decision, the very Option committed (no list built)."""
        if self.chosen is None:
            return None
        if self._committed is not None:
            return self._committed
        return self.options[self.chosen]

    @property
    def runner_up_option(self) -> Option | None:
        return None if self.runner_up is None else self.option(self.runner_up)

    def option(self, i: int) -> Option:
        """Option ``i``; a lazy decision builds only that one from its arrays."""
        if self._options is None:
            if i == self.chosen and self._committed is not None:
                return self._committed
            if self._option_thunk is not None:
                if i != self.runner_up:
                    return self._option_thunk(i)
                if self._runner is None:
                    self._runner = self._option_thunk(i)
                return self._runner
        return self.options[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Decision(job_id={self.job_id!r}, policy={self.policy!r}, state={self.state!r}, "
            f"chosen={self.chosen!r}, reason={self.reason!r}, time_s={self.time_s!r})"
        )

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        """The record; ``from_dict`` is its exact inverse in either form.

        ``compact`` (what the service stores, thousands per second) keeps every option's numbers
        as columns under ``option_columns`` (one list per field, no repeated keys; the fields
        that repeat one value over long stretches as runs, :mod:`scheduler.core.stored`), and
        in ``options`` only the chosen and runner-up options as dicts (``null`` elsewhere), so
        readers that only want those two index ``options`` as before.
        """
        options: list[Any]
        columns: dict[str, Any] = {}
        if compact and self._options is None and self._columns_thunk is not None:
            # The hot path: columns straight from the arrays, two options built as dicts.
            columns = self._columns_thunk()
            n = len(columns["kind"])
            options = [None] * n
            for i in (self.chosen, self.runner_up):
                if i is not None and 0 <= i < n:
                    options[i] = self.option(i).to_dict()
        else:
            opts = self.options
            if not compact:
                options = [o.to_dict() for o in opts]
            else:
                options = [None] * len(opts)
                for i in (self.chosen, self.runner_up):
                    if i is not None and 0 <= i < len(opts):
                        options[i] = opts[i].to_dict()
                listed = _columns(opts)
                encode_reasons(listed, self.chosen)
                columns = encode_runs(listed)
        out = self._head(options)
        if compact:
            out["option_columns"] = columns
        return out

    def compact_json(self) -> bytes | None:
        """``orjson.dumps(self.to_dict(compact=True))`` byte for byte, with the columns from
        the policy's JSON templates (:func:`~scheduler.core.table_columns.table_columns_json`);
        None where this decision has no such columns (write ``to_dict`` then)."""
        if self._options is not None or self._columns_json_thunk is None:
            return None
        n, columns = self._columns_json_thunk()
        options: list[Any] = [None] * n
        for i in (self.chosen, self.runner_up):
            if i is not None and 0 <= i < n:
                options[i] = self.option(i).to_dict()
        raw = orjson.dumps(self._head(options), option=orjson.OPT_SERIALIZE_NUMPY)
        return raw[:-1] + b',"option_columns":' + columns + b"}"

    def _head(self, options: list[Any]) -> dict[str, Any]:
        """The stored form's fields before ``option_columns``, in their stored order."""
        return {
            "job_id": self.job_id,
            "policy": self.policy,
            "state": self.state,
            "options": options,
            "chosen": self.chosen,
            "reason": self.reason,
            "runner_up": self.runner_up,
            "time_s": self.time_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        allowed = set(_DECISION_KEYS)
        unknown = set(data) - allowed
        if unknown:
            raise SchedulerError(
                f"decision record has unknown keys {sorted(unknown)}; expected {sorted(allowed)}"
            )
        state = data.get("state")
        if state not in _STATES:
            raise SchedulerError(f"decision state must be one of {sorted(_STATES)}; got {state!r}")
        columns = data.get("option_columns")
        if columns is not None:
            chosen = data.get("chosen")
            options = _from_columns(columns, chosen if type(chosen) is int else None)
        else:
            options = [Option.from_dict(o) for o in data.get("options", [])]
        for key in ("chosen", "runner_up"):
            idx = data.get(key)
            if idx is not None and not 0 <= idx < len(options):
                raise SchedulerError(
                    f"decision {key}={idx} is out of range for {len(options)} options"
                )
        return cls(
            job_id=str(data["job_id"]),
            policy=str(data["policy"]),
            state=state,
            options=options,
            chosen=data.get("chosen"),
            reason=str(data.get("reason", "")),
            runner_up=data.get("runner_up"),
            time_s=float(data.get("time_s", 0.0)),
        )


_DECISION_KEYS = (
    "job_id",
    "policy",
    "state",
    "options",
    "option_columns",
    "chosen",
    "reason",
    "runner_up",
    "time_s",
)


_ROW = attrgetter(*_OPTION_NAMES)
_FLOAT_POS = frozenset(_OPTION_NAMES.index(k) for k in _FLOAT_FIELDS)
_INDICES_POS = _OPTION_NAMES.index("gpu_indices")


def _columns(opts: list[Option]) -> dict[str, list[Any]]:
    # One C-level attrgetter per option and a transpose: several times cheaper than a dict per
    # option, and the service writes thousands of these per second.
    cols = list(zip(*map(_ROW, opts), strict=True)) if opts else [()] * len(_OPTION_NAMES)
    out: dict[str, list[Any]] = {}
    for k, name in enumerate(_OPTION_NAMES):
        col = cols[k]
        if k in _FLOAT_POS:
            out[name] = [_finite_or_none(v) for v in col]
        elif k == _INDICES_POS:
            out[name] = [list(g) for g in col]
        else:
            out[name] = list(col)
    return out


def _from_columns(columns: Any, chosen: int | None) -> list[Option]:
    if not isinstance(columns, Mapping):
        raise SchedulerError(
            f"decision option_columns must be an object of lists; got {type(columns).__name__}"
        )
    unknown = set(columns) - _OPTION_FIELDS
    if unknown:
        raise SchedulerError(
            f"option_columns has unknown keys {sorted(unknown)}; expected {sorted(_OPTION_FIELDS)}"
        )
    columns = expand_runs(columns)
    lengths = {len(v) if isinstance(v, list) else -1 for v in columns.values()}
    if len(lengths) > 1 or -1 in lengths:
        raise SchedulerError(
            f"option_columns must be lists of one length; got lengths {sorted(lengths)}"
        )
    n = lengths.pop() if lengths else 0
    if n:
        columns = word_reasons(columns, chosen)
    names = list(columns)
    return [Option.from_dict({k: columns[k][i] for k in names}) for i in range(n)]
