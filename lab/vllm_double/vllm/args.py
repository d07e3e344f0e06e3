"""`vllm serve` command line: the flags spark-vllm passes, spelled as vLLM spells them.

Anything else is refused by argparse (exit 2), as real vLLM refuses unknown flags.
"""

import argparse
import re

from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

_KV_CACHE_DTYPES = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]
_DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
_EXECUTOR_BACKENDS = ["ray", "mp", "uni", "external_launcher"]
_UVICORN_LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]


def _human_int(text: str) -> int:
    """vLLM accepts sizes like 32768, 32k or 1M for token counts."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size: {text!r}")
    number, suffix = match.groups()
    factor = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3}[suffix.lower()]
    if suffix.isupper():
        factor = {"K": 1024, "M": 1024**2, "G": 1024**3}[suffix]
    return int(float(number) * factor)


def _dashed(argv):
    """vLLM's FlexibleArgumentParser also takes --max_model_len for --max-model-len."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        out.append(arg)
    return out


def build_parser():
    """Returns (top-level parser, the `serve` sub-parser)."""
    parser = argparse.ArgumentParser(prog="vllm", allow_abbrev=False,
                                     description="vLLM test double (spark-vllm lab)")
    parser.add_argument("-v", "--version", action="store_true", help="show the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="{serve}")
    serve = commands.add_parser("serve", allow_abbrev=False,
                                help="start the OpenAI-compatible server (double)")
    serve.add_argument("model_tag", help="model directory or Hugging Face repo id (offline cache)")

    server = serve.add_argument_group("server")
    server.add_argument("--host", default="0.0.0.0")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--api-key", default=None)
    server.add_argument("--served-model-name", nargs="+", default=None)
    server.add_argument("--uvicorn-log-level", choices=_UVICORN_LOG_LEVELS, default="info")
    server.add_argument("--disable-uvicorn-access-log", action="store_true")
    server.add_argument("--disable-log-requests", action="store_true")
    server.add_argument("--disable-log-stats", action="store_true")

    model = serve.add_argument_group("model")
    model.add_argument("--max-model-len", type=_human_int, default=None)
    model.add_argument("--dtype", choices=_DTYPES, default="auto")
    model.add_argument("--trust-remote-code", action="store_true")
    model.add_argument("--load-format", choices=sorted(_LOAD_FORMAT_TO_MODEL_LOADER), default="auto")
    model.add_argument("--download-dir", default=None)
    model.add_argument("--tokenizer", default=None)
    model.add_argument("--seed", type=int, default=None)
    model.add_argument("--enforce-eager", action="store_true")

    parallel = serve.add_argument_group("parallel")
    parallel.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parallel.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    parallel.add_argument("--distributed-executor-backend", choices=_EXECUTOR_BACKENDS,
                          default=None)
    # The multiprocessing executor across nodes (vLLM's ParallelConfig: nnodes, node_rank, master_addr/port).
    parallel.add_argument("--nnodes", type=int, default=1)
    parallel.add_argument("--node-rank", type=int, default=0)
    parallel.add_argument("--master-addr", default="127.0.0.1")
    parallel.add_argument("--master-port", type=int, default=29501)
    server.add_argument("--headless", action="store_true")

    cache = serve.add_argument_group("cache and scheduler")
    cache.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    cache.add_argument("--kv-cache-dtype", choices=_KV_CACHE_DTYPES, default="auto")
    cache.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=None)
    cache.add_argument("--max-num-seqs", type=int, default=None)
    cache.add_argument("--max-num-batched-tokens", type=_human_int, default=None)
    return parser, serve


def parse_args(argv):
    """Returns (serve sub-parser, namespace); exits 2 like argparse on bad input."""
    parser, serve = build_parser()
    args = parser.parse_args(_dashed(argv))
    if args.command is None and not args.version:
        parser.print_help()
        parser.exit(2)
    if args.command == "serve":
        for flag in ("tensor_parallel_size", "pipeline_parallel_size", "nnodes"):
            if getattr(args, flag) < 1:
                serve.error(f"--{flag.replace('_', '-')} must be at least 1")
        if not 0 <= args.node_rank < args.nnodes:
            serve.error(f"--node-rank {args.node_rank} must be from 0 to --nnodes - 1 ({args.nnodes - 1})")
        if not 1 <= args.master_port <= 65535:
            serve.error(f"--master-port {args.master_port} is not a TCP port")
    return serve, args


def non_default_args(serve: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """What vLLM logs at start-up as `non-default args: {...}` (it includes model_tag)."""
    skip = {"command", "version"}
    return {key: value for key, value in vars(args).items()
            if key not in skip and (key == "model_tag" or value != serve.get_default(key))}
