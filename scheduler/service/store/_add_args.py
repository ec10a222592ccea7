"""The per-job arguments of ``add.lua``, with what repeats from job to job sent once.

A batch submit is usually a sweep, and its records repeat: every job has the same field names,
most values equal the previous job's (``request``, ``method``, ``user``, the retry caps), and
the long ones that differ (``spec``, ``predictions``) differ only where they name the job's
id. Sent field by field (two arguments a field, every value whole), receiving them was most
of the server's CPU for the script (every argument is copied from the socket, then into a Lua
string), and packing them a good part of the client's. Coded, a sweep's job is
three arguments (its id, its submitted_at, and a code of one letter per field) and the
server rebuilds each value from the previous job's or from a template. The letters are
documented in ``scripts/add.lua``, which decodes them.

Every value is rebuilt exactly: ``=`` stands for a value equal to the previous job's, ``i``
and ``s`` for one equal to the id or submitted_at, and a template is the value split at the
id in double quotes, which its own pieces join back to (``q.join(v.split(q)) == v`` for any
strings), so no record written differs from the one given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["add_args"]

#: Values shorter than this are sent as they are: a template only pays for long values.
_MIN_TEMPLATE_CHARS = 64
#: What no value equals: the first job of a layout has no previous values.
_NOTHING = object()


def add_args(records: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The tokens of ``records`` after add.lua's first three arguments: the number of jobs,
    their ids, then per job its submitted_at, its code and the code's tokens."""
    out: list[Any] = [len(records), *[rec["id"] for rec in records]]
    rows = [(tuple(rec), list(rec.values())) for rec in records]
    names: tuple[str, ...] | None = None
    prev: list[Any] = []  # the previous job's values, by field position
    tmpl: list[list[str] | None] = []  # the last template sent, by field position
    ahead: dict[int, list[str] | None] = {}  # this job's pieces, split when looking ahead
    for k, rec in enumerate(records):
        jid, ts = rec["id"], rec["submitted_at"]
        keys, values = rows[k]
        head = len(out)
        out += (ts, "")
        if keys != names:
            code = ["N"]
            out.append(str(len(keys)))
            out += keys
            names, prev, tmpl = keys, [_NOTHING] * len(keys), [None] * len(keys)
        else:
            code = ["R"]
        # The next job, when it has these fields: a template is sent only if it repeats there.
        nxt = rows[k + 1][1] if k + 1 < len(rows) and rows[k + 1][0] == keys else None
        now, ahead = ahead, {}
        for f, v in enumerate(values):
            if v == prev[f] and type(v) is type(prev[f]):
                code.append("=")
            elif v == ts and type(v) is type(ts):
                code.append("s")
            elif v == jid and type(v) is type(jid):
                code.append("i")
            else:
                if f in now:
                    parts = now[f]
                elif nxt is None and tmpl[f] is None:
                    parts = None  # no template to reuse, none to send: the value as it is
                else:
                    parts = _pieces(v, jid)
                if parts is not None and parts == tmpl[f]:
                    code.append("p")
                elif parts is not None and nxt is not None:
                    ahead[f] = _pieces(nxt[f], records[k + 1]["id"])
                    if ahead[f] == parts:
                        code.append("t")
                        tmpl[f] = parts
                        out.append(str(len(parts)))
                        out += parts
                    else:
                        code.append("v")
                        out.append(v)
                else:
                    code.append("v")
                    out.append(v)
            prev[f] = v
        out[head + 1] = "".join(code)
    return out


def _pieces(v: Any, jid: Any) -> list[str] | None:
    """``v`` split at the job's id in double quotes, when it is a long string that holds it."""
    if type(v) is not str or len(v) < _MIN_TEMPLATE_CHARS:
        return None
    quoted = f'"{jid}"'
    return v.split(quoted) if quoted in v else None
