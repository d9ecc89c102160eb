"""The rooms' import edges point one way (docs/architecture.md): a room imports only the rooms below it."""

from __future__ import annotations

import ast

import pytest

from tests.support import ROOT

# Room -> the rooms it may import. Anything else is an arrow pointing back up, or sideways between
# rooms that should know nothing of each other (the model and the remote engine, say).
ALLOWED = {
    "esr_settings": set(),
    "batching": {"esr_settings"},
    "router": {"batching", "esr_settings"},
    "filters": {"router", "batching", "esr_settings"},
    "esr_cache": {"esr_settings"},
    "esr_extproc": {"esr_cache", "filters", "router", "batching", "esr_settings"},
    "esr_model": {"batching", "esr_settings"},
    "esr_remote": {"batching", "esr_settings"},
    "esr_modelsock": {"batching", "esr_settings"},
    "esr_config": {"router", "esr_cache", "esr_extproc", "esr_model", "esr_remote", "batching", "esr_settings"},
    "esr_tuning": {"esr_cache", "esr_config", "filters", "router", "batching", "esr_settings"},
    "esr_app": {"esr_cache", "esr_config", "esr_extproc", "esr_model", "esr_modelsock", "esr_remote", "esr_tuning", "filters",
                "router", "batching", "esr_settings"},
}


def imported_rooms(room: str) -> dict[str, set[str]]:
    """Room imported -> the files of `room` that import it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / room).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in ALLOWED and top != room:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_room_is_listed():
    rooms = {d.name for d in ROOT.iterdir() if (d / "__init__.py").exists()} - {"tests", "bench"}
    assert rooms == set(ALLOWED), rooms ^ set(ALLOWED)


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_point_down(room):
    wrong = {k: sorted(v) for k, v in imported_rooms(room).items() if k not in ALLOWED[room]}
    assert not wrong, f"{room} imports {wrong}"


# What benches share lives in modules made to be shared; a bench script is never another's library.
BENCH_HELPERS = {"bench.harness", "bench.report", "bench.workloads", "bench.closed_loop", "bench.stub_model"}


def test_no_bench_imports_another_bench():
    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):  # `import bench.x as y` too
                modules = [a.name for a in node.names]
            else:
                continue
            found += [f"{path.relative_to(ROOT)} imports {m}" for m in modules
                      if m.startswith("bench.") and m not in BENCH_HELPERS]
    assert not found, found


def test_the_service_speaks_the_stream_protocol_and_delegates_each_phase():
    service = ROOT / "esr_extproc" / "service.py"
    siblings = {node.module for node in ast.walk(ast.parse(service.read_text()))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("esr_extproc")}
    siblings |= {f"esr_extproc.{a.name}" for node in ast.walk(ast.parse(service.read_text()))
                 if isinstance(node, ast.ImportFrom) and node.module == "esr_extproc" for a in node.names}
    siblings.discard("esr_extproc")
    assert len(service.read_text().splitlines()) <= 200
    assert len(siblings) <= 11, sorted(siblings)  # ten at run time, one for a type
