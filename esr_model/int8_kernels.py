"""Which int8 format ONNX Runtime computes exactly on this CPU: chosen from the CPU's features and
confirmed by running the kernel on worst-case values.

Why it matters (docs/model-runtime.md, "CPU requirements and int8"): ONNX Runtime's int8 GEMM (MLAS) multiplies a uint8
input by int8 weights ("u8s8") with `vpmaddubsw` on AVX2 and AVX-512BW, which adds each pair of
products into a 16-bit lane that saturates: 255 x 127 x 2 > 32767. Only VNNI (`vpdpbusd`: AVX-512
VNNI, AVX-VNNI) sums u8 x s8 products in 32 bits. uint8 weights ("u8u8") are widened to 16 bits and
multiplied with `vpmaddwd` (x86) or summed by `udot` / widening multiplies (Arm): exact everywhere,
slower than VNNI's u8s8. So u8s8 where the CPU has VNNI, u8u8 elsewhere; on a measured AVX2-only EPYC,
u8s8 gave vectors at cosine 0.96 to fp32 and u8u8 the same integers numpy computes.

The probe runs the GEMM the quantizer emits (MatMulIntegerToFloat, constant weights, per-column
scales and zero points) on values that saturate a 16-bit pair sum, and compares with integer
arithmetic: the features say what to expect, the probe is what the export and a server trust. It
needs only ONNX Runtime (the graph is encoded here, not by the `onnx` package serving lacks).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

FORMATS = ("u8s8", "u8u8")  # input x weights; the input is always uint8 around 128
ZERO_POINT = 128


@dataclass(frozen=True)
class Choice:
    format: str  # the preferred format, u8s8 or u8u8
    cpu: str  # the CPU class, as the error messages and source.json name it
    why: str


def cpu_features(cpuinfo: str | None = None) -> frozenset[str]:
    """The kernel's feature flags (Linux /proc/cpuinfo: x86 `flags`, Arm `Features`); empty elsewhere."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def choose(features: frozenset[str], machine: str) -> Choice:
    """The format this CPU class computes exactly and fastest, by what MLAS runs on it."""
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "i686", "i386", "x86"):
        for flag, name in (("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI")):
            if flag in features:
                return Choice("u8s8", f"x86-64 with {name}", f"{flag}: vpdpbusd sums u8 x s8 products in 32 bits")
        have = "AVX-512BW" if "avx512bw" in features else "AVX2" if "avx2" in features else "SSE"
        return Choice("u8u8", f"x86-64 with {have}, no VNNI",
                      "no avx512_vnni or avx_vnni: u8s8 runs on vpmaddubsw, whose 16-bit pair sums saturate; "
                      "u8u8 widens to 16 bits first")
    if machine in ("aarch64", "arm64"):
        return Choice("u8u8", "arm64", "u8u8 sums in 32 bits (udot, or widening multiplies)")
    return Choice("u8u8", machine or "unknown CPU", "u8u8 is the format MLAS widens on every CPU")


def this_cpu() -> Choice:
    return choose(cpu_features(), platform.machine())


@lru_cache(maxsize=None)
def is_exact(fmt: str) -> bool:
    """Whether ONNX Runtime's int8 GEMM gives the exact integer result for `fmt` on this CPU."""
    import onnxruntime as ort

    a, b, b_zero = _worst_case(fmt)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(_probe_model(b, b_zero), opts, providers=["CPUExecutionProvider"])
    for rows in (a, a[:1]):  # a batch and a single row: MLAS may take another path for one
        (got,) = session.run(None, {"a": rows})
        want = (rows.astype(np.int64) - ZERO_POINT) @ (b.astype(np.int64) - b_zero.astype(np.int64))
        if not np.array_equal(got, want.astype(np.float32)):  # |want| < 2**24: exact in float32
            return False
    return True


def _worst_case(fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs at the top of the range beside weights at both ends (what saturates a 16-bit pair
    sum), and random values, over the model's own width."""
    rng = np.random.default_rng(0)
    k, n = 384, 64
    a = rng.integers(0, 256, (16, k)).astype(np.uint8)
    a[:8] = 255
    if fmt == "u8s8":
        b = rng.integers(-127, 128, (k, n)).astype(np.int8)
        b[:, : n // 2] = 127
        b[::2, n // 4 : n // 2] = -127
        b_zero = np.zeros(n, np.int8)
    elif fmt == "u8u8":
        b = rng.integers(1, 256, (k, n)).astype(np.uint8)
        b[:, : n // 2] = 255
        b[::2, n // 4 : n // 2] = 1
        b_zero = np.full(n, ZERO_POINT, np.uint8)
    else:
        raise ValueError(f"unknown int8 format {fmt!r} (have {', '.join(FORMATS)})")
    return a, b, b_zero


# The probe's ONNX graph, protobuf-encoded by hand: serving installs ONNX Runtime, not the `onnx` package.
_FLOAT, _UINT8, _INT8 = 1, 2, 3
_DTYPES = {np.dtype(np.float32): _FLOAT, np.dtype(np.uint8): _UINT8, np.dtype(np.int8): _INT8}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _tensor(name: str, value: np.ndarray) -> bytes:
    dims = b"".join(_field(1, d) for d in value.shape)
    return dims + _field(2, _DTYPES[value.dtype]) + _field(8, name) + _field(9, value.tobytes())


def _value_info(name: str, dtype: int, dims: tuple[int | str, ...]) -> bytes:
    shape = b"".join(_field(1, _field(2 if isinstance(d, str) else 1, d)) for d in dims)
    return _field(1, name) + _field(2, _field(1, _field(1, dtype) + _field(2, shape)))


def _probe_model(b: np.ndarray, b_zero: np.ndarray) -> bytes:
    """y = MatMulIntegerToFloat(a, b) with unit scales: the quantizer's node, on a uint8 input `a`."""
    k, n = b.shape
    initializers = [("b", b), ("one", np.array(1.0, np.float32)), ("b_scale", np.ones(n, np.float32)),
                    ("a_zero", np.array(ZERO_POINT, np.uint8)), ("b_zero", b_zero)]
    node = (b"".join(_field(1, x) for x in ("a", "b", "one", "b_scale", "a_zero", "b_zero"))
            + _field(2, "y") + _field(3, "probe") + _field(4, "MatMulIntegerToFloat") + _field(7, "com.microsoft"))
    graph = (_field(1, node) + _field(2, "int8_probe")
             + b"".join(_field(5, _tensor(name, value)) for name, value in initializers)
             + _field(11, _value_info("a", _UINT8, ("rows", k))) + _field(12, _value_info("y", _FLOAT, ("rows", n))))
    opsets = _field(8, _field(1, "") + _field(2, 17)) + _field(8, _field(1, "com.microsoft") + _field(2, 1))
    return _field(1, 8) + opsets + _field(7, graph)

