"""The gate after `vllm serve`: /health, then /v1/models listing the model, with loading progress shown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_command as command

from .config import ClusterSpec, ServeSpec
from .gate import gate
from .vllm_serve import ENV_FILE, LOG_FILE, PID_FILE


def local_url(cluster: ClusterSpec) -> str:
    host = "127.0.0.1" if cluster.api_bind == "0.0.0.0" else cluster.api_bind
    return f"http://{host}:{cluster.api_port}"


def serve_ready_args(cluster: ClusterSpec, serve: ServeSpec, rank0: Optional[str] = None) -> list[str]:
    """With Ray, the serve inside the head container; with mp, `rank0` is rank 0's container, on the head node."""
    argv = [f"--node={cluster.head.name}", f"--url={local_url(cluster)}", f"--model={serve.served_name}",
            f"--model-path={serve.model_path}"]
    if rank0:
        return argv + [f"--container={rank0}"]
    return argv + [f"--log={LOG_FILE}", f"--pid-file={PID_FILE}", f"--env-file={ENV_FILE}"]


@dataclass
class ServeReadyArgs:
    cluster: ClusterSpec
    serve: ServeSpec
    connection: command.remote.ConnectionArgs  # of the head node
    head_container: str  # Ray: the head container, where the serve runs; mp: rank 0's container
    serve_id: pulumi.Input[str]
    timeout_s: int
    rank0: bool = False  # mp: head_container's own process is the serve; the gate runs on the node
    triggers: Optional[list] = None  # what re-runs the gate, besides serve_id


class ServeReady(pulumi.ComponentResource):
    """Succeeds once the served model is listed; fails (bounded) with the log tail and the process state."""

    ready_id: pulumi.Output[str]

    def __init__(self, name: str, args: ServeReadyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:ServeReady", name, None, opts)
        check = gate(f"{name}-gate", self, args.connection, None if args.rank0 else args.head_container,
                     "serve_ready.py",
                     serve_ready_args(args.cluster, args.serve, args.head_container if args.rank0 else None),
                     [args.serve_id, *(args.triggers or [])], args.timeout_s)
        self.ready_id = check.id
        self.register_outputs({"readyId": self.ready_id})
