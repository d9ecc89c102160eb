"""The bundled model through the real encoder and batcher: loading, numerics, and routing quality."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import numpy as np
import pytest

from batching import BatcherSettings, ContinuousBatcher
from router.classifier import RouteClassifier
from esr_config import EncoderConfig, load_config
from esr_model.encoder import SentenceEncoder
from esr_model.location import resolve_model
from tests.support import ROOT

PROMPTS = {
    "math": ["what is 2+2 times 7", "What is the derivative of x^3?", "solve for y: 2y - 4 = 10", "how much is 12 squared"],
    "code": ["my python script raises KeyError", "Write a Python function to check if a string is a palindrome",
             "how do I write a for loop in rust"],
    "general": ["hello, how are you today?", "what's the weather like in paris", "recommend a good book about history",
                "how do I make pancakes"],
}


@pytest.fixture(scope="module")
def encoder():
    return SentenceEncoder(EncoderConfig(device="cpu"))


def test_bundled_model_resolves_to_package_weights():
    path = resolve_model("bundled:all-MiniLM-L6-v2")
    assert path.endswith("model") and (ROOT / path).exists()
    assert resolve_model(str(ROOT)) == str(ROOT)  # a local directory, as it is
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    for missing in ("/some/local/dir", "./fitted.model", "../models/x"):  # never a silent hub download
        with pytest.raises(ValueError, match="is not a model directory"):
            resolve_model(missing)
    with pytest.raises(ValueError, match="no bundled model"):
        resolve_model("bundled:nope")


@pytest.mark.slow  # the torch runtime loaded (seconds): the CPU default is ONNX Runtime
def test_embeddings_are_normalised_and_truncated(encoder):
    out = encoder.encode(["short", "word " * 5000])
    assert out.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert len(encoder.tokenize(["word " * 5000])[0]) == encoder.max_seq_length


@pytest.mark.slow
def test_batched_equals_single_through_the_batcher(encoder):
    texts = [p for ps in PROMPTS.values() for p in ps] + ["a much longer prompt " * 20]
    singles = np.stack([encoder.embed(encoder.tokenize([t]))[0] for t in texts])

    async def main():
        b = ContinuousBatcher(encoder, BatcherSettings(max_batch_size=64))
        b.start()
        out = await asyncio.gather(*(b.embed(t, time.monotonic() + 60) for t in texts))
        await b.aclose()
        return np.stack(out)

    batched = asyncio.run(main())
    np.testing.assert_allclose(batched, singles, atol=1e-5, rtol=0)


@pytest.mark.slow  # the torch runtime loaded (seconds): the CPU default is ONNX Runtime
def test_shipped_config_routes_sample_prompts(encoder):
    config = load_config(ROOT / "router.yaml")
    classifier = RouteClassifier(config, encoder.encode)
    for route, prompts in PROMPTS.items():
        for p in prompts:
            assert classifier.classify(encoder.encode([p])[0]).route == route, p


@pytest.mark.processes
def test_classify_cli_prints_route():
    out = subprocess.run(
        [sys.executable, "-m", "esr_app", "classify", "--config", str(ROOT / "router.yaml"), "solve 2x + 3 = 7"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("route=math model=math-model score=")


@pytest.mark.processes
def test_cli_reports_config_errors_by_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: []\ndefault_route: {name: g, model: m}\n")
    out = subprocess.run([sys.executable, "-m", "esr_app", "classify", "--config", str(bad), "x"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2
    assert "routes: needs at least one route" in out.stderr


@pytest.mark.slow  # the torch runtime loaded (seconds): the CPU default is ONNX Runtime
def test_cpu_bf16_stays_close_to_fp32(encoder):
    bf16 = SentenceEncoder(EncoderConfig(device="cpu", cpu_bf16=True))
    texts = [p for ps in PROMPTS.values() for p in ps]
    cos = np.sum(bf16.encode(texts) * encoder.encode(texts), axis=1)
    assert cos.min() > 0.98, cos.min()


@pytest.mark.slow  # the torch runtime loaded (seconds): the CPU default is ONNX Runtime
def test_torchscript_graph_matches_the_eager_model(encoder):
    assert encoder._traced is not None  # the bundled model traces
    eager = SentenceEncoder(EncoderConfig(device="cpu", torchscript=False))
    assert eager._traced is None
    texts = ["hi", "solve 2x + 3 = 7", "a much longer prompt about routing " * 30, "x y z"]
    np.testing.assert_allclose(encoder.encode(texts), eager.encode(texts), atol=1e-5)
