"""What a request body shaped to be costly to parse costs, shape by shape, and where it is parsed.

    python -m bench.frontend.adversarial_parse [--kib 256] [--out result.json]

For each shape (SHAPES: the worst case of one cost each, also what tests/esr_extproc/test_adversarial_bodies.py
checks for linear growth): the CPU time of parse_body and of scan_unread (the cheapest of three
runs), and whether BodyParser would parse it on the event loop. The inline gate's worst case is
measured too: for each shape, the largest body the gate still keeps on the loop. To compare with an
older tree, copy this file into it and run it there (it needs only request_body and body_parser).
"""

from __future__ import annotations

import argparse
import time

from bench.report import emit


def _join(parts, n):
    return b",".join(parts(i) for i in range(n))


# name -> body of about `size` bytes, each the worst case of one cost: keys in one object (one of
# them repeated), top-level members, empty containers, messages, escapes, harness tags, quotes.
SHAPES = {
    # the repeat last: naming it by re-scanning prefixes was quadratic (35 s at 256 KiB)
    "many_keys_one_repeated": lambda size: b'{"model":"auto","messages":[{'
    + _join(lambda i: b'"k%d":1' % i, size // 9) + b',"k0":0,"role":"user","content":"hi"}]}',
    "top_level_members": lambda size: b"{" + _join(lambda i: b'"k%d":1' % i, size // 9) + b',"model":"auto"}',
    "empty_arrays": lambda size: b'{"model":"auto","x":[' + b",".join([b"[]"] * (size // 3)) + b"]}",
    "empty_objects": lambda size: b'{"model":"auto","x":[' + b",".join([b"{}"] * (size // 3)) + b"]}",
    "many_turns": lambda size: b'{"model":"auto","messages":['
    + b",".join([b'{"role":"user","content":"a <system-reminder>x</system-reminder>"}'] * (size // 64)) + b"]}",
    "escapes": lambda size: b'{"model":"auto","messages":[{"role":"user","content":"'
    + b"\\u00e9\\\"" * (size // 8) + b'"}]}',
    "open_tags": lambda size: b'{"model":"auto","messages":[{"role":"user","content":"'
    + b"<system-reminder " * (size // 17) + b'"}]}',
    "strings": lambda size: b'{"model":"auto","x":[' + b",".join([b'"\\\\"'] * (size // 5)) + b"]}",
}


def cpu_ms(fn, raw: bytes) -> float:
    """CPU milliseconds of the cheapest of three runs (less noisy than wall time on a shared machine)."""
    from esr_extproc.json_scan import BadBody

    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        try:
            fn(raw)
        except BadBody:  # a refusal (duplicate_key, too_deep) is an outcome here, not a failure
            pass
        best = min(best, time.process_time() - start)
    return round(best * 1000, 2)


def largest_inline(parser, make) -> bytes:
    lo, hi = 1, 1
    while parser.inline(make(hi)):
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if parser.inline(make(mid)) else (lo, mid)
    return make(lo)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.adversarial_parse")
    p.add_argument("--kib", type=int, default=256)
    p.add_argument("--out")
    args = p.parse_args()
    from esr_extproc.body_parser import BodyParser
    from esr_extproc.json_scan import scan_unread
    from esr_extproc.request_body import ReadOptions, parse_body

    parser = BodyParser()

    def parse(raw):
        return parse_body(raw, "/v1/chat/completions", ReadOptions(max_turns=8))

    rows = []
    for name, make in SHAPES.items():
        raw = make(args.kib * 1024)
        gate = largest_inline(parser, make)
        rows.append({"shape": name, "bytes": len(raw), "parse_ms": cpu_ms(parse, raw), "scan_ms": cpu_ms(scan_unread, raw),
                     "on_loop": parser.inline(raw), "largest_on_loop_bytes": len(gate),
                     "largest_on_loop_parse_ms": cpu_ms(parse, gate)})
    worst = max(r["largest_on_loop_parse_ms"] for r in rows)
    emit({"rows": rows, "checks": {"on-loop parse bounded": {
        "ok": worst < 5.0, "detail": f"the costliest body the gate keeps on the event loop parses in {worst} ms"}}},
         args.out, columns=tuple(rows[0]))


if __name__ == "__main__":
    main()
