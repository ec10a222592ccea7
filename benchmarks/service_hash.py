"""A SHA-256 over everything the leader writes for fixed submissions, to show that a service
speed-up decides and stores exactly as before.

Four scenarios on a private redis-server: 10,000 identical jobs in one window of 5,000; 600 in
windows of 20; 1,400 mixed jobs (pinned, TP=4, 70B, 405B rejects, ...) on a 512-GPU pool; 700
mixed in windows of 50. Dumped per job: state, placement, decision, reason, attempt
(timestamps dropped); then every event, the GPU counters, the capacity version, the state sets,
the pending order, the allocations and every RQ job (origin, meta, args, function, TTLs,
description). Prints the dump's SHA-256 and its line count.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/service_hash.py /tmp/dump.jsonl
"""

import hashlib
import json
import os
import sys
import tempfile

# The fixed submissions must be predicted alike on every machine: no waiting for CPU traces at
# submit, and an empty trace cache (no $SNUGFIT_HOME trace or retrained artifact is read).
os.environ["SNUGFIT_TRACE_BUDGET_S"] = "0"
os.environ["SNUGFIT_HOME"] = tempfile.mkdtemp(prefix="service-hash-home-")

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.getcwd() + "/benchmarks")
import redis
from _common import private_redis
from bench_service import _same_shape_table_fn, spec

from scheduler.core.synthetic import synthetic_pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec


def strip(d, keys):
    if isinstance(d, dict):
        return {k: strip(v, keys) for k, v in d.items() if k not in keys}
    if isinstance(d, list):
        return [strip(v, keys) for v in d]
    return d


def dump(store, out, tag):
    ids = sorted(store.job_ids())
    rows = store.get_fields(ids, ["state", "placement", "decision", "reason", "attempt"])
    for jid, row in zip(ids, rows, strict=True):
        rec = [tag, jid, row[0], row[3], row[4]]
        for raw in row[1:3]:
            rec.append(
                None if raw is None else strip(json.loads(raw), {"placed_at", "time_s", "ts"})
            )
        out.write(json.dumps(rec, sort_keys=True) + "\n")
    evs = store.r.xrange("snugfit:events") if store.r.exists("snugfit:events") else []
    for _id, ev in evs:
        out.write(
            json.dumps(
                [
                    tag,
                    "event",
                    strip({k: (json.loads(v) if k == "e" else v) for k, v in ev.items()}, {"ts"}),
                ],
                sort_keys=True,
            )
            + "\n"
        )
    r = store.r
    out.write(json.dumps([tag, "gpu", sorted(r.hgetall("snugfit:gpu").items())]) + "\n")
    out.write(json.dumps([tag, "capver", r.get("snugfit:capver")]) + "\n")
    for st in ("pending", "placed", "rejected", "running"):
        out.write(json.dumps([tag, "set", st, sorted(r.smembers(f"snugfit:state:{st}"))]) + "\n")
    out.write(json.dumps([tag, "pendingz", r.zrange("snugfit:pending", 0, -1)]) + "\n")
    out.write(json.dumps([tag, "allocs", sorted(r.hgetall("snugfit:allocs").items())]) + "\n")
    # RQ meta of placed jobs
    from rq.job import Job
    from rq.serializers import JSONSerializer

    rq_ids = [json.loads(r[1])["rq_job_id"] for r in rows if r[1]]
    for j in Job.fetch_many(rq_ids, connection=store.raw, serializer=JSONSerializer):
        if j is not None:
            out.write(
                json.dumps(
                    [
                        tag,
                        "rq",
                        j.id,
                        j.origin,
                        j.meta,
                        j.args,
                        j.func_name,
                        j.timeout,
                        j.result_ttl,
                        j.failure_ttl,
                        j.description,
                    ],
                    sort_keys=True,
                    default=str,
                )
                + "\n"
            )


def run(url, out, tag, n, window, mixed, pool_n):
    store = RedisStore(redis.Redis.from_url(url))
    store.r.flushdb()
    pool = synthetic_pool(pool_n, seed=0)
    if mixed:
        c = Client(url)
        specs = []
        for i in range(n):
            k = i % 7
            if k == 0:
                specs.append(inference_spec(i, id=f"m{i}"))
            elif k == 1:
                specs.append(inference_spec(i, id=f"m{i}", batch_size=32, input_len=2048))
            elif k == 2:
                specs.append(inference_spec(i, id=f"m{i}", model="llama-3.1-70b"))
            elif k == 3:
                specs.append(inference_spec(i, id=f"m{i}", gpu="H100-80GB"))
            elif k == 4:
                specs.append(
                    inference_spec(
                        i, id=f"m{i}", model="llama-3.1-70b", tensor_parallel=4, n_gpus=4
                    )
                )
            elif k == 5:
                specs.append(inference_spec(i, id=f"m{i}", batch_size=1))
            else:
                specs.append(inference_spec(i, id=f"m{i}", model="llama-3.1-405b"))
        for s in range(0, n, 100):
            c.submit_many(specs[s : s + 100])
    else:
        c = Client(url, table_fn=_same_shape_table_fn())
        for s in range(0, n, 1000):
            c.submit_many([spec(i) for i in range(s, min(n, s + 1000))])
    svc = SchedulerService(store, pool, window=window, placement_lease_s=1e9)
    for _ in range(10000):
        st = svc.step()
        if st.ingested == 0 and st.placed == 0 and st.rejected == 0:
            break
    dump(store, out, tag)


if __name__ == "__main__":
    path = sys.argv[1]
    with private_redis() as url, open(path, "w") as out:
        run(url, out, "same-w5000", 10000, 5000, False, 8192)
        run(url, out, "same-w20", 600, 20, False, 8192)
        run(url, out, "mixed-w5000", 1400, 5000, True, 512)
        run(url, out, "mixed-w50", 700, 50, True, 512)
    with open(path, "rb") as f:
        data = f.read()
    print(hashlib.sha256(data).hexdigest(), data.count(b"\n"))
