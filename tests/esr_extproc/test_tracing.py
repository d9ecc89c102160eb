"""The tracing section and what tracing needs (traces themselves go through the real Envoy:
tests/integration/test_tracing.py)."""

from __future__ import annotations

import sys

import pytest

from esr_extproc.tracing import Tracing, TracingConfig, decision_attributes
from esr_settings import ConfigError, SettingError
from router.classifier import Decision


@pytest.mark.parametrize("key,value", [("sample_ratio", 1.5), ("endpoint", "nohost"), ("endpoint", "h:99999")])
def test_bad_settings_name_their_key(key, value):
    with pytest.raises(SettingError) as raised:
        TracingConfig(**{key: value})
    assert raised.value.field == key


def test_without_the_sdk_tracing_is_a_config_error_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ConfigError, match=r"\[tracing\]"):
        Tracing(TracingConfig(enabled=True))


def test_a_decision_becomes_attributes_without_any_text():
    decision = Decision("math", "math-model", 0.61234, "matched", 0.9, "static")
    assert decision_attributes(decision, "auto", "miss") == {
        "gen_ai.request.model": "math-model", "semantic_router.route": "math", "semantic_router.reason": "matched",
        "semantic_router.score": 0.6123, "semantic_router.confidence": 0.9, "semantic_router.tier": "static",
        "semantic_router.requested_model": "auto", "semantic_router.cache": "miss"}


def test_a_clients_model_value_is_cut_in_its_span():
    decision = Decision("general", "general-model", 0.1, "default", 0.5, "")
    attributes = decision_attributes(decision, "m" * 1_000_000, None)
    assert attributes["semantic_router.requested_model"] == "m" * 256


@pytest.mark.slow
def test_every_span_is_bounded_whatever_is_set_on_it():
    from esr_extproc.tracing import ATTRIBUTE_MAX, SPAN_ATTRIBUTES_MAX

    # sampled, exported nowhere (sample ratio 0 would drop the span before its limits apply)
    tracing = Tracing(TracingConfig(enabled=True, sample_ratio=1.0, endpoint="127.0.0.1:9"))
    try:
        with tracing.request(()) as span:
            for i in range(1000):
                span.set_attribute(f"plugin.{i}", i)
            span.set_attribute("plugin.value", "x" * 1_000_000)
        assert len(span.attributes) == SPAN_ATTRIBUTES_MAX
        assert span.attributes["plugin.value"] == "x" * ATTRIBUTE_MAX
    finally:
        tracing.shutdown()
