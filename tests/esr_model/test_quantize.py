"""esr_model/quantize.py on a small graph: per-token int8 keeps each row's result independent of the
other rows (a huge row beside it changes nothing), stays close to fp32, and smoothing evens out an
outlier channel that per-token scales alone lose precision to."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from esr_model import int8_kernels
from esr_model.quantize import activation_ranges, is_skewed, quantize_per_token

RNG = np.random.default_rng(3)
# Every format this CPU computes exactly (u8u8 everywhere; u8s8 where it has VNNI: tests/esr_model/test_int8_kernels.py)
EXACT_HERE = [f for f in int8_kernels.FORMATS if int8_kernels.is_exact(f)]
W1 = RNG.normal(0, 0.05, (64, 96)).astype(np.float32)
W2 = RNG.normal(0, 0.05, (96, 32)).astype(np.float32)


def two_layer_model(path, rng: np.random.Generator = RNG) -> None:
    """input_ids/attention_mask in (as the export's); x: 64 channels from each id, one of them an
    outlier, growing with the id; y = relu(x W1) W2: two weight MatMuls the quantizer rewrites."""
    spread = numpy_helper.from_array(rng.normal(0, 1, (1, 64)).astype(np.float32), "spread")
    outlier = np.ones((1, 64), np.float32)
    outlier[0, 5] = 40.0  # one channel far larger than the rest, as LayerNorm outputs have
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["ids_f", "axis"], ["ids_3d"]),
        helper.make_node("Mul", ["ids_3d", "spread"], ["x0"]),
        helper.make_node("Sin", ["x0"], ["x1"]),
        helper.make_node("Mul", ["x1", "outlier"], ["x2"]),
        helper.make_node("Mul", ["x0", "small"], ["x3"]),  # grows with the id: a huge id, a huge row
        helper.make_node("Add", ["x2", "x3"], ["x"]),
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="layer/dense/MatMul"),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("MatMul", ["hr", "w2"], ["embedding"], name="layer/output/MatMul"),
    ]
    graph = helper.make_graph(
        nodes, "two_layer",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["b", "t", 32])],
        [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2"), spread,
         numpy_helper.from_array(outlier, "outlier"), numpy_helper.from_array(np.array([-1], np.int64), "axis"),
         numpy_helper.from_array(np.array(1e-4, np.float32), "small")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def run(path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.parametrize("fmt", EXACT_HERE)
def test_rows_are_quantized_alone_and_close_to_fp32(tmp_path, fmt):
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    two_layer_model(fp32)
    assert quantize_per_token(fp32, int8, None, fmt) == 2
    ids = RNG.integers(1, 30000, (1, 12))
    alone = run(int8, ids)
    # beside a row whose values are all at the extremes: one scale for the batch would crush ours
    beside = run(int8, np.concatenate([ids, np.full((1, 12), 10**6)]))[:1]
    np.testing.assert_array_equal(alone, beside)
    assert cosine(alone, run(fp32, ids)).min() > 0.995
    ops = {n.op_type for n in onnx.load(str(int8)).graph.node}
    assert "MatMulIntegerToFloat" in ops and "MatMul" not in ops


@pytest.mark.parametrize("fmt", EXACT_HERE)
def test_smoothing_moves_an_outlier_channel_into_the_weights(tmp_path, fmt):
    # Eight models of their own seeds, not the module's stream: which tests ran before (how many
    # formats this CPU computes exactly) no longer picks the one model the claim rests on. One draw
    # gains 1.5x, another 2.4x, all eight together 1.96x (VNNI, both formats).
    errors: dict[str, list[float]] = {"plain": [], "smoothed": []}
    for seed in range(8):
        rng = np.random.default_rng(seed)
        fp32, plain, smoothed = tmp_path / "fp32.onnx", tmp_path / "plain.onnx", tmp_path / "smoothed.onnx"
        two_layer_model(fp32, rng)
        calib = [(rng.integers(1, 30000, (4, 16)), np.ones((4, 16), np.int64)) for _ in range(4)]
        ranges = activation_ranges(fp32, calib)
        assert set(ranges) == {"x", "hr"} and np.abs(ranges["x"]).max(axis=0).argmax() == 5  # the outlier is seen
        assert is_skewed(ranges["hr"]) and not is_skewed(ranges["x"])  # relu outputs: centred; x: by its maximum
        quantize_per_token(fp32, plain, None, fmt)
        quantize_per_token(fp32, smoothed, ranges, fmt)
        ids = rng.integers(1, 30000, (8, 16))
        want = run(fp32, ids)
        for name, path in (("plain", plain), ("smoothed", smoothed)):
            errors[name].append(1 - cosine(run(path, ids), want).mean())
    plain_error, smoothed_error = np.array(errors["plain"]), np.array(errors["smoothed"])
    assert (smoothed_error < 0.75 * plain_error).all(), errors
    assert smoothed_error.sum() < 0.55 * plain_error.sum(), errors


@pytest.mark.parametrize("fmt", EXACT_HERE)
def test_a_skewed_row_is_centred_so_it_uses_every_level(tmp_path, fmt):
    """Rows all far from zero (as GELU's outputs lean positive): centred on their midpoint they keep
    their precision, where a scale from the absolute maximum would leave most levels unused."""
    w = RNG.normal(0, 0.05, (64, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "skewed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    quantize_per_token(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", None, fmt)
    x = (50 + RNG.normal(0, 1, (8, 64))).astype(np.float32)  # a spread of 1 around 50
    (got,) = ort.InferenceSession(str(tmp_path / "int8.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    want = x @ w
    # weight rounding bounds what is left: (x - mid) is quantized at ~1/40 of a symmetric scale's step
    np.testing.assert_allclose(got, x @ (np.round(w / (np.abs(w).max(0) / 127)) * (np.abs(w).max(0) / 127)),
                               atol=0.02)  # a symmetric scale: 0.12
    assert cosine(got, want).min() > 0.999
