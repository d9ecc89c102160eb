"""Mock OpenAI-compatible LLM backends: echo the model they got and say who served (x-mock-backend)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from typing import Mapping

from aiohttp import web

from esr_extproc.json_scan import BadBody, scan_unread

NAME = web.AppKey("name", str)
# Requests seen per `x-mock-key`, over every backend: how many attempts reached an upstream.
ATTEMPTS: web.AppKey = web.AppKey("attempts", dict)
# The backends each `x-mock-key` reached, in order.
SEEN: web.AppKey = web.AppKey("seen", dict)

# Request headers worth showing back, so tests can see what actually reached the backend.
_ECHOED = ("x-selected-model", "x-semantic-route", "x-semantic-route-reason", "content-length", "content-encoding",
           "transfer-encoding", "x-gateway-model-name", "x-gateway-base-model-name", "x-ai-eg-model",
           "x-semantic-router-sent-at", "x-semantic-router-chain", "x-semantic-router-model-at")


def _named(request: web.Request, header: str) -> str | None:
    """This backend's entry in a `name=value,...` header (a failure asked of one backend by name)."""
    for item in request.headers.get(header, "").split(","):
        name, _, value = item.strip().partition("=")
        if name == request.app[NAME]:
            return value
    return None


def _echo(request: web.Request, raw: bytes, body: dict | None = None) -> dict:
    return {
        "backend": request.app[NAME],
        # top-level members besides the prompt's, so tests see what a route's set_body wrote
        "fields": {k: v for k, v in (body or {}).items() if k not in ("messages", "prompt", "input", "system")},
        "path": request.path,
        "body_bytes": len(raw),
        "body_sha256": hashlib.sha256(raw).hexdigest(),  # byte-for-byte checks
        "headers": {h: request.headers.get(h) for h in _ECHOED if h in request.headers},
    }


async def chat_completions(request: web.Request) -> web.StreamResponse:
    name = request.app[NAME]
    raw = await request.read()
    key = request.headers.get("x-mock-key")
    if key is not None:
        request.app[ATTEMPTS][key] = request.app[ATTEMPTS].get(key, 0) + 1
        request.app[SEEN].setdefault(key, []).append(name)
    failed = request.headers.get("x-mock-status") or _named(request, "x-mock-fail")
    if failed:  # a failing backend, on request: every one (x-mock-status), or one by name (x-mock-fail)
        extra = {"retry-after": "30"} if failed == "429" else {}
        return web.json_response({"error": {"message": "mock failure"}}, status=int(failed),
                                 headers={"x-mock-backend": name, **extra})
    stall = _named(request, "x-mock-stall")
    if stall:  # no headers for this long (a hung model)
        await asyncio.sleep(float(stall) / 1000)
    if len(raw) > 256 * 1024:
        # Decoding megabytes here would stall every mock backend (they share one loop) and show
        # up as the gateway's latency in tests that send large bodies.
        try:
            body = {"model": scan_unread(raw)[0] or ""}
        except BadBody:
            body = {}
    else:
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
    if not isinstance(body, dict):
        body = {}
    model = body.get("model", "")
    text = f"[{name}] handled model={model}"
    created = int(time.time())
    headers = {"x-mock-backend": name}
    if body.get("stream"):
        # A slow model on request: a pause before each chunk (rollout tests need a stream in flight).
        pause = float(request.headers.get("x-mock-chunk-delay-ms", 0)) / 1000
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        # A long answer on request: x-mock-chunks events of one short word each (a token a chunk).
        pieces = text.split(" ") + [f"w{i}" for i in range(int(request.headers.get("x-mock-chunks", 0)))]
        cut = _named(request, "x-mock-cut") is not None  # dies once the stream has started
        for i, piece in enumerate(pieces):
            if cut and i == 2:
                assert request.transport is not None
                request.transport.abort()
                return resp
            await asyncio.sleep(pause)
            chunk = {
                "id": "chatcmpl-mock",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": {"content": (" " if i else "") + piece}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        done = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await resp.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        # A stream that ends a while after its [DONE] on request (x-mock-linger-ms): a client that
        # stops reading at [DONE] has closed the connection before its end reaches the gateway.
        await asyncio.sleep(float(request.headers.get("x-mock-linger-ms", 0)) / 1000)
        await resp.write_eof()
        return resp
    return web.json_response(
        {
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            "mock": _echo(request, raw, body),
        },
        headers=headers,
    )


async def anything(request: web.Request) -> web.Response:
    raw = await request.read()
    return web.json_response({"mock": _echo(request, raw)}, headers={"x-mock-backend": request.app[NAME]})


def make_app(name: str, attempts: dict | None = None, seen: dict | None = None) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[NAME] = name
    app[ATTEMPTS] = {} if attempts is None else attempts
    app[SEEN] = {} if seen is None else seen
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


class MockBackends:
    """Runs one mock backend per (name, port) on a private event loop in a background thread."""

    def __init__(self, ports: Mapping[str, int], host: str = "127.0.0.1"):
        self.ports = dict(ports)
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._runners: dict[str, web.AppRunner] = {}
        self.attempts: dict[str, int] = {}  # x-mock-key -> requests that reached any of them
        self.seen: dict[str, list[str]] = {}  # x-mock-key -> the backends it reached, in order
        self._thread = threading.Thread(target=self._loop.run_forever, name="mock-backends", daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)

    async def _start(self) -> None:
        for name in self.ports:
            await self._start_one(name)

    async def _start_one(self, name: str) -> None:
        runner = web.AppRunner(make_app(name, self.attempts, self.seen), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.ports[name]).start()
        self._runners[name] = runner

    def down(self, name: str) -> None:
        """Stops one backend: its port refuses connections until `up`."""
        asyncio.run_coroutine_threadsafe(self._runners.pop(name).cleanup(), self._loop).result(timeout=30)

    def up(self, name: str) -> None:
        asyncio.run_coroutine_threadsafe(self._start_one(name), self._loop).result(timeout=30)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def _stop():
            for r in self._runners.values():
                await r.cleanup()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
