"""int8 per-token quantization of an fp32 ONNX export: every MatMul on a weight becomes an int8 GEMM
whose input is quantized with one scale per token (the row's own absolute maximum), so a prompt's
embedding does not depend on the batch it runs in; weights are quantized per output channel.

Why per token (README, "Model runtime"): ONNX Runtime's `quantize_dynamic` gives a whole batch
tensor one activation scale, so one long or odd prompt moved its neighbours' vectors (cosine 0.977
alone vs batched); static scales moved them all too far from the model's. Per token, a vector is
the same alone and in any batch (cosine 1.0000000) and within cosine 0.994 of fp32.

Why the per-token scale is a Mul after the GEMM rather than the GEMM's own `a_scale`: ONNX
Runtime's MatMulIntegerToFloat takes a scalar (or per-column) input scale; fusions at the
extended optimization level treat a per-row scale as per-column and silently give wrong vectors.
The activations are symmetric int8 stored as uint8 around 128 (the u8s8 kernels MLAS has on x86
and ARM); weights keep 8 bits: on AVX2 without VNNI the u8s8 path can saturate, which ONNX Runtime
answers with 7-bit weights (`reduce_range`): measured 0.989 vs 0.994 min cosine here (AVX-512 VNNI,
no saturation), so 8 bits are kept and the export's check compares the result with fp32.

Needs the `onnx` package (the torch extra, with the exporter); serving needs only ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WEIGHT_BITS = 8
_EPS = 1e-12


def quantize_per_token(source: str | Path, target: str | Path) -> int:
    """Writes the int8 model for the fp32 `source`; returns how many MatMuls it quantized."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    qmax = 2 ** (WEIGHT_BITS - 1) - 1

    def constant(name: str, value: np.ndarray) -> str:
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    one = constant("pt/one", np.array(1.0, np.float32))
    zero_point = constant("pt/zero_point", np.array(128, np.uint8))
    eps = constant("pt/eps", np.array(_EPS, np.float32))
    inv127 = constant("pt/inv127", np.array(1 / 127, np.float32))

    nodes: list = []
    quantized_inputs: dict[str, str] = {}  # an activation -> the prefix of its quantized copy (Q, K, V share one)
    count = 0
    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weight).astype(np.float32)
        w_scale = np.maximum(np.abs(w).max(axis=0), _EPS) / qmax
        w_q = np.clip(np.round(w / w_scale), -qmax, qmax).astype(np.int8)
        wname = node.input[1]
        constant(wname + "/q", w_q)
        constant(wname + "/scale", w_scale.astype(np.float32))
        constant(wname + "/zero_point", np.zeros(w.shape[1], np.int8))
        x = node.input[0]
        if x not in quantized_inputs:
            p = f"pt/{len(quantized_inputs)}/"
            # scale = max|x| over the row's features / 127; q = round(x / scale) + 128
            nodes += [
                helper.make_node("ReduceMax", [x], [p + "hi"], axes=[-1], keepdims=1),
                helper.make_node("ReduceMin", [x], [p + "lo"], axes=[-1], keepdims=1),
                helper.make_node("Neg", [p + "lo"], [p + "neg_lo"]),
                helper.make_node("Max", [p + "hi", p + "neg_lo", eps], [p + "absmax"]),
                helper.make_node("Mul", [p + "absmax", inv127], [p + "scale"]),
                helper.make_node("Reciprocal", [p + "scale"], [p + "inv_scale"]),
                helper.make_node("Mul", [x, p + "inv_scale"], [p + "scaled"]),
                helper.make_node("QuantizeLinear", [p + "scaled", one, zero_point], [p + "q"]),
            ]
            quantized_inputs[x] = p
        p = quantized_inputs[x]
        y = node.output[0]
        nodes += [
            helper.make_node("MatMulIntegerToFloat",
                             [p + "q", wname + "/q", one, wname + "/scale", zero_point, wname + "/zero_point"],
                             [y + "/unscaled"], domain="com.microsoft"),
            helper.make_node("Mul", [y + "/unscaled", p + "scale"], [y]),
        ]
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return count
