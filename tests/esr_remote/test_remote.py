"""The remote backend under the real batcher, against a small engine that speaks the OpenAI embeddings
API over real HTTP (the integration tests run a real Infinity through Envoy)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from esr_app.embedding import batcher_shape, start_batcher
from batching import DeadlineExceeded, RemoteError
from esr_remote.backend import REFUSALS_IN_A_ROW, RemoteBackend
from esr_remote.embeddings_api import EmbeddingsAPI
from esr_config import ConfigError, parse_config
from esr_remote.config import RemoteEncoderConfig
from tests.support.fakes import vector_for
from tests.support.waiting import until

KEY = "sk-test-0123456789abcdef"


class Engine:
    """An OpenAI-style /v1/embeddings on loopback whose behaviour a test switches."""

    def __init__(self, base64_ok: bool = True, key: str | None = None):
        self.base64_ok, self.key = base64_ok, key
        self.status = 200  # answer every call with this status instead
        self.gate = threading.Event()
        self.gate.set()  # cleared: calls wait (a hung engine)
        self.calls: list[list[str]] = []  # answered with embeddings
        self.posts = 0  # every POST
        self.concurrent = self.most_concurrent = 0
        self._lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.posts += 1
                with engine._lock:
                    engine.concurrent += 1
                    engine.most_concurrent = max(engine.most_concurrent, engine.concurrent)
                try:
                    status, answer = engine.answer(self.path, self.headers, body)
                finally:
                    with engine._lock:
                        engine.concurrent -= 1
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def answer(self, path, headers, body) -> tuple[int, dict]:
        self.gate.wait(30)
        if path != "/v1/embeddings":
            return 404, {"error": "no such route"}
        if self.key is not None and headers.get("Authorization") != f"Bearer {self.key}":
            return 401, {"error": "bad key"}
        if self.status != 200:
            return self.status, {"error": f"engine trouble with {body['input']}"}
        if body["encoding_format"] == "base64" and not self.base64_ok:
            return 422, {"error": "encoding_format: only float"}
        texts = body["input"]
        if any("poison" in t for t in texts):
            return 400, {"error": "input too long"}
        with self._lock:
            self.calls.append(texts)
        rows = []
        for i, t in enumerate(texts):
            v = vector_for(t) * 3.0  # not unit length: the router normalizes
            emb = base64.b64encode(v.astype("<f4").tobytes()).decode() if body["encoding_format"] == "base64" else v.tolist()
            rows.append({"object": "embedding", "index": i, "embedding": emb})
        return 200, {"object": "list", "data": rows[::-1], "model": body["model"]}  # order by index, not position

    def close(self):
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    e = Engine()
    yield e
    e.close()


def config(url: str, **remote) -> object:
    return parse_config({
        "encoder": {"remote": {"url": url, "model": "m", **remote}},
        "routes": [{"name": "r", "model": "x", "utterances": ["u"]}],
        "default_route": {"name": "d", "model": "y"},
    })


def soon(seconds: float) -> float:
    return time.monotonic() + seconds


def test_concurrent_prompts_go_as_few_calls_and_come_back_unit_length_in_order(engine):
    async def main():
        batcher = await start_batcher(config(engine.url, max_in_flight=1))
        texts = [f"prompt {i}" for i in range(40)]
        vectors = await asyncio.gather(*(batcher.embed(t, soon(5)) for t in texts))
        for t, v in zip(texts, vectors):
            np.testing.assert_allclose(v, vector_for(t), atol=1e-6)
        sent = [c for c in engine.calls if c != ["warm up"]]
        assert sorted(t for c in sent for t in c) == sorted(texts)
        assert len(sent) < len(texts) / 2, [len(c) for c in sent]  # batched, not one call a prompt
        await batcher.aclose()

    asyncio.run(main())


def test_batches_are_in_flight_together_up_to_the_limit_and_a_cancelled_prompt_is_never_sent(engine):
    async def main():
        cfg = config(engine.url, max_in_flight=3, max_batch=2)
        batcher = await start_batcher(cfg)
        engine.gate.clear()
        tasks = [asyncio.create_task(batcher.embed(f"t{i}", soon(10))) for i in range(12)]
        # Three calls wait in the engine; the rest wait in the queue (most_concurrent below: never more).
        await until(lambda: engine.concurrent == 3, 5, "three calls in flight")
        tasks[-1].cancel()
        # A task's cancel lands on the loop's next turn; the engine's gate opens the lanes' threads
        # at once, and they may cut the last prompt before it is marked cancelled. Let it land first.
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[-1]
        engine.gate.set()
        await asyncio.gather(*tasks[:-1])
        assert engine.most_concurrent == 3
        assert all(len(c) <= 2 for c in engine.calls)
        assert "t11" not in [t for c in engine.calls for t in c]
        await batcher.aclose()

    asyncio.run(main())
    assert batcher_shape(config("http://h", max_in_flight=3, max_batch=2))[1] == 3


def test_a_down_engine_opens_the_breaker_nothing_is_sent_and_a_probe_closes_it(engine):
    async def main():
        batcher = await start_batcher(config(engine.url, max_in_flight=1))
        backend = batcher.backend
        engine.status = 503
        for i in range(5):
            with pytest.raises(RemoteError):
                await batcher.embed(f"a{i}", soon(5))
        assert not backend.breaker.closed
        calls = len(engine.calls)
        with pytest.raises(RemoteError, match="circuit open"):  # refused, not sent (checked below)
            await batcher.embed("refused at once", soon(5))
        engine.status = 200
        await until(lambda: backend.breaker.closed, 5, "the probe closes the breaker")
        np.testing.assert_allclose(await batcher.embed("back", soon(5)), vector_for("back"), atol=1e-6)
        assert "refused at once" not in [t for c in engine.calls[calls:] for t in c]
        await batcher.aclose()

    asyncio.run(main())


def test_a_closed_batcher_stops_its_backends_probes(engine):
    """A remote backend swapped out on reload (or shut down) while its engine is down must not keep
    probing that engine for ever from a thread nobody owns."""
    async def main():
        batcher = await start_batcher(config(engine.url, max_in_flight=1))
        engine.status = 503
        for i in range(5):
            with pytest.raises(RemoteError):
                await batcher.embed(f"a{i}", soon(5))
        assert not batcher.backend.breaker.closed
        posts = engine.posts
        await until(lambda: engine.posts > posts, 10, "the open breaker probes")
        await batcher.aclose()
        breaker = batcher.backend.breaker
        await until(lambda: not breaker.probing, 10, "the probe thread ends once the batcher is closed")
        posts = engine.posts  # nothing left to send another
        assert not breaker.probing and engine.posts == posts

    asyncio.run(main())


def test_inputs_the_engine_refuses_fail_alone_and_do_not_count_against_it(engine):
    async def main():
        batcher = await start_batcher(config(engine.url, max_in_flight=1))
        engine.gate.clear()
        tasks = [asyncio.create_task(batcher.embed(t, soon(5))) for t in ("fine one", "poison pill", "fine two")]
        await asyncio.sleep(0.2)
        engine.gate.set()
        one, poison, two = await asyncio.gather(*tasks, return_exceptions=True)
        np.testing.assert_allclose(one, vector_for("fine one"), atol=1e-6)
        np.testing.assert_allclose(two, vector_for("fine two"), atol=1e-6)
        assert isinstance(poison, ValueError) and not isinstance(poison, RemoteError)
        assert batcher.backend.breaker.closed
        await batcher.aclose()

    asyncio.run(main())


def test_a_hung_engine_is_given_up_on_at_the_deadline_and_the_lane_is_free_again(engine):
    async def main():
        batcher = await start_batcher(config(engine.url, max_in_flight=1, timeout_ms=5000))
        engine.gate.clear()
        with pytest.raises(DeadlineExceeded):  # the caller's 0.3 s, though the call may take 5 s
            await batcher.embed("hangs", soon(0.3))
        engine.gate.set()
        np.testing.assert_allclose(await batcher.embed("next", soon(2)), vector_for("next"), atol=1e-6)
        await batcher.aclose()

    asyncio.run(main())


def test_the_api_key_comes_from_the_environment_is_sent_and_is_never_logged(monkeypatch, caplog):
    engine = Engine(key=KEY)
    try:
        caplog.set_level(logging.DEBUG)
        monkeypatch.setenv("ENGINE_KEY", KEY)
        backend = RemoteBackend(RemoteEncoderConfig(url=engine.url, model="m", api_key_env="ENGINE_KEY",
                                                    insecure_http=True))
        backend.warmup()
        np.testing.assert_allclose(backend.encode(["hello"])[0], vector_for("hello"), atol=1e-6)
        engine.status = 500
        for _ in range(5):
            with pytest.raises(RemoteError):
                backend.encode(["x"])
        assert KEY not in caplog.text and KEY not in repr(backend.api)
        assert "circuit" in caplog.text or "calls stopped" in caplog.text
        backend.breaker.stop()

        monkeypatch.setenv("ENGINE_KEY", "wrong")
        with pytest.raises(ValueError, match="refused the embeddings call: HTTP 401"):
            RemoteBackend(RemoteEncoderConfig(url=engine.url, model="m", api_key_env="ENGINE_KEY",
                                              insecure_http=True)).warmup()
        monkeypatch.delenv("ENGINE_KEY")
        with pytest.raises(ValueError, match="api_key_env: environment variable ENGINE_KEY is not set"):
            RemoteBackend(RemoteEncoderConfig(url=engine.url, model="m", api_key_env="ENGINE_KEY", insecure_http=True))
    finally:
        engine.close()


def test_an_engine_without_base64_answers_is_asked_for_floats():
    engine = Engine(base64_ok=False)
    try:
        backend = RemoteBackend(RemoteEncoderConfig(url=engine.url, model="m"))
        backend.warmup()
        assert backend.api.encoding == "float"
        np.testing.assert_allclose(backend.encode(["lone \ud800 surrogate"])[0], vector_for("lone ? surrogate"),
                                   atol=1e-6)
    finally:
        engine.close()


@pytest.mark.parametrize("remote, key", [
    ({"url": "ftp://host"}, "encoder.remote.url"),
    ({"url": "http://user:secret@host"}, "encoder.remote.url"),
    ({"url": "http://host/v1?x=1"}, "encoder.remote.url"),
    ({"url": "http://host", "api_key_env": "sk-live-123"}, "encoder.remote.api_key_env"),
    ({"url": "http://host", "max_in_flight": 0}, "encoder.remote.max_in_flight"),
    ({"url": "http://host", "max_batch": 0}, "encoder.remote.max_batch"),
    ({"url": "http://host", "timeout_ms": 0}, "encoder.remote.timeout_ms"),
    ({"url": "http://host", "api_key": "sk-live-123"}, "encoder.remote.api_key"),
    ({"url": "http://host", "api_key_env": "ENGINE_KEY"}, "encoder.remote.url: http:// would send the API key"),
])
def test_remote_settings_are_checked_and_errors_name_the_key(remote, key):
    with pytest.raises(ConfigError, match=f"^config: {key}"):
        parse_config({
            "encoder": {"remote": {"model": "m", **remote}},
            "routes": [{"name": "r", "model": "x", "utterances": ["u"]}],
            "default_route": {"name": "d", "model": "y"},
        })


def test_https_or_an_explicit_insecure_http_may_carry_a_key():
    for remote in ({"url": "https://host", "api_key_env": "K"}, {"url": "http://host", "api_key_env": "K", "insecure_http": True}):
        parse_config({"encoder": {"remote": {"model": "m", **remote}},
                      "routes": [{"name": "r", "model": "x", "utterances": ["u"]}], "default_route": {"name": "d", "model": "y"}})


class RawEngine:
    """An engine that answers every call with the bytes `answer(conn)` writes, however slowly."""

    def __init__(self, answer):
        import socket as socket_module
        self.sock = socket_module.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self._answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.recv(65536)
            self._answer(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.sock.close()


def test_an_engine_that_drips_its_answer_is_given_up_on_at_the_call_deadline():
    def drip(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(100):  # a byte every 0.1 s: each read is within any per-read timeout
            conn.sendall(b" ")
            time.sleep(0.1)

    engine = RawEngine(drip)
    try:
        api = EmbeddingsAPI(engine.url, "m")
        # The call's 0.5 s bounds the whole answer: read by read (100 reads of 0.1 s) it would succeed.
        with pytest.raises(TimeoutError):
            api.embed(["hello"], timeout=0.5)
    finally:
        engine.close()


def test_an_answer_larger_than_its_inputs_can_need_is_refused():
    def huge(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8000000\r\n\r\n")
        conn.sendall(b"[" + b" " * 7_999_999)

    engine = RawEngine(huge)
    try:
        with pytest.raises(ValueError, match="answer larger than"):
            EmbeddingsAPI(engine.url, "m").embed(["one input"], timeout=5)
    finally:
        engine.close()


def test_an_engine_refusing_every_input_opens_the_breaker_after_a_bounded_number_of_calls(engine, caplog):
    async def main():
        batcher = await start_batcher(config(engine.url, max_in_flight=1))
        before = len(engine.calls)
        engine.status = 400  # every call refused as bad input, the prompt echoed in the error body
        done = await asyncio.gather(*(batcher.embed(f"secret prompt {i}", soon(10)) for i in range(32)),
                                    return_exceptions=True)
        assert all(isinstance(d, Exception) for d in done)
        assert not batcher.backend.breaker.closed  # counted against the engine: calls stopped
        calls = engine.posts
        assert calls <= 1 + REFUSALS_IN_A_ROW + batcher.backend.breaker.failures_to_open + 1, calls
        assert len(engine.calls) == before
        batcher.backend.breaker.stop()
        await batcher.aclose()

    caplog.set_level(logging.DEBUG)
    asyncio.run(main())
    assert "secret prompt" not in caplog.text  # an engine's error body is never logged
