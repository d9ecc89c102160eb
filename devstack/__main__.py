"""`make run`: the router on the default config behind Envoy, with mock backends, on loopback."""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
from pathlib import Path

from devstack.stack import ROOT, Stack, StackPorts
from devstack.supervisor import RouterSupervisor
from esr_config import load_config


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    parser.add_argument("--config", type=Path, default=ROOT / "router.yaml")
    args = parser.parse_args()

    config = load_config(args.config)
    ports = StackPorts.of_config(config)
    workdir = Path(tempfile.mkdtemp(prefix="semantic-router-"))
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    stack = Stack(workdir, ports, args.config, capture_logs=False)
    print(f"starting: mock backends {ports.backends}, router :{ports.router_grpc}, envoy :{ports.listener}", flush=True)
    with stack:
        print(
            f"\nready. gateway {stack.url}  metrics {stack.metrics_url}  envoy admin http://127.0.0.1:{ports.admin}\n"
            f"try:\n  curl -s {stack.url}/v1/chat/completions -H 'content-type: application/json' \\\n"
            "    -d '{\"model\":\"auto\",\"messages\":[{\"role\":\"user\",\"content\":\"solve 2x + 3 = 7\"}]}' -i\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        # Like the pod: a dead router is restarted with backoff while Envoy keeps serving; Envoy
        # itself is the gateway, so when it exits the stack stops.
        supervisor = RouterSupervisor(stack, say=lambda m: print(m, flush=True))
        while not stop.wait(0.5):
            if stack.envoy.poll() is not None:
                print(f"envoy exited with {stack.envoy.returncode}; stopping", flush=True)
                stop.set()
            else:
                supervisor.poll()
    print("stopped.", flush=True)


if __name__ == "__main__":
    main()
