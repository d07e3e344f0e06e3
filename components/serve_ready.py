"""The gate after `vllm serve`: /health, then /v1/models listing the model, with loading progress shown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_command as command

from .config import ClusterSpec, ServeSpec
from .remote import docker_exec, script
from .vllm_serve import ENV_FILE, LOG_FILE, PID_FILE


def local_url(cluster: ClusterSpec) -> str:
    host = "127.0.0.1" if cluster.api_bind == "0.0.0.0" else cluster.api_bind
    return f"http://{host}:{cluster.api_port}"


def serve_ready_argv(cluster: ClusterSpec, serve: ServeSpec, timeout_s: int) -> list[str]:
    return ["python3", "-", f"--node={cluster.head.name}", f"--url={local_url(cluster)}",
            f"--model={serve.served_name}", f"--model-path={serve.model_path}", f"--log={LOG_FILE}",
            f"--pid-file={PID_FILE}", f"--env-file={ENV_FILE}", f"--timeout={timeout_s}"]


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
        gate = command.remote.Command(
            f"{name}-gate",
            connection=args.connection,
            create=docker_exec(args.head_container, serve_ready_argv(args.cluster, args.serve, args.timeout_s)),
            stdin=script("serve_ready.py"),
            triggers=[args.serve_id],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"],
                                        custom_timeouts=pulumi.CustomTimeouts(create=f"{args.timeout_s + 120}s")),
        )
        self.ready_id = gate.id
        self.register_outputs({"readyId": self.ready_id})
