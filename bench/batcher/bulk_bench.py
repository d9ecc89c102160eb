"""A request's prompt beside other requests' many guard pieces, by `batching.bulk_slice_ms`: the
prompts' wait and refusals, and what the pieces cost when alone. The bundled model on this CPU, the
served runtime, through the real batcher (no server: what is measured is the queue's order).

    python -m bench.batcher.bulk_bench [--trials 2] [--seconds 5] [--out result.json]

`off` is the queue before bulk texts existed: pieces queued as prompts are (first come, first
batched, and counted against every prompt's admission). Trials interleave the settings.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from batching import BatcherError, BatcherSettings, ContinuousBatcher
from bench.report import emit, latency_stats
from bench.workloads import short_prompts
from esr_app.embedding import make_backend
from esr_config import load_config

WAVE = 16  # filters/context.py EMBED_WAVE
PIECES = 100  # a 100-turn agent conversation's sentences
DEADLINE_S = 0.5  # server.deadline_ms
SLICES = {"20 ms (default)": 20.0, "50 ms": 50.0, "off": None}


def pieces(tag: str) -> list[str]:
    return [f"turn {i} of {tag} " + "word " * 40 for i in range(PIECES)]


async def one_request(batcher: ContinuousBatcher, texts: list[str], bulk: bool) -> int:
    """A guarded request's pieces, a wave at a time as the guard sends them, by one deadline; how
    many were embedded before it."""
    deadline = time.monotonic() + DEADLINE_S
    done = 0
    for start in range(0, len(texts), WAVE):
        out = await asyncio.gather(*(batcher.embed(t, deadline, bulk) for t in texts[start:start + WAVE]),
                                   return_exceptions=True)
        done += sum(not isinstance(o, BaseException) for o in out)
        if any(isinstance(o, BaseException) for o in out):
            break
    return done


async def trial(backend, slice_ms: float | None, seconds: float) -> dict:
    bulk = slice_ms is not None
    settings = BatcherSettings(bulk_slice_ms=slice_ms if bulk else 20.0)
    batcher = ContinuousBatcher(backend, settings)
    batcher.start()
    await batcher.started()
    # Alone: one request's pieces with the whole model (a long deadline: all of them, timed).
    t0 = time.perf_counter()
    deadline = time.monotonic() + 60
    texts = pieces(uuid.uuid4().hex)
    for start in range(0, PIECES, WAVE):
        await asyncio.gather(*(batcher.embed(t, deadline, bulk) for t in texts[start:start + WAVE]))
    alone_s = time.perf_counter() - t0
    # Beside: two clients sending such requests back to back, one client sending prompts.
    stop = asyncio.Event()

    async def talker():
        while not stop.is_set():
            await one_request(batcher, pieces(uuid.uuid4().hex), bulk)
            await asyncio.sleep(0.01)  # a client's round trip: without it a refused talker spins on the loop

    talkers = [asyncio.create_task(talker()) for _ in range(2)]
    await asyncio.sleep(0.2)
    waits, refused = [], 0
    prompts = [f"{p} {uuid.uuid4().hex[:6]}" for p in short_prompts(2000, seed=int(time.time()))]
    end = time.monotonic() + seconds
    for prompt in prompts:
        if time.monotonic() >= end:
            break
        t = time.perf_counter()
        try:
            await batcher.embed(prompt, time.monotonic() + DEADLINE_S)
            waits.append(time.perf_counter() - t)
        except BatcherError:
            refused += 1
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.gather(*talkers)
    await batcher.aclose()
    return {"alone_s": alone_s, "waits": waits, "refused": refused}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    backend = make_backend(load_config("router.yaml"))
    results: dict[str, list[dict]] = {name: [] for name in SLICES}
    for _ in range(args.trials):
        for name, slice_ms in SLICES.items():
            results[name].append(asyncio.run(trial(backend, slice_ms, args.seconds)))
    rows = []
    for name, runs in results.items():
        waits = [w for r in runs for w in r["waits"]]
        sent = len(waits) + sum(r["refused"] for r in runs)
        rows.append({"scenario": name, "prompts": sent, **latency_stats(waits),
                     "refused": round(sum(r["refused"] for r in runs) / max(1, sent), 4),
                     "pieces_alone_s": [round(r["alone_s"], 3) for r in runs]})
    emit({"bench": "bulk_bench", "pieces": PIECES, "deadline_s": DEADLINE_S, "rows": rows}, args.out,
         columns=("scenario", "prompts", "p50_ms", "p95_ms", "p99_ms", "refused", "pieces_alone_s"))


if __name__ == "__main__":
    main()
