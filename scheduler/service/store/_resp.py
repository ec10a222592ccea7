"""A faster RESP command packer for redis-py's pure-Python path (no hiredis installed), and a
direct script call for the one-job submit.

redis-py's ``PythonRespSerializer`` encodes every argument through ``Encoder.encode`` (five
``isinstance`` checks) and grows its output buffer by one ``join`` per argument. The store's
hot calls carry thousands of arguments (a 2,000-job commit, a 1,000-job ``add``, a
fields read), and packing them cost more CPU than Redis took to run the scripts. This packer
writes the same bytes: ``str``, ``bytes``, ``int`` and ``float`` arguments are encoded inline
and joined in pieces of :data:`_CHUNK_BYTES`; any other type (``bytearray``, ``memoryview``,
``bool``, subclasses such as numpy scalars) goes through redis-py's own encoder, so what it
accepts or refuses is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis._parsers.encoders import Encoder
from redis.utils import HIREDIS_AVAILABLE

__all__ = [
    "Call",
    "FastRespPacker",
    "Packed",
    "calls_send",
    "eval_direct",
    "eval_send",
    "packed_hset",
    "packer_kwargs",
]

#: The packed command is handed over in pieces of about this size (redis-py sends each in
#: turn). A 500-job commit is megabytes of arguments (each job's stored decision is kilobytes):
#: joined whole, every encoded argument and the joined result were fresh memory at once (page
#: faults, an mmap per call), which cost more than the packing itself; pieces reuse memory.
_CHUNK_BYTES = 1 << 16


class FastRespPacker:
    """``pack(*args)`` -> the command's RESP bytes, as redis-py's ``command_packer`` expects."""

    __slots__ = ("_encode", "encoding", "errors")

    def __init__(self, encoding: str = "utf-8", errors: str = "strict") -> None:
        self.encoding = encoding
        self.errors = errors
        self._encode = Encoder(encoding, errors, False).encode

    def pack(self, *args: Any) -> list[bytes]:
        # As redis-py: a command name may hold literal arguments ("SCRIPT LOAD"), sent apart.
        head = args[0]
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        enc, errors, slow = self.encoding, self.errors, self._encode
        out: list[bytes] = []
        parts: list[Any] = [b"*%d\r\n" % len(args)]
        size = 0
        for a in args:
            t = type(a)
            if t is str:
                b = a.encode(enc, errors)
            elif t is bytes:
                b = a
            elif t is int or t is float:
                b = repr(a).encode()
            else:
                b = slow(a)
            parts += (b"$%d\r\n" % len(b), b, b"\r\n")
            size += len(b)
            if size >= _CHUNK_BYTES:
                out.append(b"".join(parts))
                parts, size = [], 0
        if parts:
            out.append(b"".join(parts))
        return out


def packer_kwargs(connection_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``command_packer`` keyword for a pool with these connection kwargs: this packer,
    unless hiredis (whose C packer is faster still) is installed or a packer is already set."""
    if HIREDIS_AVAILABLE or connection_kwargs.get("command_packer") is not None:
        return {}
    packer = FastRespPacker(
        connection_kwargs.get("encoding", "utf-8"),
        connection_kwargs.get("encoding_errors", "strict"),
    )
    return {"command_packer": packer}


def eval_direct(client: redis.Redis, script: Any, args: Sequence[Any]) -> Any:
    """``script(args=args)`` (no keys) as one EVALSHA on a connection of ``client``'s pool,
    without redis-py 8's per-command wrapper (retry closure, observability records): on a
    one-job submit that wrapper cost as much client CPU as packing, sending and parsing.

    The reply is what the wrapper returns (EVALSHA has no response callback), and an error
    reply raises as it does there. When the connection fails, or the server does not hold the
    script, the call is made again the ordinary way, with redis-py's retries and its script
    loading, as redis-py's own retries would make it again (``add.lua`` only adds new ids; a
    repeated ``commit.lua`` refuses the jobs it already placed as a stale attempt, and the
    leader's enqueue check enqueues a placed job whose RQ job is missing)."""
    return eval_send(client, script, args)()


