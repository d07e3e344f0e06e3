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


def serve_ready_args(cluster: ClusterSpec, serve: ServeSpec) -> list[str]:
    return [f"--node={cluster.head.name}", f"--url={local_url(cluster)}", f"--model={serve.served_name}",
            f"--model-path={serve.model_path}", f"--log={LOG_FILE}", f"--pid-file={PID_FILE}",
            f"--env-file={ENV_FILE}"]


@dataclass
class ServeReadyArgs:
    cluster: ClusterSpec
    serve: ServeSpec
    connection: command.remote.ConnectionArgs  # of the head node
    head_container: str
    serve_id: pulumi.Input[str]
    timeout_s: int


class ServeReady(pulumi.ComponentResource):
    """Succeeds once the served model is listed; fails (bounded) with the log tail and the process state."""

    ready_id: pulumi.Output[str]

    def __init__(self, name: str, args: ServeReadyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:ServeReady", name, None, opts)
        check = gate(f"{name}-gate", self, args.connection, args.head_container, "serve_ready.py",
                     serve_ready_args(args.cluster, args.serve), [args.serve_id], args.timeout_s)
        self.ready_id = check.id
        self.register_outputs({"readyId": self.ready_id})
