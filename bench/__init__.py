"""Benchmarks: `make bench` (python -m bench.batcher_bench) and python -m bench.ext_proc_bench."""
