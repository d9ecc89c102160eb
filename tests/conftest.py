"""Settings for every test session; fixtures live beside the tests that use them, helpers in
tests/support.

A test that starts a process or a real tool (Envoy, the router, the CLI, a worker process,
kustomize, promtool, Infinity), in its body or in a fixture set up for it, carries the `processes`
marker, so `make test-fast` can leave it out; one that starts one unmarked fails, so the fast lane
cannot quietly come to depend on tools or grow slow."""

import multiprocessing.process
import os
import subprocess

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_running: list = [None]  # the test item being set up, run or torn down


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.processes)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running[0] = item
    try:
        yield
    finally:
        _running[0] = None


def _marked_only(start):
    def guarded(self, *args, **kwargs):
        item = _running[0]
        if item is not None and item.get_closest_marker("processes") is None:
            raise AssertionError(f"{item.nodeid} starts a process: mark it @pytest.mark.processes")
        return start(self, *args, **kwargs)
    return guarded


subprocess.Popen._execute_child = _marked_only(subprocess.Popen._execute_child)
multiprocessing.process.BaseProcess.start = _marked_only(multiprocessing.process.BaseProcess.start)
