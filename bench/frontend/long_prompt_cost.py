"""What the batcher's cost model predicts for one long prompt after a run of short ones, against what
the prompt then takes: alone, and beside CPU-bound neighbours (one busy loop pinned to each core).

    python -m bench.frontend.long_prompt_cost [--neighbours 0 1 2] [--out result.json]

Why it matters: a batch cut for an item predicted to answer after its deadline refuses it
(`fallback_overload`). After batches of one size only, the model cannot split fixed from per-token
cost and takes the whole cost as per-token (cost_model._fit), so a 256-token prompt after 12-token
ones is predicted at ~20x a short one's cost. The columns say how far that is from the truth.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from bench.harness import neighbour
from bench.report import emit
from devstack.stack import ROOT

SHORT = "what is {} times {}"
LONG = "solve 3x + 5 = 20 " * 200  # truncated to the model's 256 tokens


async def measure(config, rounds: int) -> dict:
    from esr_app.embedding import start_batcher

    batcher = await start_batcher(config)
    try:
        for i in range(40):  # an idle router's history: singles of one short shape
            await batcher.embed(SHORT.format(i, i + 3), time.monotonic() + 5)
        long_tokens = len(batcher.backend.tokenize([LONG])[0])
        predicted = batcher.cost.predict(long_tokens)
        short_predicted = batcher.cost.predict(len(batcher.backend.tokenize([SHORT.format(1, 4)])[0]))
        taken = []
        for _ in range(rounds):
            # Each long prompt after fresh short history, so each is judged as the first one was.
            t0 = time.perf_counter()
            await batcher.embed(LONG, time.monotonic() + 5)
            taken.append(time.perf_counter() - t0)
            for i in range(40):
                await batcher.embed(SHORT.format(i, i + 7), time.monotonic() + 5)
        taken.sort()
        return {"long_tokens": long_tokens, "predicted_short_ms": round(short_predicted * 1000, 1),
                "predicted_long_ms": round(predicted * 1000, 1),
                "taken_long_ms": round(taken[len(taken) // 2] * 1000, 1),
                "over_prediction": round(predicted / taken[len(taken) // 2], 2)}
    finally:
        await batcher.aclose()


def main() -> None:
    from esr_config import load_config

    p = argparse.ArgumentParser()
    p.add_argument("--neighbours", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    config = load_config(ROOT / "router.yaml")
    rows = []
    for n in args.neighbours:
        with contextlib.ExitStack() as stack:
            for core in range(n):
                stack.enter_context(neighbour(core))
            r = asyncio.run(measure(config, args.rounds))
        rows.append({"workload": f"long prompt ({r['long_tokens']} tokens)", "scenario": f"{n} neighbour(s)",
                     "p50_ms": r["taken_long_ms"], **r})
        print(rows[-1], flush=True)
    deadline_ms = config.server.deadline_ms
    checks = {f"{row['scenario']}: predicted below the {deadline_ms:.0f} ms deadline when it answers within it": {
        "ok": row["predicted_long_ms"] < deadline_ms or row["taken_long_ms"] >= deadline_ms,
        "detail": f"predicted {row['predicted_long_ms']} ms, took {row['taken_long_ms']} ms"} for row in rows}
    emit({"rows": rows, "checks": checks}, args.out)


if __name__ == "__main__":
    main()
