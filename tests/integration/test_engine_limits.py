"""Limits decided once: the max batch comes from the model's input and the config
(:func:`edge_vision.model.spec.decide_max_batch`), an engine may only narrow it, and what
``hello`` and ``/metrics`` announce is the engine's value."""

from __future__ import annotations

import dataclasses

import aiohttp
import pytest

from edge_vision.engines import create_engine
from edge_vision.model.spec import ModelSpec, decide_max_batch

from ..support.clients import connect
from ..support.server import make_config, running_server

pytestmark = pytest.mark.timeout(60)


def test_a_dynamic_batch_model_runs_the_configured_max_batch(spec: ModelSpec) -> None:
    assert spec.batch_dim is None  # PP-OCRv6 det exports a symbolic batch dimension
    for configured in (1, 8):
        engine = make_config({"engine": {"max_batch": configured}}).engine
        assert decide_max_batch(spec, engine) == configured


def test_a_static_batch_dimension_caps_the_configured_max_batch(spec: ModelSpec) -> None:
    static = dataclasses.replace(spec, batch_dim=2)
    assert decide_max_batch(static, make_config({"engine": {"max_batch": 8}}).engine) == 2
    assert decide_max_batch(static, make_config({"engine": {"max_batch": 1}}).engine) == 1


def test_an_engine_starts_from_the_decided_value_and_only_narrows_it(spec: ModelSpec) -> None:
    engine = create_engine("onnxruntime", spec, make_config({"engine": {"max_batch": 8}}))
    assert engine.max_batch == 8
    engine.narrow_max_batch(4)  # e.g. a TensorRT profile built for 4
    assert engine.max_batch == 4
    engine.narrow_max_batch(16)  # a backend accepting more never raises it
    assert engine.max_batch == 4
    engine.narrow_max_batch(0)
    assert engine.max_batch == 1


async def test_hello_and_metrics_announce_the_configured_max_batch_whatever_spec_is_shared(
    spec: ModelSpec,
) -> None:
    """One spec (the session fixture) serves servers configured for 1 and for 3: the spec
    carries no max batch of its own that could disagree with the config."""
    for configured in (1, 3):
        config = make_config({"engine": {"max_batch": configured}})
        async with running_server(config, spec) as srv, aiohttp.ClientSession() as s:
            ws, hello = await connect(s, srv.ws_url)
            assert hello["limits"]["max_batch"] == configured
            await ws.close()
            async with s.get(srv.url + "/metrics") as r:
                assert f"edge_vision_engine_max_batch {float(configured)}" in await r.text()
