"""`vllm serve`: the start-up sequence of vLLM's API server, in vLLM's order.

bind the port -> check config.json and the architecture -> Ray placement (with the Ray
backend) -> read the shards -> serve. Any failure is logged and exits 1.
"""

import os
import sys
import time
import traceback

from vllm import __version__
from vllm.args import non_default_args, parse_args
from vllm.loader import (list_shards, load_shards, read_config, resolve_architecture,
                         resolve_max_model_len, resolve_model_dir)
from vllm.logger import init_logger
from vllm import nccl
from vllm.multinode import MultiNode
from vllm.placement import RayPlacement
from vllm.server import ApiConfig, ApiServer

logger = init_logger(__name__)

WORKER_LOAD_TIMEOUT_S = 120


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if seconds < 0:
        raise ValueError(f"{name}={value!r} must not be negative")
    return seconds


def serve(serve_parser, args) -> None:
    logger.info("vLLM API server version %s", __version__)
    logger.info("non-default args: %s", non_default_args(serve_parser, args))
    shard_delay_s = _env_seconds("VLLM_DOUBLE_SHARD_DELAY_S", 0.5)
    pg_timeout_s = _env_seconds("VLLM_DOUBLE_PG_TIMEOUT_S", 60.0)
    ray_init_timeout_s = _env_seconds("VLLM_DOUBLE_RAY_INIT_TIMEOUT_S", 60.0)

    world_size = args.tensor_parallel_size * args.pipeline_parallel_size
    backend = args.distributed_executor_backend
    if backend is None and world_size > 1:
        # vLLM picks Ray when the world is larger than the local GPU count; the double has none.
        logger.info("Defaulting to use ray for distributed inference")
        backend = "ray"
    multinode = None
    if args.nnodes > 1:
        multinode = _multinode(args, backend, world_size)
    elif backend != "ray" and world_size > 1:
        raise ValueError(f"--distributed-executor-backend {backend} needs {world_size} GPUs on this "
                         "host, and the vLLM test double has none: use "
                         "--distributed-executor-backend ray, or mp across nodes with --nnodes.")
    elif args.headless:
        raise ValueError("--headless runs a node rank above 0 of a multi-node engine: it needs --nnodes > 1.")

    server = None if args.headless else ApiServer(args.host, args.port)
    model_dir = resolve_model_dir(args.model_tag)
    config = read_config(model_dir)
    resolve_architecture(config)
    max_model_len = resolve_max_model_len(config, args.max_model_len)
    nccl.load()

    if multinode:
        multinode.start()
        logger.info("Starting to load model %s...", args.model_tag)
        shards = list_shards(model_dir, args.model_tag)
        start = time.perf_counter()
        total_bytes = multinode.load(shards, shard_delay_s, _env_seconds("VLLM_DOUBLE_LOAD_TIMEOUT_S",
                                                                           WORKER_LOAD_TIMEOUT_S), args.load_format)
        took = time.perf_counter() - start
        logger.info("Loading weights took %.2f seconds", took)
        logger.info("Model loading took %.4f GiB and %.6f seconds", total_bytes / 2**30, took)
        if args.headless:
            multinode.watch_master()  # never returns
        _serve_api(server, args, max_model_len)
        multinode.shutdown()
        return

    placement = None
    if backend == "ray":
        placement = RayPlacement(args.tensor_parallel_size, args.pipeline_parallel_size,
                                 ray_init_timeout_s, pg_timeout_s)
        placement.start()

    logger.info("Starting to load model %s...", args.model_tag)
    shards = list_shards(model_dir, args.model_tag)
    worker_loads = placement.start_loading(shards, args.load_format) if placement else []
    start = time.perf_counter()
    total_bytes = load_shards(shards, shard_delay_s, args.load_format)
    if placement:
        placement.finish_loading(worker_loads, WORKER_LOAD_TIMEOUT_S)
    took = time.perf_counter() - start
    logger.info("Loading weights took %.2f seconds", took)
    logger.info("Model loading took %.4f GiB and %.6f seconds", total_bytes / world_size / 2**30, took)

    if placement:
        placement.watch()
    _serve_api(server, args, max_model_len)
    if placement:
        placement.shutdown()


def _serve_api(server, args, max_model_len: int) -> None:
    server.serve(ApiConfig(
        served_model_names=args.served_model_name or [args.model_tag],
        model_tag=args.model_tag,
        max_model_len=max_model_len,
        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,
        uvicorn_log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
        log_requests=not args.disable_log_requests,
    ))


def _multinode(args, backend, world_size: int) -> MultiNode:
    """The checks vLLM makes before an mp engine across nodes starts; the GPUs a node has are the double's."""
    if backend != "mp":
        raise ValueError(f"--nnodes {args.nnodes} needs --distributed-executor-backend mp (got {backend}).")
    if world_size % args.nnodes:
        raise ValueError(f"The world size {world_size} (tensor_parallel_size {args.tensor_parallel_size} x "
                         f"pipeline_parallel_size {args.pipeline_parallel_size}) is not divisible by nnodes "
                         f"{args.nnodes}.")
    gpus = int(_env_seconds("VLLM_DOUBLE_GPUS_PER_NODE", 1))
    if world_size // args.nnodes > gpus:
        raise ValueError(f"Each node runs {world_size // args.nnodes} ranks, and this node has {gpus} GPU(s).")
    if args.node_rank > 0 and not args.headless:
        raise ValueError(f"Node rank {args.node_rank} serves no API: run it with --headless.")
    if args.node_rank == 0 and args.headless:
        raise ValueError("Node rank 0 serves the API: run it without --headless.")
    return MultiNode(args, _env_seconds("VLLM_DOUBLE_RENDEZVOUS_TIMEOUT_S", 60.0))


def main(argv=None) -> None:
    serve_parser, args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.version:
        print(__version__)
        return
    try:
        serve(serve_parser, args)
    except Exception as err:  # every start-up failure ends here: logged, exit 1
        traceback.print_exc()
        logger.error("vLLM test double failed: %s: %s", type(err).__name__, err)
        sys.exit(1)
