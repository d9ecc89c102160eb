"""A Redis server for the response cache's shared store: Debian's redis-server on a free loopback
port, nothing persisted, stopped (or killed, to test an outage) by its owner."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from devstack.readiness import wait_ready
from devstack.stack import free_port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed: `make tools` installs Debian's redis-server")
        log = open(self.workdir / "redis.log", "w")
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=log, stderr=subprocess.STDOUT)
        wait_ready(self.proc, "redis-server", lambda: _answers(self.port), 30,
                   lambda: (self.workdir / "redis.log").read_text()[-2000:])
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    stop = kill  # nothing to keep: a test's Redis holds only what that test put there
