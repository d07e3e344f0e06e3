"""The gate between the `mp` ranks and the API: on every node, its rank reaches the master (bounded, named).

It stands where ClusterReady stands for Ray. Without it, a rank that cannot reach the master (the seed's c10d
failure: the master on the head's management address) would show only as a head that never loads, until the
serve gate's long bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_command as command

from .config import ClusterSpec
from .gate import gate


def rank_ready_args(cluster: ClusterSpec, node_name: str, container: str) -> list[str]:
    return [f"--node={node_name}", f"--container={container}",
            f"--master={cluster.head.fabric_ip}:{cluster.master_port}", f"--head-node={cluster.head.name}",
            f"--interface={cluster.fabric_interface}"]


@dataclass
class RanksReadyArgs:
    cluster: ClusterSpec
    connections: Mapping[str, command.remote.ConnectionArgs]  # every node's
    containers: Mapping[str, str]  # node name -> its rank's container name
    container_ids: Sequence[pulumi.Input[str]]  # every rank's: a replaced rank re-runs every gate
    timeout_s: int


class RanksReady(pulumi.ComponentResource):
    """One gate a node, run on the node: its rank is running and reaches the master."""

    ready_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: RanksReadyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:RanksReady", name, None, opts)
        self.ready_ids = [
            gate(f"{name}-{node.name}-gate", self, args.connections[node.name], None, "rank_ready.py",
                 rank_ready_args(args.cluster, node.name, args.containers[node.name]), list(args.container_ids),
                 args.timeout_s).id
            for node in args.cluster.nodes]
        self.register_outputs({"readyIds": self.ready_ids})
