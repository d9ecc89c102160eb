"""int8 per-token quantization of an fp32 ONNX export: every MatMul on a weight becomes an int8 GEMM
whose input is quantized with one scale per token (the row's own range), so a prompt's embedding
does not depend on the batch it runs in; weights are quantized per output channel, after
SmoothQuant moves the inputs' outlier channels into them.

Why per token (docs/notes/benchmarks-history.md, "choosing the model runtime"): ONNX Runtime's
`quantize_dynamic` gives a whole batch tensor one activation scale, so one long or odd prompt moved
its neighbours' vectors (cosine 0.977 alone vs batched); static scales moved them all too far from
the model's. Per token, a vector is the same alone and in any batch (cosine 1.0000000).

Why a skewed input's rows are centred on their own midpoint before they are scaled: the FFN's second
GEMM reads GELU's outputs (-0.17 to ~20), which a scale from the row's absolute maximum spends half
its levels on never reaching. Centred, the row uses all 255 levels, and the midpoint times the
quantized weight's column sums is added back after the GEMM (the same product, up to float
rounding). On CLINC150 val prompts (bundled model, u8u8): mean cosine to fp32 0.9971 -> 0.9988, min
0.994 -> 0.998; centring every input instead gains nothing more (0.99888 / 0.998) and costs ~5% of
the graph's speed. Which inputs are skewed comes from calibration (`is_skewed`): here, the six GELU
outputs only.

Why SmoothQuant (Xiao et al. 2023): a few channels of a transformer's LayerNorm outputs are tens of
times larger than the rest, and with one scale per token they take the int8 range from the others.
Dividing each input channel by s = max|x|^0.5 / max|w|^0.5 (and multiplying the weight's row by it)
leaves the product unchanged and evens the ranges out: on the bundled model, mean cosine to fp32
0.9974 -> 0.9987 (min 0.994 -> 0.995), 1-NN agreement 0.91 -> 0.95. The maxima come from random vocabulary ids
(`calibration`): nearly as good here as text (0.99886 vs 0.99895), and no data set goes into the export. The
factors are constants, so vectors stay batch-independent.

Why the per-token scale is a Mul after the GEMM rather than the GEMM's own `a_scale`: ONNX
Runtime's MatMulIntegerToFloat takes a scalar (or per-column) input scale; fusions at the
extended optimization level treat a per-row scale as per-column and silently give wrong vectors.
Activations are stored as uint8 around 128; weights are int8 ("u8s8", exact only where
the CPU has VNNI) or the same levels as uint8 around 128 ("u8u8", exact on every CPU), whichever the
CPU computes exactly (esr_model/int8_kernels.py). Both keep 8 bits. ONNX Runtime's other answers to
u8s8 saturation fall short of the 0.998 mean: 7-bit weights cost 0.989 vs 0.994 min cosine before
smoothing; 7-bit inputs (exact u8s8 on AVX2, ~12% faster there than u8u8) gave mean 0.9973, min 0.995.
The export's check compares with fp32.

Needs the `onnx` package (the torch extra, with the exporter); serving needs only ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from esr_model.int8_kernels import FORMATS, ZERO_POINT
from esr_model.tuned import pad

WEIGHT_BITS = 8
SMOOTHING_ALPHA = 0.5
SKEWED = 0.1  # is_skewed: the short side under a tenth of the long one
_EPS = 1e-12


def calibration(cls_id: int, sep_id: int, vocab_size: int, n: int = 128) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches of 16 sequences of random vocabulary ids (4-40 between [CLS] and [SEP]), padded with 0."""
    # ids from 1,000 up: BERT-family vocabularies start with reserved and special tokens
    low, high = min(1000, vocab_size // 10), min(20000, vocab_size)
    rng = np.random.default_rng(0)
    rows = [[cls_id, *rng.integers(low, high, size=int(rng.integers(4, 41))), sep_id] for _ in range(n)]
    return [pad(rows[i:i + 16], 0) for i in range(0, n, 16)]


def _linear_matmuls(graph) -> list:
    weights = {init.name: init for init in graph.initializer}
    return [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights and len(weights[n.input[1]].dims) == 2]


def activation_ranges(source: str | Path, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per input channel, the lowest and highest value (rows 0 and 1) each weight MatMul's input
    takes on real tokens."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(source))
    names = sorted({n.input[0] for n in _linear_matmuls(model.graph)})
    for name in names:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ranges: dict[str, np.ndarray] = {}
    for ids, mask in batches:
        for name, value in zip(names, session.run(names, {"input_ids": ids, "attention_mask": mask})):
            rows = value.reshape(-1, value.shape[-1])[mask.reshape(-1) == 1]  # padding is not traffic
            seen = np.stack([rows.min(axis=0), rows.max(axis=0)])
            ranges[name] = seen if name not in ranges else np.stack([np.minimum(ranges[name][0], seen[0]),
                                                                     np.maximum(ranges[name][1], seen[1])])
    return ranges


def is_skewed(seen: np.ndarray) -> bool:
    """Whether an input's values lie nearly all on one side of zero (GELU's: -0.17 to ~20), so that a
    row centred on its midpoint has twice the levels of one scaled by its absolute maximum."""
    below, above = -float(seen[0].min()), float(seen[1].max())
    return min(below, above) < SKEWED * max(below, above)


def quantize_per_token(source: str | Path, target: str | Path, ranges: dict[str, np.ndarray] | None,
                       fmt: str) -> int:
    """Writes the int8 model for the fp32 `source`, smoothed where `ranges` (activation_ranges) has
    the input, with weights as `fmt` says (esr_model/int8_kernels.py: int8, or uint8 around 128);
    returns how many MatMuls it quantized."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown int8 format {fmt!r} (have {', '.join(FORMATS)})")
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    linear = _linear_matmuls(graph)
    qmax = 2 ** (WEIGHT_BITS - 1) - 1

    def constant(name: str, value: np.ndarray) -> str:
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    one = constant("pt/one", np.array(1.0, np.float32))
    zero_point = constant("pt/zero_point", np.array(ZERO_POINT, np.uint8))
    eps = constant("pt/eps", np.array(_EPS, np.float32))
    inv127 = constant("pt/inv127", np.array(1 / 127, np.float32))
    half = constant("pt/half", np.array(0.5, np.float32))

    # Smoothing factors per input, from every weight that input feeds (Q, K and V share one).
    smoothing: dict[str, np.ndarray] = {}
    ranges = ranges or {}
    for x in {n.input[0] for n in linear} & set(ranges):
        w_max = np.max([np.abs(numpy_helper.to_array(weights[n.input[1]])).max(axis=1)
                        for n in linear if n.input[0] == x], axis=0)
        smoothing[x] = (np.maximum(np.abs(ranges[x]).max(axis=0), 1e-5) ** SMOOTHING_ALPHA
                        / np.maximum(w_max, 1e-5) ** (1 - SMOOTHING_ALPHA)).astype(np.float32)

    nodes: list = []
    quantized_inputs: dict[str, str] = {}  # an activation -> the prefix of its quantized copy
    centred_inputs: set[str] = set()
    linear_outputs = {n.output[0] for n in linear}  # unique in a graph, unlike wrapper identities
    for node in graph.node:
        if node.output[0] not in linear_outputs:
            nodes.append(node)
            continue
        x, wname = node.input[0], node.input[1]
        w = numpy_helper.to_array(weights[wname]).astype(np.float32)
        if x in smoothing:
            w = w * smoothing[x][:, None]
        w_scale = np.maximum(np.abs(w).max(axis=0), _EPS) / qmax
        q = np.clip(np.round(w / w_scale), -qmax, qmax)
        if fmt == "u8u8":  # the same levels, stored around the zero point as the input is
            constant(wname + "/q", (q + ZERO_POINT).astype(np.uint8))
            constant(wname + "/zero_point", np.full(w.shape[1], ZERO_POINT, np.uint8))
        else:
            constant(wname + "/q", q.astype(np.int8))
            constant(wname + "/zero_point", np.zeros(w.shape[1], np.int8))
        constant(wname + "/scale", w_scale.astype(np.float32))
        if x not in quantized_inputs:
            p = f"pt/{len(quantized_inputs)}/"
            source_x = x
            if x in smoothing:
                nodes.append(helper.make_node("Mul", [x, constant(p + "smooth", 1 / smoothing[x])], [p + "smoothed"]))
                source_x = p + "smoothed"
            centred = x not in ranges or is_skewed(ranges[x])  # no ranges: nothing says the rows are balanced
            nodes += [
                helper.make_node("ReduceMax", [source_x], [p + "hi"], axes=[-1], keepdims=1),
                helper.make_node("ReduceMin", [source_x], [p + "lo"], axes=[-1], keepdims=1),
            ]
            if centred:
                # mid = (max + min) / 2, scale = (max - min) / 2 / 127, q = round((x - mid) / scale) + 128;
                # x W' = (x - mid) W' + mid colsum(W'), W' the weight as quantized (the fp32 weight's
                # colsum would add mid times its rounding error)
                nodes += [
                    helper.make_node("Add", [p + "hi", p + "lo"], [p + "sum"]),
                    helper.make_node("Mul", [p + "sum", half], [p + "mid"]),
                    helper.make_node("Sub", [p + "hi", p + "mid"], [p + "radius"]),
                    helper.make_node("Max", [p + "radius", eps], [p + "absmax"]),
                    helper.make_node("Sub", [source_x, p + "mid"], [p + "centred"]),
                ]
                source_x = p + "centred"
            else:  # scale = max|x| over the row's features / 127; q = round(x / scale) + 128
                nodes += [
                    helper.make_node("Neg", [p + "lo"], [p + "neg_lo"]),
                    helper.make_node("Max", [p + "hi", p + "neg_lo", eps], [p + "absmax"]),
                ]
            nodes += [
                helper.make_node("Mul", [p + "absmax", inv127], [p + "scale"]),
                helper.make_node("Reciprocal", [p + "scale"], [p + "inv_scale"]),
                helper.make_node("Mul", [source_x, p + "inv_scale"], [p + "scaled"]),
                helper.make_node("QuantizeLinear", [p + "scaled", one, zero_point], [p + "q"]),
            ]
            if centred:
                centred_inputs.add(x)
            quantized_inputs[x] = p
        p = quantized_inputs[x]
        y = node.output[0]
        nodes += [
            helper.make_node("MatMulIntegerToFloat",
                             [p + "q", wname + "/q", one, wname + "/scale", zero_point, wname + "/zero_point"],
                             [y + "/unscaled"], domain="com.microsoft"),
        ]
        if x in centred_inputs:
            colsum = constant(wname + "/colsum", (q * w_scale).sum(axis=0).astype(np.float32))
            nodes += [helper.make_node("Mul", [y + "/unscaled", p + "scale"], [y + "/centred"]),
                      helper.make_node("Mul", [p + "mid", colsum], [y + "/offset"]),
                      helper.make_node("Add", [y + "/centred", y + "/offset"], [y])]
        else:
            nodes.append(helper.make_node("Mul", [y + "/unscaled", p + "scale"], [y]))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return len(linear)