def eval_send(client: redis.Redis, script: Any, args: Sequence[Any]) -> Callable[[], Any]:
    """:func:`eval_direct` in two halves: the EVALSHA is sent now, on a connection of its own,
    and the returned call reads its reply (call it exactly once), so the caller can work
    while the server runs the script. A failed send or read, or a server without the script,
    falls back as :func:`eval_direct` does (the call made again the ordinary way): one call
    of :func:`calls_send`."""
    read = calls_send(client, [(script, args)])
    return lambda: read()[0]


@dataclass(frozen=True, slots=True)
class Packed:
    """A plain command with its RESP bytes made already (:func:`packed_hset`)."""

    args: tuple[Any, ...]
    resp: bytes


def packed_hset(key: str, field: str, value: str, encoding: str, errors: str) -> Packed:
    """``HSET key field value`` as :class:`FastRespPacker` writes it: a leader step writes
    thousands (one decision per placed job), and the general packer's per-call work cost
    more than the bytes."""
    k, f, v = (x.encode(encoding, errors) for x in (key, field, value))
    resp = b"*4\r\n$4\r\nHSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(k), k, len(f), f, len(v), v
    )  # fmt: skip
    return Packed(("HSET", key, field, value), resp)


#: One call of :func:`calls_send`: ``(script, args)`` runs EVALSHA of a registered script with
#: ``args`` (no keys); ``(None, args)`` sends the command ``args`` as it is, and
#: ``(None, Packed)`` the command already packed.
Call = tuple[Any, "Sequence[Any] | Packed"]


def calls_send(client: redis.Redis, calls: Sequence[Call]) -> Callable[[], list[Any]]:
    """``calls`` sent now, in order, on one connection of ``client``'s pool, with no reply
    awaited; the returned call (call it exactly once) reads every reply and returns them in
    order, so the caller works while the server runs them. A script the server does not hold
    is run again the ordinary way (redis-py loads it); an error reply raises once every reply
    is read (the connection stays in step). A failed send or read makes every call again the
    ordinary way, in one pipeline with redis-py's retries, as :func:`eval_send` does (the
    callers' writes are a job record field and RQ jobs written as rq writes them; see
    :func:`eval_direct` for what a repeat does)."""
    if not calls:
        return list

    def ordinary() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for script, args in calls:
            if script is None:
                pipe.execute_command(*(args.args if isinstance(args, Packed) else args))
            else:
                script(args=args, client=pipe)
        return list(pipe.execute())

    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(_joined(conn, calls))
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        conn.disconnect()
        pool.release(conn)
        return ordinary

    def read() -> list[Any]:
        out: list[Any] = []
        failed: redis.ResponseError | None = None
        try:
            for script, args in calls:
                try:
                    out.append(conn.read_response())
                except redis.exceptions.NoScriptError:
                    out.append(script(args=args))
                except redis.ResponseError as exc:
                    out.append(exc)
                    failed = failed or exc
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            pool.release(conn)
            return ordinary()
        pool.release(conn)
        if failed is not None:
            raise failed
        return out

    return read


def _joined(conn: Any, calls: Sequence[Call]) -> list[bytes]:
    """The RESP bytes of ``calls``, in pieces of about :data:`_CHUNK_BYTES` (one send each)."""
    blobs: list[bytes] = []
    for script, args in calls:
        if isinstance(args, Packed):
            blobs.append(args.resp)
        elif script is None:
            blobs += conn.pack_command(*args)
        else:
            blobs += conn.pack_command("EVALSHA", script.sha, 0, *args)
    out: list[bytes] = []
    start = size = 0
    for i, b in enumerate(blobs):
        size += len(b)
        if size >= _CHUNK_BYTES:  # a piece ends after the blob that fills it
            out.append(b"".join(blobs[start : i + 1]))
            start, size = i + 1, 0
    if start < len(blobs):
        out.append(b"".join(blobs[start:]))
    return out
