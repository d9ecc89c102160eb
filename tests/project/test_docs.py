"""The docs hold: every relative link resolves (to a file, and to a heading where it names one), every
`make` target, `semantic-router` command and `python -m` module they name exists, and the README
stays a page a newcomer reads in five minutes."""

from __future__ import annotations

import importlib.util
import fnmatch
import os
import re
from pathlib import Path

import pytest

from esr_app.cli import build_parser
from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 200


def _code(text: str) -> list[str]:
    """What the page shows as code: inline spans and the lines of fenced blocks."""
    fenced = [line for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S) for line in block.splitlines()]
    spans = re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    return [" ".join(span.split()) for span in spans] + fenced


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z0-9][a-z0-9._-]*):", (ROOT / "Makefile").read_text(), re.M))


def _commands() -> set[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(sub.choices)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_resolves(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^(https?:|mailto:)", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{_name(page)}: links to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_command_named_exists(page):
    targets, commands, missing = _make_targets(), _commands(), []
    for code in _code(page.read_text()):
        for target in re.findall(r"(?:^|[;&|(]\s*|\s)make ((?:[a-z0-9][a-z0-9._-]*\s*)+)", code):
            missing += [f"make {t}" for t in target.split() if "=" not in t and t not in targets]
        for command in re.findall(r"semantic-router ([a-z][a-z-]+)", code):
            if command not in commands:
                missing.append(f"semantic-router {command}")
        for module in re.findall(r"python -m ([A-Za-z_][\w.]*)", code):
            if module.split(".")[0] not in ("pip", "venv", "pytest") and importlib.util.find_spec(module) is None:
                missing.append(f"python -m {module}")
    assert not missing, f"{_name(page)} names what does not exist: {sorted(set(missing))}"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    first = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first is not None and [line.split()[:2] for line in first.group(1).splitlines()] == [["make", "run"],
                                                                                               ["make", "test"]]


def test_every_docs_page_is_reachable_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in re.findall(r"\]\((docs/[^)\s]+)\)", readme)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")} | {(ROOT / "docs/gateways/README.md").resolve()}
    assert not pages - linked, sorted(str(p.relative_to(ROOT)) for p in pages - linked)


# Where code, manifests and config comments point a reader at the docs.
REFERRING = ("*.py", "*.yaml", "*.yml", "*.sh", "*.toml", "*.json", "Makefile", "Dockerfile")
NOT_OURS = ("build", ".venv", "node_modules", ".git")
CACHES = {".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".gpu", ".infinity_cache", "__pycache__"}


def _referring_files() -> list[Path]:
    """The tree's own files; what is not ours (.venv, build) is never walked into."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(NOT_OURS) and d not in CACHES and "egg-info" not in d]
        found += [Path(folder) / f for f in files if any(fnmatch.fnmatch(f, pattern) for pattern in REFERRING)]
    return sorted(found)


def test_every_docs_reference_in_the_tree_resolves():
    broken = []
    for path in _referring_files():
        for target in re.findall(r"(?<![\w/])docs/[A-Za-z0-9_./-]*[A-Za-z0-9_/](?:#[A-Za-z0-9_-]+)?",
                                 path.read_text(errors="replace")):
            page, _, anchor = target.partition("#")
            file = ROOT / page
            if not file.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, f"references to docs that do not exist: {broken}"
