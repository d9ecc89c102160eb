"""Benchmarks, each a short script over `bench/harness.py` (stacks, load, trials) and
`bench/report.py` (JSON and a table), grouped by what they measure:

- `frontend/`: the ext_proc path and the Python front end (bodies, uploads, long prompts, the gap to a minimal servicer);
- `batcher/`: the continuous batcher, the model process, a node's pool, a remote engine;
- `runtime/`: the model runtimes (ONNX Runtime, int8, torch) and their routing quality;
- `cascade/`: the static tier against the encoder alone, and its refit on records;
- `overload/`: shedding, contention with neighbours, a failing router;
- `guard/`, `cache/`, `failover/`, `observe/` (records, traces, replay), `quality/` (conversations, model selection);
- `gpu/`: what a GPU node measures, as one prepared call (`bench/gpu/README.md`).

`make bench` runs the batcher and ext_proc benches; docs/benchmarks.md has every table and its command.
"""
