"""Serve a checkpoint over the OpenAI API: completions, chat completions, streaming, logprobs.

    uv run serve.py runs/tiny                                   # http://127.0.0.1:8000/v1, model name "tiny"
    uv run serve.py runs/tiny-instruct --port 8001 --model-name instruct   # chat in a browser: http://127.0.0.1:8001/
    uv run serve.py runs/gpt2 --host 0.0.0.0 --api-key "$KEY"   # beyond this machine: a key is required
    uv run serve.py runs/tiny --max-batch 16 --max-queue 64     # rows decoded together; requests that may wait

    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "tiny", "prompt": "Every effort moves you", "max_tokens": 20, "temperature": 0}'

One engine thread decodes the requests together in a KV cache of --max-batch rows. SIGTERM or
Ctrl-C: waiting requests get 503, those in flight get --shutdown-grace seconds, exit 0. The
endpoints, parameters and errors: docs/serving.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path

from jaxgpt import caches
from jaxgpt.checkpoints.layout import CheckpointError
from jaxgpt.cli import command_parser, refuse
from jaxgpt.config import ConfigError
from jaxgpt.conversations.template import TemplateError
from jaxgpt.data.tokenizer import TokenizerError

API_KEY_ENV = "JAXGPT_API_KEY"


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(__doc__)
    parser.add_argument("checkpoint", type=Path, help="run dir, checkpoint folder or latest/best link")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s, this machine only; any other needs --api-key)",
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default: %(default)s; 0: any free one)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require `Authorization: Bearer KEY` on every request but /health (default: ${API_KEY_ENV})",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=16,
        help="rows of the KV cache: answers decoded together (default: %(default)s)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a row; more are answered 503 (default: %(default)s)",
    )
    parser.add_argument("--model-name", default=None, help="the name clients ask for (default: the run's folder name)")
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="larger request bodies are refused with 413 (default: %(default)s, 4 MiB)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="on SIGTERM or Ctrl-C, seconds the answers in flight may run on (default: %(default)s)",
    )
    return parser


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line (None: nothing)."""
    if args.max_batch < 1:
        return f"--max-batch={args.max_batch} must be >= 1"
    if args.max_queue < 0:
        return f"--max-queue={args.max_queue} must be >= 0"
    if args.max_request_bytes < 1024:
        return f"--max-request-bytes={args.max_request_bytes} must be >= 1024"
    if not args.shutdown_grace >= 0:
        return f"--shutdown-grace={args.shutdown_grace} must be >= 0"
    if not 0 <= args.port <= 65535:
        return f"--port={args.port} must be in 0..65535"
    if args.api_key is not None and not args.api_key.strip():
        return "--api-key is empty"
    if args.api_key is None and not _is_local(args.host):
        return (
            f"--host {args.host} serves beyond this machine: give --api-key KEY (or ${API_KEY_ENV}), "
            f"or listen on 127.0.0.1"
        )
    return None


def _bind(host: str, port: int) -> socket.socket:
    """The listening address, bound before the model loads: a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    return sock


class _Stop:
    """SIGTERM from the start: a request to stop, never a kill (exit 0 whenever it comes); uvicorn takes the
    signals over once it serves, and puts this back when it is done."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, _sig: int, _frame: object) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._handle)  # the shutdown that follows must not be a KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = _check(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        sock = _bind(args.host, args.port)
    except OSError as e:
        return refuse(e)
    stop = _Stop()
    print(f"Loading {args.checkpoint} ...", flush=True)
    caches.enable_compile_cache()
    from jaxgpt.serving import api  # JAX and the web stack load here, after the checks

    try:
        served = api.load(
            args.checkpoint, model_name=args.model_name, max_batch=args.max_batch, max_queue=args.max_queue
        )
        warm_s = served.worker.start()
    except (ConfigError, CheckpointError, TokenizerError, TemplateError) as e:
        return refuse(e)
    except KeyboardInterrupt:  # Ctrl-C while loading or compiling: nothing is served yet
        print("interrupted before serving", file=sys.stderr)
        return 130
    host, port = sock.getsockname()[:2]
    chat = f"chat template {served.template.name!r}" if served.template else "a base model: no chat"
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    line = (
        f"Serving {served.name!r} from {served.where} ({chat}; context {served.context}, {args.max_batch} rows, "
        f"compiled in {warm_s:.1f} s) at {url}/v1 (in a browser: {url}/)"
    )
    signal.signal(signal.SIGINT, stop._handle)  # from here a Ctrl-C stops the server as SIGTERM does
    if stop.requested:
        print("stopped before serving (SIGTERM)", flush=True)
        return 0
    api.run(
        served,
        sock,
        args.api_key,
        grace=args.shutdown_grace,
        max_request_bytes=args.max_request_bytes,
        announce=lambda: print(line, flush=True),  # once the socket accepts connections
        stopped=lambda: stop.requested,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
