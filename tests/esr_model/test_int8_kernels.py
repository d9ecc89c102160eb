"""The int8 format is chosen for each CPU class by its features (injected here, so a machine with VNNI
still exercises the AVX2 decision), and the probe confirms the choice on the CPU that runs the suite:
the format it picks is computed exactly, and u8s8 is exact exactly where the CPU has VNNI."""

from __future__ import annotations

import platform

import numpy as np
import onnx
import pytest

from esr_model import int8_kernels
from esr_model.int8_kernels import choose, cpu_features

# /proc/cpuinfo flags of each class (trimmed to what matters plus neighbours that must not).
EPYC_ZEN3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 sse4a avx avx2 fma bmi2 sha_ni vaes vpclmulqdq"
SKYLAKE_SP = EPYC_ZEN3 + " avx512f avx512dq avx512cd avx512bw avx512vl"
CASCADE_LAKE = SKYLAKE_SP + " avx512_vnni"
ALDER_LAKE = EPYC_ZEN3 + " avx_vnni"
SAPPHIRE_RAPIDS = CASCADE_LAKE + " avx512_bf16 amx_tile amx_int8 avx_vnni"
OLD_X86 = "fpu sse sse2 ssse3 sse4_1 sse4_2"


@pytest.mark.parametrize("flags, machine, fmt, cpu", [
    (EPYC_ZEN3, "x86_64", "u8u8", "x86-64 with AVX2, no VNNI"),
    (SKYLAKE_SP, "x86_64", "u8u8", "x86-64 with AVX-512BW, no VNNI"),
    (CASCADE_LAKE, "x86_64", "u8s8", "x86-64 with AVX-512 VNNI"),
    (ALDER_LAKE, "x86_64", "u8s8", "x86-64 with AVX-VNNI"),
    (SAPPHIRE_RAPIDS, "AMD64", "u8s8", "x86-64 with AVX-512 VNNI"),
    (OLD_X86, "x86_64", "u8u8", "x86-64 with SSE, no VNNI"),
    ("fp asimd evtstrm aes pmull sha1 sha2 crc32 asimddp", "aarch64", "u8u8", "arm64"),
    ("", "riscv64", "u8u8", "riscv64"),
])
def test_each_cpu_class_gets_the_format_it_computes_exactly(flags, machine, fmt, cpu):
    choice = choose(frozenset(flags.split()), machine)
    assert (choice.format, choice.cpu) == (fmt, cpu)
    if machine == "x86_64" and fmt == "u8u8":  # the message a refused int8 gives names the missing feature
        assert "avx512_vnni" in choice.why and "vpmaddubsw" in choice.why


def test_features_are_read_from_cpuinfo_on_x86_and_arm():
    x86 = f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {EPYC_ZEN3}\nbugs\t\t: sysret_ss_attrs\n"
    assert cpu_features(x86) == frozenset(EPYC_ZEN3.split())
    assert "asimddp" in cpu_features("processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU implementer\t: 0x41\n")
    assert cpu_features("no flags here") == frozenset()


@pytest.mark.parametrize("fmt", int8_kernels.FORMATS)
def test_the_probe_graph_is_a_valid_onnx_model_of_the_quantizers_gemm(fmt):
    a, b, b_zero = int8_kernels._worst_case(fmt)
    model = onnx.load_from_string(int8_kernels._probe_model(b, b_zero))
    onnx.checker.check_model(model)
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == ("MatMulIntegerToFloat", "com.microsoft")
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(weights["b"], b)
    # values that saturate a 16-bit sum of two u8 x s8 products are in it
    assert a.max() == 255 and np.abs(b.astype(int) - b_zero.astype(int)).max() >= 127


def test_on_this_cpu_the_chosen_format_is_exact_and_u8s8_is_exact_only_with_vnni():
    here = int8_kernels.this_cpu()
    features = cpu_features()
    assert int8_kernels.is_exact(here.format), f"{here.format} is not exact on {here.cpu} ({platform.processor()})"
    assert int8_kernels.is_exact("u8u8")
    if platform.machine() in ("x86_64", "AMD64"):
        has_vnni = bool({"avx512_vnni", "avx_vnni"} & features)
        assert int8_kernels.is_exact("u8s8") == has_vnni, f"{here.cpu}: {sorted(f for f in features if 'avx' in f)}"
