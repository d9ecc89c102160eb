"""Structured (one JSON object per line), quiet-by-default logging."""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _ProcessName(logging.Filter):
    """Names the pool process (model | worker-N) on every line: a pool's children share stderr."""

    def __init__(self, name: str):
        super().__init__()
        self.name_ = name

    def filter(self, record: logging.LogRecord) -> bool:
        record.process_name = self.name_
        return True


def setup_logging(level: str = "info", process: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    if process is not None:
        handler.addFilter(_ProcessName(process))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries chat at INFO about things an operator does not need per start.
    for noisy in ("sentence_transformers", "transformers", "httpx", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
