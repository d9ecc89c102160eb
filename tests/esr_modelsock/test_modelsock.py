"""The model socket: a real batcher served on a real Unix socket, a real client; only the model is fake."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from batching import BatcherError, BatcherSettings, ContinuousBatcher, DeadlineExceeded, ModelUnavailable, Overloaded
from esr_modelsock import wire
from esr_modelsock.client import ModelClient
from tests.support.waiting import until as until_reached
from esr_modelsock.server import ModelSocketServer, SocketInUse
from tests.support.fakes import FakeBackend, IdsBackend, vector_for


class Side:
    """The model side of the socket: batcher + server, stoppable and restartable at one path."""

    def __init__(self, path, backend: FakeBackend, settings: BatcherSettings = BatcherSettings()):
        self.path, self.backend, self.settings = path, backend, settings
        self.batcher: ContinuousBatcher | None = None
        self.server: ModelSocketServer | None = None

    async def start(self) -> "Side":
        self.batcher = ContinuousBatcher(self.backend, self.settings)
        self.batcher.start()
        await self.batcher.started()
        tokens = {"tokens": self.backend.token_spec()} if hasattr(self.backend, "token_spec") else {}
        self.server = ModelSocketServer(self.batcher, self.path, {"model": "fake", "dimension": FakeBackend.dim, **tokens})
        await self.server.start()
        return self

    async def stop(self) -> None:
        self.backend.gate.set()
        await self.server.close()
        await self.batcher.aclose(2.0)


async def connect(path, states: list | None = None, token_ids=None) -> ModelClient:
    client = ModelClient(path, on_state=(states.append if states is not None else None), token_ids=token_ids)
    client.start()
    await asyncio.wait_for(client.started(), 10)
    return client


def soon(seconds: float) -> float:
    return time.monotonic() + seconds


async def until(predicate, timeout: float = 5.0) -> None:
    await until_reached(predicate, timeout, "the socket's state")


def test_embeddings_cross_the_socket_exactly(tmp_path):
    async def main():
        side = await Side(tmp_path / "m.sock", FakeBackend()).start()
        client = await connect(side.path)
        texts = [f"prompt number {i}" for i in range(50)] + ["ünïcödé ✓", "lone \ud800 surrogate"]
        vectors = await asyncio.gather(*(client.embed(t, soon(5)) for t in texts))
        for text, vector in zip(texts, vectors):
            np.testing.assert_array_equal(vector, vector_for(text))
        assert client.model["model"] == "fake" and client.model["dimension"] == FakeBackend.dim
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_a_front_ends_bulk_texts_give_way_to_prompts_in_the_model_process(tmp_path):
    async def main():
        backend = FakeBackend(hold=True)
        side = await Side(tmp_path / "m.sock", backend).start()
        client = await connect(side.path)
        first = asyncio.create_task(client.embed("first", soon(10)))
        await asyncio.to_thread(backend.entered.wait, 10)
        pieces = [asyncio.create_task(client.embed(f"piece {i}", soon(10), bulk=True)) for i in range(8)]
        await until(lambda: len(backend.tokenized) == 9)
        prompt = asyncio.create_task(client.embed("my own prompt", soon(10)))
        await until(lambda: len(backend.tokenized) == 10)
        backend.gate.set()
        vectors = await asyncio.gather(first, *pieces, prompt)
        np.testing.assert_array_equal(vectors[-1], vector_for("my own prompt"))
        assert side.batcher._queue.own_depth == (0, 0, 0) and backend.batches[1][0] == "my own prompt"
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_a_score_one_front_end_took_reaches_the_others_and_those_that_connect_later_and_is_taken_once(tmp_path):
    async def main():
        side = await Side(tmp_path / "m.sock", FakeBackend()).start()
        heard: dict[str, list] = {"a": [], "b": [], "late": []}

        async def front_end(name: str) -> ModelClient:
            client = ModelClient(side.path, on_score=lambda sid, score: heard[name].append((sid, score)))
            client.start()
            await asyncio.wait_for(client.started(), 10)
            return client

        a, b = await front_end("a"), await front_end("b")
        assert await a.claim_score("one", "id.one", 0.25, soon(5)) is True
        assert await b.claim_score("two", "id.two~served model", 1.0, soon(5)) is True
        # the same request's score at both at once: one takes it, the other is told it is taken
        both = await asyncio.gather(a.claim_score("three", "id.three", 0.5, soon(5)),
                                    b.claim_score("three", "id.three", 0.5, soon(5)))
        assert sorted(both) == [False, True]
        await until(lambda: len(heard["a"]) + len(heard["b"]) == 3)
        assert ("id.two~served model", 1.0) in heard["a"] and ("id.one", 0.25) in heard["b"]
        assert [h for h in heard["a"] + heard["b"] if h[0] == "id.three"] == [("id.three", 0.5)]
        late = await front_end("late")
        await until(lambda: len(heard["late"]) == 3)
        assert heard["late"][:2] == [("id.one", 0.25), ("id.two~served model", 1.0)]
        assert ("id.one", 0.25) not in heard["a"]  # its own never comes back to it
        await side.stop()  # no model process: a front end decides alone
        assert await a.claim_score("four", "id.four", 0.5, soon(5)) is None
        for client in (a, b, late):
            await client.aclose()

    asyncio.run(main())


def test_a_claim_the_model_process_leaves_unanswered_ends_at_the_posting_requests_deadline(tmp_path, monkeypatch):
    import esr_modelsock.server as model_server

    monkeypatch.setattr(model_server._Connection, "_claim", lambda self, payload: None)  # a model process gone quiet

    async def main():
        side = await Side(tmp_path / "m.sock", FakeBackend()).start()
        client = await connect(side.path)
        started = time.monotonic()
        assert await client.claim_score("one", "id.one", 0.5, started + 0.1) is None  # decided alone
        assert time.monotonic() - started < 0.9  # by the request's deadline, before Envoy's message timeout
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_a_tracer_sees_each_call_across_the_socket(tmp_path):
    async def main():
        side = await Side(tmp_path / "m.sock", FakeBackend()).start()
        client = await connect(side.path)
        spans: list[str] = []

        @contextlib.contextmanager
        def span(name: str):
            spans.append(name)
            yield

        client.call_span = span
        await asyncio.gather(*(client.embed(f"traced {i}", soon(5)) for i in range(3)))
        assert spans == ["semantic_router.model_socket"] * 3
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_a_deadline_and_a_cancel_cross_the_socket_and_nothing_is_computed(tmp_path):
    async def main():
        backend = FakeBackend(hold=True)
        side = await Side(tmp_path / "m.sock", backend).start()
        client = await connect(side.path)
        busy = asyncio.create_task(client.embed("occupies the model", soon(10)))
        await until(backend.entered.is_set)
        with pytest.raises(DeadlineExceeded):  # the caller's deadline, while the model is still held
            await client.embed("times out in the queue", soon(0.2))
        assert not busy.done()
        cancelled = asyncio.create_task(client.embed("cancelled by its caller", soon(10)))
        await until(lambda: side.batcher.depth[0] == 2)  # both queued on the model side
        assert side.server.in_flight == 2
        cancelled.cancel()
        await until(lambda: side.server.in_flight == 1)  # the CANCEL frame reached the model side
        backend.gate.set()
        await busy
        await side.batcher.aclose(2.0)  # everything still queued is settled
        computed = [t for batch in backend.batches for t in batch]
        assert computed == ["occupies the model"]
        await client.aclose()
        await side.server.close()

    asyncio.run(main())


def test_overload_is_refused_at_once_with_its_kind(tmp_path):
    async def main():
        backend = FakeBackend(hold=True)
        side = await Side(tmp_path / "m.sock", backend, BatcherSettings(max_batch_size=1, max_queue_requests=1)).start()
        client = await connect(side.path)
        busy = asyncio.create_task(client.embed("occupies the model", soon(10)))
        await until(backend.entered.is_set)
        queued = asyncio.create_task(client.embed("takes the only queue slot", soon(10)))
        await until(lambda: side.batcher.depth[0] == 1)
        with pytest.raises(Overloaded):  # refused while the model is still held, not at the deadline
            await client.embed("no room", soon(10))
        assert not busy.done() and not queued.done()
        backend.gate.set()
        await asyncio.gather(busy, queued)
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_model_process_gone_means_immediate_fallbacks_then_recovery(tmp_path):
    async def main():
        path = tmp_path / "m.sock"
        backend = FakeBackend(hold=True)
        side = await Side(path, backend).start()
        states: list[bool] = []
        client = await connect(path, states)
        in_flight = asyncio.create_task(client.embed("in flight when the model goes", soon(10)))
        await until(backend.entered.is_set)
        await side.server.close()  # the front end sees the connection drop
        with pytest.raises(ModelUnavailable):
            await in_flight
        with pytest.raises(ModelUnavailable):  # at once: waiting would end in DeadlineExceeded
            await client.embed("while it is away", soon(10))
        assert states == [True, False]
        backend.gate.set()
        await side.batcher.aclose(2.0)
        side = await Side(path, FakeBackend()).start()  # back at the same path
        await until(lambda: client.connected)
        np.testing.assert_array_equal(await client.embed("after", soon(5)), vector_for("after"))
        assert states == [True, False, True]
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = tmp_path / "m.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed model process leaves

    async def main():
        side = await Side(path, FakeBackend()).start()
        with pytest.raises(SocketInUse):
            await ModelSocketServer(side.batcher, path, {}).start()
        await side.stop()
        assert not path.exists()

    asyncio.run(main())


def test_frames_split_anywhere_are_reassembled_and_garbage_is_refused():
    frames = wire.embed_frame(7, 0.25, "héllo".encode()) + wire.cancel_frame(7) + wire.vector_frame(9, b"\0" * 8)
    reader = wire.FrameReader()
    got = []
    for i in range(len(frames)):
        got += reader.feed(frames[i : i + 1])
    assert [k for k, _ in got] == [wire.EMBED, wire.CANCEL, wire.VECTOR]
    request_id, budget, text = wire.split_embed(got[0][1])
    assert (request_id, round(budget, 3), text) == (7, 0.25, "héllo".encode())
    assert wire.request_id_of(got[1][1]) == 7
    with pytest.raises(wire.ProtocolError):
        wire.FrameReader().feed(b"\xff\xff\xff\xff\x01")
    request_id, exc = wire.error_of(wire.error_frame(3, Overloaded("full"))[5:])
    assert request_id == 3 and type(exc) is Overloaded and str(exc) == "full"


# Hardening: who may connect, what a frame may carry, what the path may already be.

def raw_exchange(path, frames: list[bytes], expect: int, uid: int | None = None) -> list[tuple[int, bytes]]:
    """Sends raw frames from a plain socket (as any local process could) and reads `expect` frames
    after the HELLO; as `uid` in a child process when given. [] when the server hangs up first."""
    import os
    import pickle

    def talk() -> list[tuple[int, bytes]]:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(str(path))
        try:
            s.sendall(b"".join(frames))
        except (BrokenPipeError, ConnectionResetError):
            return []  # hung up on before it could send: refused
        reader, got = wire.FrameReader(), []
        while len(got) < expect + 1:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:  # hung up
                break
            got += reader.feed(data)
        s.close()
        return got[1:] if got and got[0][0] == wire.HELLO else []

    if uid is None:
        return talk()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user
        try:
            os.setgid(uid)
            os.setuid(uid)
            out = talk()
        except Exception as exc:
            out = repr(exc)
        os.write(w, pickle.dumps(out))
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = pickle.loads(f.read())
    os.waitpid(pid, 0)
    return out


def test_the_socket_is_the_users_alone_and_other_users_are_refused(tmp_path):
    import os
    import stat

    import tempfile

    if os.getuid() != 0:
        pytest.fail("this test acts as another user: run it as root (CI does)", pytrace=False)
    shared = Path(tempfile.mkdtemp(prefix="modelsock-"))  # pytest's tmp_path is not other users' to enter
    shared.chmod(0o755)

    async def main():
        side = await Side(shared / "m.sock", FakeBackend()).start()
        assert stat.S_IMODE(os.stat(side.path).st_mode) == 0o600
        hello = await asyncio.to_thread(raw_exchange, side.path, [], 0)
        assert hello == []  # connected and got its HELLO (nothing after it asked for)
        refused = await asyncio.to_thread(raw_exchange, side.path, [], 0, 65534)
        assert "PermissionError" in str(refused)  # the file's mode keeps other users out...
        os.chmod(side.path, 0o666)
        ignored = await asyncio.to_thread(raw_exchange, side.path, [wire.embed_frame(1, 1.0, b"hi")], 1, 65534)
        assert ignored == []  # ...and so does the peer check, whatever the mode: no HELLO, no answer
        await side.stop()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_frames_that_would_leak_a_queue_slot_or_cost_the_model_are_refused(tmp_path):
    async def main():
        backend = FakeBackend()
        side = await Side(tmp_path / "m.sock", backend).start()
        bad = [wire.embed_frame(i, float("nan"), b"nan budget") for i in range(1, 2001)]
        bad += [wire.embed_frame(3001, -1.0, b"negative"), wire.embed_frame(3002, float("inf"), b"infinite"),
                wire.embed_frame(3003, 1.0, b"x" * (wire.MAX_TEXT + 1))]
        answers = await asyncio.to_thread(raw_exchange, side.path, bad, len(bad))
        assert len(answers) == len(bad) and {kind for kind, _ in answers} == {wire.ERROR}
        assert side.batcher.depth == (0, 0) and side.batcher._queue._reserved == 0  # no slot held
        assert not any("nan budget" in t or "x" * 100 in t for t in backend.tokenized)
        client = await connect(side.path)  # the queue still takes everyone else's work
        np.testing.assert_array_equal(await client.embed("still served", soon(5)), vector_for("still served"))
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_a_regular_file_at_the_socket_path_is_an_error_and_kept(tmp_path):
    path = tmp_path / "m.sock"
    path.write_text("someone's data")

    async def main():
        batcher = ContinuousBatcher(FakeBackend(), BatcherSettings())
        batcher.start()
        await batcher.started()
        with pytest.raises(SocketInUse, match="not a socket"):
            await ModelSocketServer(batcher, path, {}).start()
        await batcher.aclose(1.0)

    asyncio.run(main())
    assert path.read_text() == "someone's data"


def test_a_front_end_refuses_a_model_process_serving_another_model(tmp_path):
    async def main():
        path = tmp_path / "m.sock"
        side = await Side(path, FakeBackend()).start()
        states: list[bool] = []
        client = await connect(path, states)
        await side.stop()
        other = Side(path, FakeBackend())
        other.batcher = ContinuousBatcher(other.backend, BatcherSettings())
        other.batcher.start()
        await other.batcher.started()
        other.server = ModelSocketServer(other.batcher, path, {"model": "another", "dimension": 768})
        await other.server.start()
        await until(lambda: states[-2:] == [False, False] or (states and states[-1] is False and not client.connected), 10)
        await asyncio.sleep(0.5)
        assert not client.connected and client.model["model"] == "fake"  # it did not take the new one
        with pytest.raises(ModelUnavailable):
            await client.embed("anything", soon(1))
        await client.aclose()
        await other.stop()

    asyncio.run(main())


def test_a_text_too_large_for_a_frame_fails_its_own_request_and_the_socket_stays(tmp_path):
    async def main():
        side = await Side(tmp_path / "m.sock", FakeBackend()).start()
        states: list = []
        client = await connect(side.path, states)
        for size in (wire.MAX_TEXT + 1, 2 * wire.MAX_FRAME):  # over the server's text limit; over a frame
            with pytest.raises(BatcherError, match="at most"):
                await client.embed("x" * size, soon(5))
        np.testing.assert_array_equal(await client.embed("still here", soon(5)), vector_for("still here"))
        assert states == [True]  # never disconnected
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_a_cancel_in_the_same_read_as_its_request_leaves_it_uncomputed_and_its_neighbours_answered(tmp_path):
    async def main():
        side = await Side(tmp_path / "m.sock", FakeBackend()).start()
        frames = [wire.embed_frame(1, 5.0, b"wanted"), wire.embed_frame(2, 5.0, b"withdrawn"), wire.cancel_frame(2),
                  wire.embed_frame(3, 5.0, b"wanted too"), wire.embed_frame(3, 5.0, b"same id again")]
        got = await asyncio.to_thread(raw_exchange, side.path, frames, 3)
        answers = {wire.request_id_of(p): k for k, p in got}
        # 1 and 3 answered; the duplicate id refused at once; 2 neither answered nor computed
        assert sorted(k for k, _ in got) == [wire.VECTOR, wire.VECTOR, wire.ERROR] and 2 not in answers
        vectors = {wire.request_id_of(p): np.frombuffer(p, np.float32, offset=4) for k, p in got if k == wire.VECTOR}
        np.testing.assert_array_equal(vectors[1], vector_for("wanted"))
        np.testing.assert_array_equal(vectors[3], vector_for("wanted too"))
        assert "withdrawn" not in [t for batch in side.backend.batches for t in batch]
        await side.stop()

    asyncio.run(main())


def test_a_claim_of_the_longest_id_a_router_takes_crosses_the_socket_whole():
    from esr_modelsock import wire
    from router.feedback import MAX_ID

    selection_id = "a" * (MAX_ID - 12) + ".b~model-x"
    key = selection_id.partition("~")[0]
    (kind, payload), = wire.FrameReader().feed(wire.claim_frame(7, key, selection_id, 0.25))
    assert kind == wire.CLAIM and wire.claim_of(payload) == (7, key, selection_id, 0.25)
    (kind, payload), = wire.FrameReader().feed(wire.score_frame(selection_id, 0.25))
    assert wire.score_of(payload) == (selection_id, 0.25)
    (kind, payload), = wire.FrameReader().feed(wire.claimed_frame(7, taken=True))
    assert kind == wire.CLAIMED and wire.claimed_of(payload) == (7, True)


def test_a_front_end_with_the_models_tokenizer_sends_token_ids_and_the_model_process_does_not_tokenize(tmp_path):
    async def main():
        backend = IdsBackend()
        side = await Side(tmp_path / "m.sock", backend).start()
        client = await connect(side.path, token_ids=backend.front_end)
        texts = [f"prompt number {i}" for i in range(40)]
        own = asyncio.gather(*(client.embed(t, soon(5)) for t in texts))
        bulk = asyncio.gather(*(client.embed(f"guard piece {i}", soon(5), bulk=True) for i in range(5)))
        for text, vector in zip(texts, await own):
            np.testing.assert_array_equal(vector, vector_for(text))
        for i, vector in enumerate(await bulk):
            np.testing.assert_array_equal(vector, vector_for(f"guard piece {i}"))
        assert backend.tokenized == []  # every one came as ids
        # a front end without the tokenizer, or one whose tokenizer differs, sends text to the same process
        other = await connect(side.path, token_ids=lambda spec: None)
        np.testing.assert_array_equal(await other.embed("sent as text", soon(5)), vector_for("sent as text"))
        assert backend.tokenized == ["sent as text"]
        await other.aclose()
        await client.aclose()
        await side.stop()
        # a model process that takes text only says so by its HELLO: the same front end sends text
        plain = FakeBackend()
        side = await Side(tmp_path / "p.sock", plain).start()
        client = await connect(side.path, token_ids=backend.front_end)
        np.testing.assert_array_equal(await client.embed("to a text model", soon(5)), vector_for("to a text model"))
        assert plain.tokenized == ["to a text model"]
        await client.aclose()
        await side.stop()

    asyncio.run(main())


def test_token_ids_the_model_cannot_read_fail_their_own_request_and_the_socket_stays(tmp_path):
    import array

    async def main():
        backend = IdsBackend()
        side = await Side(tmp_path / "m.sock", backend).start()
        good = array.array("I", backend.ids_for("a good one")).tobytes()
        frames = [wire.embed_ids_frame(1, 5.0, b"\x01\x00\x00\x00\x02"),  # not whole u32s
                  wire.embed_ids_frame(2, 5.0, array.array("I", [101, 1 << 20, 102]).tobytes()),  # not in the vocabulary
                  wire.embed_ids_frame(3, 5.0, array.array("I", [7] * 65).tobytes()),  # longer than the window
                  wire.embed_ids_frame(4, 5.0, b""),  # none
                  wire.embed_ids_frame(5, 5.0, good)]
        answers = dict((wire.request_id_of(p), (k, p)) for k, p in
                       await asyncio.to_thread(raw_exchange, side.path, frames, len(frames)))
        assert {i: answers[i][0] for i in answers} == {1: wire.ERROR, 2: wire.ERROR, 3: wire.ERROR, 4: wire.ERROR,
                                                      5: wire.VECTOR}
        assert "not whole u32s" in str(wire.error_of(answers[1][1])[1])
        np.testing.assert_array_equal(np.frombuffer(answers[5][1], np.float32, offset=4), vector_for("a good one"))
        assert side.batcher.depth == (0, 0) and side.batcher._queue._reserved == 0  # no slot held
        client = await connect(side.path, token_ids=backend.front_end)  # and everyone else is served
        np.testing.assert_array_equal(await client.embed("still served", soon(5)), vector_for("still served"))
        await client.aclose()
        await side.stop()

    asyncio.run(main())
