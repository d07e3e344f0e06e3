"""The gate between the Ray containers and vLLM: Ray must report exactly the expected nodes and GPUs."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_command as command

from .config import ClusterSpec
from .gate import gate


def _is_ip(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
        return True
    except ValueError:
        return False


def cluster_ready_args(cluster: ClusterSpec) -> list[str]:
    argv = [f"--address={cluster.head.fabric_ip}:{cluster.ray_port}", f"--gpus={cluster.total_gpus}",
            f"--interface={cluster.fabric_interface}"]
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
        check = gate(f"{name}-gate", self, args.connection, args.head_container, "cluster_ready.py",
                     cluster_ready_args(args.cluster), list(args.container_ids), args.timeout_s)
        self.ready_id = check.id
        self.register_outputs({"readyId": self.ready_id})
