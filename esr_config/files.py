"""Reading a config file into a RouterConfig and writing one back: `write_config` is `load_config`'s
inverse (tests/esr_config/test_config.py round-trips it), the only writer `fit` uses."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import yaml

from esr_config.schema import RouterConfig
from esr_settings import ConfigError, build, dump, replace_at

__all__ = ["leading_comments", "load_config", "load_or_exit", "parse_config", "write_config"]


def parse_config(data: object, source: str = "config") -> RouterConfig:
    try:
        return build(RouterConfig, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_or_exit(path: Path) -> RouterConfig:
    """load_config for a command line: a bad config is one line on stderr and exit status 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def load_config(path: str | Path) -> RouterConfig:
    """Relative file references in the config (classifier.head_path, selection.path, a model directory
    beside it in encoder.model) resolve against its folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    config = parse_config(data, str(path))
    model = config.encoder.model
    if not model.startswith("bundled:") and not Path(model).is_absolute() and (path.parent / model).is_dir():
        # A model directory written beside the config (fit --finetune) is found from anywhere.
        config = replace_at(config, "encoder.model", str((path.parent / model).resolve()))
    for key, value in (("classifier.head_path", config.classifier.head_path), ("selection.path", config.selection.path)):
        if value is not None and not Path(value).is_absolute():
            config = replace_at(config, key, str((path.parent / value).resolve()))
    return config


def write_config(config: RouterConfig, path: str | Path, header: str = "") -> None:
    """Writes what `load_config(path)` reads back as `config`: keys at their defaults left out, files
    in path's folder (a fitted head, a fine-tuned model) named relative to it, `header` (comment
    lines: a data set's credit, say) first. Comments elsewhere in a source file are not kept."""
    path = Path(path)
    folder = path.parent.resolve()
    for key, value in (("encoder.model", config.encoder.model), ("classifier.head_path", config.classifier.head_path),
                       ("selection.path", config.selection.path)):
        if value is not None and Path(value).is_absolute() and Path(value).parent == folder:
            config = replace_at(config, key, Path(value).name)
    path.write_text(header + yaml.safe_dump(dump(config), sort_keys=False, allow_unicode=True), encoding="utf-8")


def leading_comments(path: str | Path) -> str:
    """The comment lines a config file starts with, for `write_config` to carry over."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return "".join(line + "\n" for line in itertools.takewhile(lambda line: line.startswith("#"), lines))
