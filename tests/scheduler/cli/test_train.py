import json

from scheduler.cli.train import read_redis_history
from scheduler.service.store.keys import Keys


def test_train_reads_the_history_list_from_redis(redis_url, redis_client):
    row = {
        "id": "h1",
        "origin": "history",
        "source": "node a",
        "spec": {"model": "gpt2", "task": "inference"},
        "gpu": "A100-80GB",
        "peak_vram_gib": 2.0,
        "measurement": "nvml_used",
    }
    key = Keys("t").history
    redis_client.rpush(key, json.dumps(row), json.dumps({**row, "id": "h2", "simulated": True}))
    got = read_redis_history(redis_url, "t")
    assert [m.id for m in got] == ["h1"]
    assert read_redis_history(redis_url, "other") == []
