"""A bare HTTP/2 client (h2, cleartext prior knowledge) for what ordinary clients do not send: a
request body ended by trailers, or a body sent in pieces with pauses between them."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def post(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None,
         trailers: dict[str, str] | None = None, pieces: int = 1, pause_s: float = 0.0,
         timeout_s: float = 15.0) -> Reply:
    """POST `body` over one HTTP/2 stream, in `pieces` DATA frames `pause_s` apart, ended by
    `trailers` (a HEADERS frame with END_STREAM) where given, else by the last DATA frame."""
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        conn.initiate_connection()
        conn.increment_flow_control_window(1 << 30)
        sock.sendall(conn.data_to_send())
        stream = conn.get_next_available_stream_id()
        request = [(":method", "POST"), (":scheme", "http"), (":authority", f"{host}:{port}"), (":path", path),
                   ("content-type", "application/json"), *(headers or {}).items()]
        conn.send_headers(stream, request)
        size = max(1, -(-len(body) // pieces))
        parts = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1 and trailers is None
            for at in range(0, len(part), 16384):  # within the peer's frame size
                conn.send_data(stream, part[at:at + 16384], end_stream=last and at + 16384 >= len(part))
            if not part and last:
                conn.send_data(stream, b"", end_stream=True)
            sock.sendall(conn.data_to_send())
            if pause_s and i < len(parts) - 1:
                time.sleep(pause_s)
        if trailers is not None:
            conn.send_headers(stream, list(trailers.items()), end_stream=True)
            sock.sendall(conn.data_to_send())
        reply = Reply(0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    reply.headers = {k: v for k, v in event.headers}
                    reply.status = int(reply.headers[":status"])
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    reply.body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and event.stream_id == stream:
                    return reply
            sock.sendall(conn.data_to_send())
        raise TimeoutError(f"no whole answer in {timeout_s} s (status {reply.status})")
