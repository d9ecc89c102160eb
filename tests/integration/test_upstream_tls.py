"""A TLS backend's certificate is verified by the rendered Envoy config: one for another name (or
from an unknown CA) is refused, so no prompt reaches whoever answers at the address."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from devstack.mock_backend import make_app
from devstack.stack import free_port
from esr_config import load_config
from esr_extproc.config import BackendConfig
from tests.support import ROOT
from tests.support.stack import envoy_alone

NAME = "llm.backend.test"


def openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("the TLS test needs the openssl command (Debian's openssl package)", pytrace=False)
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def issue(tmp: Path, ca: str, name: str) -> tuple[Path, Path]:
    """A key and certificate for `name`, signed by the CA called `ca` (made on first use), in a
    folder of that CA's."""
    tmp = tmp / ca
    tmp.mkdir(exist_ok=True)
    if not (tmp / f"{ca}.pem").exists():
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ca}",
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=tmp)
    (tmp / f"{name}.ext").write_text(f"subjectAltName=DNS:{name}\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", cwd=tmp)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=tmp)
    return tmp / f"{name}.pem", tmp / f"{name}.key"


class TlsBackend:
    """The mock backend behind TLS with the given certificate, on its own loop and thread."""

    def __init__(self, cert: Path, key: Path):
        self.port = free_port()
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(cert, key)
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(make_app("general-model"), access_log=None)

    async def _start(self):
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ctx).start()

    def __enter__(self):
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)


def gateway_status(tmp: Path, envoy_binary: str, backend_port: int, ca_file: Path) -> int:
    """Status of one chat request through an Envoy whose default backend is the TLS backend. No
    router runs: Envoy's fail-open sends the request to the default backend."""
    cfg = load_config(ROOT / "router.yaml")
    listen, admin = free_port(), free_port()
    backends = tuple(BackendConfig(model=m, address="127.0.0.1", port=free_port()) for m in cfg.backend_models
                     if m != cfg.default_route.model)
    cfg = dataclasses.replace(
        cfg, server=dataclasses.replace(cfg.server, grpc_port=free_port()),
        envoy=dataclasses.replace(cfg.envoy, listen_port=listen, admin_port=admin),
        backends=(BackendConfig(model=cfg.default_route.model, address="127.0.0.1", port=backend_port, tls=True,
                                sni=NAME, ca_file=str(ca_file)),) + backends)
    with envoy_alone(envoy_binary, cfg, tmp):
        r = httpx.post(f"http://127.0.0.1:{listen}/v1/chat/completions", timeout=30,
                       json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
        return r.status_code


def test_a_backend_must_present_a_trusted_certificate_for_its_name(tmp_path, envoy_binary):
    good = issue(tmp_path, "ca", NAME)
    wrong_name = issue(tmp_path, "ca", "somewhere-else.test")
    wrong_ca = issue(tmp_path, "other-ca", NAME)
    ca = tmp_path / "ca" / "ca.pem"
    with TlsBackend(*good) as backend:
        assert gateway_status(tmp_path, envoy_binary, backend.port, ca) == 200
    with TlsBackend(*wrong_name) as backend:
        assert gateway_status(tmp_path, envoy_binary, backend.port, ca) == 503
    with TlsBackend(*wrong_ca) as backend:  # the right name is not enough: another CA signed it
        assert gateway_status(tmp_path, envoy_binary, backend.port, ca) == 503
