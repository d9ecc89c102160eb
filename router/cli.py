"""`semantic-router` command line: serve, classify."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path

from router.config import ConfigError, RouterConfig, load_config

DEFAULT_CONFIG = Path(os.environ.get("SEMANTIC_ROUTER_CONFIG", "router.yaml"))


def _load(path: Path) -> RouterConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _with_server_overrides(config: RouterConfig, args: argparse.Namespace) -> RouterConfig:
    overrides = {
        k: v
        for k, v in {
            "grpc_host": args.grpc_host,
            "grpc_port": args.grpc_port,
            "metrics_host": args.metrics_host,
            "metrics_port": args.metrics_port,
            "deadline_ms": args.deadline_ms,
        }.items()
        if v is not None
    }
    return dataclasses.replace(config, server=dataclasses.replace(config.server, **overrides))


def cmd_serve(args: argparse.Namespace) -> int:
    from router.logs import setup_logging
    from router.server import RouterServer

    setup_logging(args.log_level)
    config = _with_server_overrides(_load(args.config), args)
    asyncio.run(RouterServer(config, args.config).run_until_signal())
    return 0


def cmd_classify(args: argparse.Namespace) -> int:
    from router.classifier import RouteClassifier
    from router.encoder import SentenceEncoder
    from router.logs import setup_logging

    setup_logging("warning")
    config = _load(args.config)
    encoder = SentenceEncoder(config.encoder)
    classifier = RouteClassifier(config, encoder.encode)
    for text in args.text:
        decision = classifier.classify(encoder.encode([text])[0])
        if args.json:
            print(json.dumps(dataclasses.asdict(decision)))
        else:
            print(f"route={decision.route} model={decision.model} score={decision.score:.4f} reason={decision.reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semantic-router", description="Semantic router for LLM traffic (Envoy ext_proc).")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the ext_proc gRPC service and /metrics")
    serve.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    serve.add_argument("--grpc-host")
    serve.add_argument("--grpc-port", type=int)
    serve.add_argument("--metrics-host")
    serve.add_argument("--metrics-port", type=int)
    serve.add_argument("--deadline-ms", type=float)
    serve.add_argument("--log-level", default=os.environ.get("SEMANTIC_ROUTER_LOG_LEVEL", "info"))
    serve.set_defaults(func=cmd_serve)

    classify = sub.add_parser("classify", help="print the route chosen for each text")
    classify.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    classify.add_argument("--json", action="store_true")
    classify.add_argument("text", nargs="+")
    classify.set_defaults(func=cmd_classify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
