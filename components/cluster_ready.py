"""The gate between the Ray containers and vLLM: Ray must report exactly the expected nodes and GPUs."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_command as command

from .config import ClusterSpec
from .remote import docker_exec, script


def _is_ip(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
        return True
    except ValueError:
        return False


def cluster_ready_argv(cluster: ClusterSpec, timeout_s: int) -> list[str]:
    argv = ["python3", "-", f"--address={cluster.head.fabric_ip}:{cluster.ray_port}",
            f"--gpus={cluster.total_gpus}", f"--interface={cluster.fabric_interface}", f"--timeout={timeout_s}"]
    argv += [f"--expect={n.name}={n.fabric_ip}" for n in cluster.nodes]
    # Management addresses let the gate name the seed's failure: a node registered on the wrong network.
    argv += [f"--management={n.name}={n.ssh_host}" for n in cluster.nodes
             if _is_ip(n.ssh_host) and n.ssh_host != n.fabric_ip]
    return argv


@dataclass
class ClusterReadyArgs:
    cluster: ClusterSpec
    connection: command.remote.ConnectionArgs  # of the head node
    head_container: str
    container_ids: Sequence[pulumi.Input[str]]  # head first; a replaced container re-runs the gate
    timeout_s: int


class ClusterReady(pulumi.ComponentResource):
    """Runs once per set of Ray containers, on the head, and fails (bounded) with a diagnosis if Ray is wrong."""

    ready_id: pulumi.Output[str]

    def __init__(self, name: str, args: ClusterReadyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:ClusterReady", name, None, opts)
        gate = command.remote.Command(
            f"{name}-gate",
            connection=args.connection,
            create=docker_exec(args.head_container, cluster_ready_argv(args.cluster, args.timeout_s)),
            stdin=script("cluster_ready.py"),
            triggers=list(args.container_ids),
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"],
                                        custom_timeouts=pulumi.CustomTimeouts(create=f"{args.timeout_s + 120}s")),
        )
        self.ready_id = gate.id
        self.register_outputs({"readyId": self.ready_id})
