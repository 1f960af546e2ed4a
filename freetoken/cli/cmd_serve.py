"""ft serve: OpenAI and Anthropic APIs over a model (default: the shipped demo model) on 127.0.0.1:1919."""

from __future__ import annotations

import argparse
from pathlib import Path

from freetoken.cli.common import LazyChoices, add_placement_args, add_policy_args, add_size_args
from freetoken.kv_dtype import KV_DTYPE_HELP
from freetoken.quant.head import HEAD_HELP
from freetoken.serve.config import (BACKENDS, DEFAULT_HOST, DEFAULT_MAX_BODY_MB, DEFAULT_MAX_RUNNING, DEFAULT_PORT,
                                    ServeConfig)


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over the OpenAI and Anthropic HTTP APIs")
    p.add_argument("--model", type=Path, help="checkpoint directory (default: the shipped demo model)")
    p.add_argument("--served-name", help="model id clients ask for (default: the directory name)")
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port (printed on the ready line)")
    p.add_argument("--backend", default="engine", choices=BACKENDS,
                   help="engine: freetoken's expert-offloading engine; hf: transformers (reference)")
    p.add_argument("--max-running", type=int, default=DEFAULT_MAX_RUNNING,
                   help=f"requests generating at once, decoded as one batch (default {DEFAULT_MAX_RUNNING})")
    p.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond those (then 503)")
    p.add_argument("--kv-floor", type=int, help="KV tokens reserved before any expert slot "
                                                "(default: min(context, 32768))")
    p.add_argument("--device-budget", type=float, dest="device_budget_gb",
                   help="GiB of device memory to plan against (default: the GPU's; on CPU, half the free RAM)")
    p.add_argument("--prefix-cache-tokens", type=int, help="KV tokens kept for prefix reuse (default: the plan's KV)")
    p.add_argument("--max-context", type=int, help="context length (default: the model's)")
    p.add_argument("--kv-dtype", default="auto", help=KV_DTYPE_HELP)
    p.add_argument("--lm-head", default="checkpoint", help=HEAD_HELP)
    add_policy_args(p, online=True, future=False)
    add_size_args(p, "what the memory plan leaves after dense weights and the KV floor")
    p.add_argument("--split", metavar="MODE", choices=LazyChoices("freetoken.calibrate.mode", "SPLIT_MODES"),
                   help="miss split: auto (the default: offload; hybrid only when `ft bench bw` recommended it on "
                        "this machine), offload, hybrid, cpu (the default with --cpu-moe / --n-cpu-moe)")
    add_placement_args(p)
    p.add_argument("--threads", type=int, help="CPU threads of the CPU lane and torch (default: torch's)")
    p.add_argument("--api-key", help="clients must send it (Authorization: Bearer or x-api-key) on /v1/... (vLLM's "
                                     "rule: /health, /metrics, /version, /tokenize stay open); default: "
                                     "$FT_API_KEY, else no key")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_MB,
                   help=f"largest request body in MB, larger ones get 413 (default {DEFAULT_MAX_BODY_MB:g})")
    p.add_argument("--tool-parser", default="auto", help="tool-call format: auto (the model family's), hermes, "
                                                         "harmony, deepseek, mistral, glm")
    p.add_argument("--reasoning-parser", default="auto", help="reasoning format: auto (the model family's), think, "
                                                              "harmony, none")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a request's own chat_template (vLLM's flag; a template is code the server renders)")
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    from freetoken.cli.common import policy_from_args

    policy, options = policy_from_args(args)
    split = args.split or ("cpu" if args.cpu_moe or args.n_cpu_moe is not None else "auto")
    given = {f: getattr(args, f) for f in ServeConfig.__dataclass_fields__ if hasattr(args, f)}  # flags = fields
    return ServeConfig(**{**given, "policy": policy, "policy_options": options, "profile": args.profile_trace,
                          "split": split})


def check_small_files(cfg: ServeConfig) -> None:
    """What the checkpoint's small files decide, before its weights load: --n-cpu-moe against config.json's MoE
    layers, generation_config.json's sampling defaults (each error names its file)."""
    from freetoken.cli.common import check_cpu_moe
    from freetoken.engine.sampling import load_generation_defaults
    from freetoken.serve.startup import resolve_model

    model_dir, _ = resolve_model(cfg)
    check_cpu_moe(cfg.policy_options, model_dir)
    load_generation_defaults(model_dir)


SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client", "xgrammar", "psutil")  # the [serve] extra


def check_serve_extra() -> None:
    """`pip install freetoken` without [serve]: one line saying what to install, not an import traceback."""
    import importlib.util

    missing = [m for m in SERVE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"ft serve needs {', '.join(missing)}: pip install 'freetoken[serve]'")


def setup_logging() -> None:
    """The access log and request warnings on stderr (whatever sys.stderr is when a line is written), one line
    each; once per process."""
    import logging
    import sys

    class Stderr(logging.StreamHandler):
        def emit(self, record):
            self.stream = sys.stderr
            super().emit(record)

    root = logging.getLogger("freetoken")
    if not any(isinstance(h, logging.StreamHandler) and type(h).__name__ == "Stderr" for h in root.handlers):
        handler = Stderr()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def warn_open_host(cfg: ServeConfig) -> None:
    import ipaddress
    import sys

    try:
        loopback = ipaddress.ip_address(cfg.host).is_loopback
    except ValueError:
        loopback = cfg.host == "localhost"
    if not loopback and not cfg.resolved_api_key:
        print(f"warning: listening on {cfg.host} without --api-key: anyone who can reach this port can use the "
              f"model", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    check_serve_extra()
    cfg = config_from_args(args)
    from freetoken.serve.app import build_app
    from freetoken.serve.server import Server
    from freetoken.serve.startup import build_service, load

    check_small_files(cfg)
    warn_open_host(cfg)
    backend, _ = load(cfg)
    service = build_service(backend, cfg)
    server = Server(build_app(service, cfg), cfg.host, cfg.port)
    setup_logging()
    try:
        server.serve_forever()
    finally:
        service.shutdown()
    return 0
