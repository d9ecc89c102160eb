"""`semantic-router` command line: the parser, and serve, model-server, health, envoy-config and export (classify, eval and fit: quality_cli)."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
import sys
from pathlib import Path

from esr_settings import replace_at
from esr_app import event_loop, selection_cli
from esr_config import ConfigError, RouterConfig, load_or_exit

DEFAULT_CONFIG = Path(os.environ.get("SEMANTIC_ROUTER_CONFIG", "router.yaml"))


def _offline(name: str):
    """An offline command (esr_app.quality_cli), imported when it runs: serving imports no tuning code."""
    def run(args: argparse.Namespace) -> int:
        from esr_app import quality_cli

        return getattr(quality_cli, name)(args)
    return run


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
    return replace_at(config, "server", **overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    from esr_app import pool
    from esr_app.logs import setup_logging
    from esr_app.server import PortInUse, RouterServer

    setup_logging(args.log_level)
    from_file = load_or_exit(args.config)
    config = _with_server_overrides(from_file, args)
    if args.workers is not None:
        config = replace_at(config, "server", workers=args.workers if args.workers == "auto" else int(args.workers))
    if args.model_socket is not None:
        config = replace_at(config, "encoder", socket=args.model_socket)
    workers = pool.resolve_workers(config)
    try:
        if workers > 1:
            return pool.WorkerPool(config, args.config, workers, args.log_level).run()
        event_loop.run(RouterServer(config, args.config, file_config=from_file).run_until_signal(),
                       config.server.event_loop)
    except (PortInUse, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _share_flag(value: str) -> float | None:
    if value == "data":
        return None
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 < share < 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, or data, got {value!r}")
    return share


def _workers_flag(value: str) -> str:
    if value == "auto" or (value.isdigit() and 1 <= int(value) <= 64):
        return value
    raise argparse.ArgumentTypeError(f"expected auto or a number from 1 to 64, got {value!r}")


def cmd_model_server(args: argparse.Namespace) -> int:
    """The model process alone, for front ends in other processes or pods (encoder.socket)."""
    from prometheus_client import start_http_server

    from esr_app.logs import setup_logging
    from esr_app.model_process import ModelProcess
    from esr_modelsock.server import SocketInUse

    setup_logging(args.log_level, process="model")
    config = load_or_exit(args.config)
    if args.device:
        config = replace_at(config, "encoder", device=args.device)
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr=args.metrics_host)
    try:
        event_loop.run(ModelProcess(config, args.socket).run_until_signal(), config.server.event_loop)
    except SocketInUse as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    """For exec probes: the router's gRPC port listens on loopback only, out of kubelet's reach.
    --socket asks a model process instead (it listens only once warm)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if args.socket:
        return _model_health(args.socket, args.timeout)
    try:
        with grpc.insecure_channel(args.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                               timeout=args.timeout)
    except grpc.RpcError as exc:
        print(f"unhealthy: {exc.code().name}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    # --answering: the router answers (NOT_SERVING included: it falls back while its model
    # process is away), which is what liveness asks.
    return 0 if status == "SERVING" or args.answering else 1


def _model_health(path: str, timeout: float) -> int:
    import socket

    from esr_modelsock import wire

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            reader, frames = wire.FrameReader(), list[tuple[int, bytes]]()
            while not frames:
                data = s.recv(65536)
                if not data:
                    raise ConnectionError("closed before hello")
                frames = reader.feed(data)
    except (OSError, wire.ProtocolError) as exc:
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    kind, payload = frames[0]
    if kind != wire.HELLO:
        print("unhealthy: not a model process", file=sys.stderr)
        return 1
    print(f"SERVING {payload.decode()}")
    return 0


_BACKEND_FLAG = re.compile(r"^(?P<model>[^=]+)=(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+)):(?P<port>\d+)"
                           r"(?::(?P<tls>tls)(?:=(?P<sni>[^:]+))?)?$")


def _backend_flag(value: str):
    """MODEL=HOST:PORT[:tls[=SNI]]; an IPv6 HOST in brackets ([::1]:8000)."""
    from esr_extproc.config import BackendConfig

    m = _BACKEND_FLAG.match(value)
    try:
        if m is None:
            raise ValueError(value)
        if m["v6"]:
            ipaddress.IPv6Address(m["v6"])
        return BackendConfig(model=m["model"], address=m["v6"] or m["host"], port=int(m["port"]),
                             tls=bool(m["tls"]), sni=m["sni"])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MODEL=HOST:PORT[:tls[=SNI]] (IPv6 as [ADDR]), got {value!r}") from None


def cmd_envoy_config(args: argparse.Namespace) -> int:
    from esr_app.envoy_config import render_yaml

    config = load_or_exit(args.config)
    overrides = {k: v for k, v in {"listen_address": args.listen_address, "listen_port": args.listen_port,
                                   "admin_port": args.admin_port, "router_address": args.router_address}.items()
                 if v is not None}
    config = replace_at(config, "envoy", **overrides)
    if args.backend:
        given = {b.model: b for b in args.backend}
        kept = tuple(b for b in config.backends if b.model not in given)
        config = dataclasses.replace(config, backends=kept + tuple(given.values()))
    try:
        text = render_yaml(config)
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """The ONNX export of the config's encoder model (encoder.backend onnx), made once per weights."""
    from esr_model.location import resolve_model

    config = load_or_exit(args.config)
    if config.encoder.remote is not None or config.encoder.socket is not None:
        print("nothing to export: the encoder is a remote engine or a model process", file=sys.stderr)
        return 0
    try:
        from esr_model.export import ensure_export
    except ImportError:
        print("export needs torch and sentence-transformers (pip install 'semantic-router[torch]')", file=sys.stderr)
        return 2
    path, made = ensure_export(resolve_model(config.encoder.model), force=args.force)
    print(f"{'exported' if made else 'up to date'}: {path}")
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
    serve.add_argument("--workers", type=_workers_flag, help="auto or N: overrides server.workers")
    serve.add_argument("--model-socket", help="embed through the model process on this socket: overrides encoder.socket")
    serve.add_argument("--log-level", default=os.environ.get("SEMANTIC_ROUTER_LOG_LEVEL", "info"))
    serve.set_defaults(func=cmd_serve)

    ms = sub.add_parser("model-server", help="run only the model process, serving embeddings on a Unix socket")
    ms.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ms.add_argument("--socket", required=True, help="the path front ends name as encoder.socket")
    ms.add_argument("--device", help="overrides encoder.device")
    ms.add_argument("--metrics-host", default="127.0.0.1")
    ms.add_argument("--metrics-port", type=int, help="serve /metrics here (default: none)")
    ms.add_argument("--log-level", default=os.environ.get("SEMANTIC_ROUTER_LOG_LEVEL", "info"))
    ms.set_defaults(func=cmd_model_server)

    ex = sub.add_parser("export", help="export the config's encoder model to ONNX (encoder.backend onnx): "
                        "once per model weights, into the model's own directory")
    ex.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ex.add_argument("--force", action="store_true", help="export even if the existing one is current")
    ex.set_defaults(func=cmd_export)

    classify = sub.add_parser("classify", help="print the route chosen for each text")
    classify.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    classify.add_argument("--json", action="store_true")
    classify.add_argument("text", nargs="+")
    classify.set_defaults(func=_offline("cmd_classify"))

    ev = sub.add_parser("eval", help="routing quality on labelled JSONL: {text, label} per line, or "
                        "conversations {messages, labels} scored per user turn")
    ev.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ev.add_argument("--data", type=Path, required=True)
    ev.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    ev.add_argument("--html", type=Path, help="also write the report as a page: confusion heat map, score "
                    "distributions per route")
    ev.set_defaults(func=_offline("cmd_eval"))

    ft = sub.add_parser("fit", help="tune thresholds (and top-k or a trained head) on labelled JSONL; "
                        "on conversations also the conversation gate")
    ft.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ft.add_argument("--data", type=Path, help="labelled JSONL (required unless --from-records)")
    ft.add_argument("--out", type=Path, required=True, help="where to write the tuned config")
    ft.add_argument("--head", action="store_true", help="train a linear head on the data and use it")
    ft.add_argument("--head-score", choices=("auto", "probability", "energy"), default="auto",
                    help="with --head: classifier.head_score; auto keeps the one that does better on the held-out "
                    "examples")
    ft.add_argument("--top-k", action=argparse.BooleanOptionalAction, default=True,
                    help="similarity method: also choose top_k (on by default; with 10 examples per intent on "
                    "CLINC150, top-5 mean against top-1 raised val accuracy at a 20%% default share 0.89 -> 0.92)")
    ft.add_argument("--objective", default="shifted", metavar="{shifted,accuracy,balanced}",
                    help="shifted: accuracy as if a fifth of the traffic were the default route's (holds when "
                    "out-of-scope traffic grows); accuracy: at the data's own mix; balanced: mean of in-scope "
                    "accuracy and default-route recall")
    ft.add_argument("--min-default-recall", type=float, default=0.0,
                    help="keep default-route recall at least this on the tuning data")
    ft.add_argument("--finetune", action="store_true",
                    help="first fine-tune the encoder on the in-scope examples (their intents when every line has "
                    "one); saved as OUT's name with .model, which the written config names")
    ft.add_argument("--finetune-epochs", type=float, default=1.0)
    ft.add_argument("--confidence-default-share", type=_share_flag, default=None, metavar="SHARE",
                    help="calibrate x-semantic-route-confidence for traffic of which this share belongs to the "
                    "default route, as the shifted objective assumes (default 0.2), or `data` for the data's own "
                    "mix (also what data with no default-route examples gets)")
    ft.add_argument("--guard-fpr", type=float, default=0.01, metavar="RATE",
                    help="guard data: the threshold lets at most this share of allowed requests be blocked (default 0.01)")
    ft.add_argument("--shared-threshold", action="store_true", help="one threshold for all routes (less overfitting)")
    ft.add_argument("--static-only", action="store_true",
                    help="fit only the cascade's static tier (static_tier) to the config's encoder decisions; a "
                    "similarity config takes any {text} lines, labelled or not, as traffic")
    ft.add_argument("--from-records", type=Path, action="append", metavar="FILE",
                    help="refit the static tier on the encoder's own decisions of recorded requests (records.prompts); "
                    "repeatable; labelled --data, when given, counts too and keeps its labels")
    ft.add_argument("--held-out", type=float, default=0.2, metavar="SHARE",
                    help="with --from-records: the share of records (by a hash of their texts) kept to judge the refit")
    ft.add_argument("--max-disagreement", type=float, default=0.005, metavar="SHARE",
                    help="with --from-records: the share of held-out records on which the cascade may decide "
                    "otherwise than the encoder alone")
    ft.add_argument("--report", type=Path, metavar="JSON",
                    help="with --from-records: the held-out figures, before and after, as JSON")
    ft.set_defaults(func=_offline("cmd_fit"))

    selection_cli.add_parser(sub)

    rp = sub.add_parser("replay", help="decide recorded requests (records.prompts) again with a candidate config "
                        "and report what would change; exit 3 past a budget (a CI gate for config changes)")
    rp.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the candidate config")
    rp.add_argument("--records", type=Path, required=True, help="a decision-record file (JSONL)")
    rp.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    rp.add_argument("--max-changed", type=float, metavar="SHARE",
                    help="exit 3 when more than this share of the decisions would move to another route")
    rp.add_argument("--max-cost-change", type=float, metavar="SHARE",
                    help="exit 3 when the prompt cost at the config's prices would change by more than this share")
    rp.set_defaults(func=_offline("cmd_replay"))

    ec = sub.add_parser("envoy-config", help="render the Envoy bootstrap for this router config")
    ec.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ec.add_argument("--out", type=Path, help="file to write (default: stdout)")
    ec.add_argument("--listen-address")
    ec.add_argument("--listen-port", type=int)
    ec.add_argument("--admin-port", type=int)
    ec.add_argument("--router-address", help="where Envoy reaches the router (default 127.0.0.1)")
    ec.add_argument("--backend", "--backends", action="append", type=_backend_flag, metavar="MODEL=HOST:PORT[:tls[=SNI]]",
                    help="set a backend model's address (repeatable); overrides the config's backends")
    ec.set_defaults(func=cmd_envoy_config)

    hc = sub.add_parser("health", help="exit 0 if the router on ADDRESS reports SERVING (a container probe)")
    hc.add_argument("--address", default="127.0.0.1:50051")
    hc.add_argument("--timeout", type=float, default=2.0)
    hc.add_argument("--answering", action="store_true", help="also exit 0 on NOT_SERVING: the router answers (liveness)")
    hc.add_argument("--socket", help="check the model process on this Unix socket instead")
    hc.set_defaults(func=cmd_health)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
