"""What the router's decided mark costs: a routed body answer built with it and without it, trials
interleaved in one process (the answer as routed_answer builds it, serialised as gRPC sends it).

    python -m bench.frontend.decided_mark [--trials 5] [--out build/bench-decided-mark.json]
"""

from __future__ import annotations

import argparse
import timeit

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from bench.report import emit
from esr_extproc import replies

HEADERS = {"x-selected-model": "math-model", "x-semantic-route": "math", "x-semantic-route-score": "0.9461",
           "x-semantic-route-reason": "matched", "x-semantic-route-confidence": "0.9461",
           "x-semantic-route-tier": "static", "x-gateway-model-name": "math-model", "content-length": "98"}
BODY = b'{"model":"math-model","messages":[{"role":"user","content":"solve 2x + 3 = 7"}]}'


def marked() -> bytes:
    return replies.body_routed(HEADERS, BODY, "matched").SerializeToString()


def unmarked() -> bytes:
    answer = pb.ProcessingResponse()
    common = answer.request_body.response
    replies._mutation(common.header_mutation, HEADERS)
    common.clear_route_cache = True
    common.body_mutation.body = BODY
    return answer.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--out")
    args = parser.parse_args()
    best = {"marked": float("inf"), "unmarked": float("inf")}
    for _ in range(args.trials):  # interleaved: the machine's noise falls on both alike
        for name, fn in (("marked", marked), ("unmarked", unmarked)):
            best[name] = min(best[name], timeit.timeit(fn, number=args.number) / args.number * 1e6)
    rows = [{"workload": "body answer", "scenario": name, "us_per_answer": round(us, 2)} for name, us in best.items()]
    rows.append({"workload": "body answer", "scenario": "the mark", "us_per_answer": round(best["marked"] - best["unmarked"], 2)})
    emit({"bench": "decided_mark", "trials": args.trials, "rows": rows}, args.out,
         columns=("workload", "scenario", "us_per_answer"))


if __name__ == "__main__":
    main()
