"""A third-party filter, pip-installed, found through the `semantic_router.filters` entry point."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from filters.chain import available_filters
from tests.support import ROOT
from tests.support.extproc import CONFIG, Harness, body_msg, chat, headers_msg, set_headers


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(ROOT / "examples" / "filter_plugin")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))


@pytest.mark.processes  # its fixture installs the example plugin with pip
def test_plugin_is_discovered_and_runs_in_the_chain(installed_plugin):
    assert "team_header" in available_filters()
    cfg = {**CONFIG, "filters": ["team_header", "model_policy", "semantic_route"],
           "filter_settings": {"team_header": {"default_team": "platform"}}}

    async def main():
        async with Harness(cfg) as h:
            _, resp = await h.exchange(headers_msg(extra=[("authorization", "Bearer search-abc123")]),
                                       body_msg(chat("solve 3x + 5 = 20")))
            hs = set_headers(resp)
            assert hs["x-team"] == "search"
            assert hs["x-semantic-route"] == "math"
            _, resp = await h.exchange(headers_msg(), body_msg(chat("hello")))
            assert set_headers(resp)["x-team"] == "platform"

    asyncio.run(main())
