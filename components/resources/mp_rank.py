"""vLLM's own executor across nodes (`executor: mp`): one container a node whose own process is `vllm serve`.

Node rank 0 is the head: it serves the API and hosts the rendezvous at `--master-addr` (the head's fabric IP) and
`--master-port`. The other nodes run `--headless` ranks. The container's log is the rank's log (`docker logs`),
and Docker owns its lifetime. Each rank is pinned to its node's fabric like the Ray containers (`fabric_env`).

A torch.distributed group cannot take back one rank, so every rank restarts together: each carries a digest of
every rank's settings in a label (a change anywhere replaces all), and the workers `replace_with` the head's
container, as Ray's workers do (a head replaced alone, after a reboot, takes them with it), and carry its id in a
label when preflight is off (ray_node.node_labels).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Mapping, Optional

import pulumi
import pulumi_docker as docker

from ..config.spec import ClusterSpec, NodeSpec, ServeSpec
from .labels import life_labels
from .ray_node import container_env, fabric_env, node_labels, runtime_settings
from .spark_node import SparkNode
from .vllm_serve import SECRET_ENV, serve_argv


def node_rank(cluster: ClusterSpec, node: NodeSpec) -> int:
    """The head is rank 0; the workers follow in catalog order."""
    return 0 if node.head else 1 + cluster.workers.index(node)


def rank_command(cluster: ClusterSpec, serve: ServeSpec, node: NodeSpec) -> list[str]:
    """`vllm serve ...` for this node's rank (the container's entrypoint is `vllm`, so without it)."""
    rank = node_rank(cluster, node)
    argv = serve_argv(serve, cluster)[1:]
    if len(cluster.nodes) == 1:  # vLLM on one node: no rendezvous, so no master to open or reach
        return argv
    argv += ["--nnodes", str(len(cluster.nodes)), "--node-rank", str(rank),
             "--master-addr", cluster.head.fabric_ip, "--master-port", str(cluster.master_port)]
    return argv + (["--headless"] if rank else [])


def container_name(stack: str, cluster: ClusterSpec, node: NodeSpec) -> str:
    return f"spark-vllm-{stack}-vllm-rank{node_rank(cluster, node)}"


def ranks_digest(cluster: ClusterSpec, serve: ServeSpec, weights_roots: Optional[Mapping[str, str]] = None,
                 nccl: Optional[Mapping[str, tuple[str, str]]] = None) -> str:
    """What every rank runs with, on every node: any change of it restarts all ranks together."""
    ranks = {node.name: {"command": rank_command(cluster, serve, node),
                         "env": container_env(cluster, node, fabric_env)} for node in cluster.nodes}
    runtime = {k: getattr(cluster, k) for k in ("shm_size_mb", "docker_gpus", "rdma", "ulimits", "hf_cache")}
    roots = dict(weights_roots or {})
    spec = json.dumps([ranks, runtime, serve.image, serve.model_path, *([roots] if any(
        root != serve.model_path for root in roots.values()) else []), *([dict(nccl)] if nccl else [])],
        sort_keys=True, default=str)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


@dataclass
class MpRankArgs:
    stack: str
    cluster: ClusterSpec
    serve: ServeSpec
    node: NodeSpec
    spark: SparkNode
    digest: pulumi.Input[str]  # every rank's settings, the images and the secrets, as one digest
    head: Optional["MpRank"] = None  # set for workers: ties them to one head
    head_id_label: bool = False  # the head's id in a label: with preflight off, where no life token follows the head
    # rank 0 only: keys of SECRET_ENV; the values are Pulumi secrets
    secrets: Optional[Mapping[str, pulumi.Input[str]]] = None
    depends_on: tuple = ()  # the node's fabric guard and weights sync, the page-cache drops
    weights_root: Optional[str] = None  # what it mounts for the weights, when not their folder (runtime_settings)
    nccl: Optional[tuple[str, str]] = None  # the host's NCCL and the image's it covers (runtime_settings)
    # The group's life token (components/preflight/liveness.py): a new one recreates every rank.
    life: Optional[str] = None


class MpRank(pulumi.ComponentResource):
    """One node's rank: a `vllm serve --nnodes N --node-rank k` container."""

    container: docker.Container
    container_id: pulumi.Output[str]
    container_name: str

    def __init__(self, name: str, args: MpRankArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:MpRank", name, None, opts)
        cluster, node = args.cluster, args.node
        labels = node_labels(args.stack, node, args.head.container_id if args.head and args.head_id_label else None,
                             docker.ContainerLabelArgs(label="spark-vllm.ranks-digest", value=args.digest),
                             *life_labels(args.life))
        env = container_env(cluster, node, fabric_env)
        secrets = args.secrets or {}
        keys = sorted(secrets)
        # vLLM reads the API key and HF token from its environment; as container env they stay Pulumi secrets.
        envs = pulumi.Output.all(*(secrets[k] for k in keys)).apply(
            lambda values: sorted(env + [f"{SECRET_ENV[k]}={v}" for k, v in zip(keys, values)])) if keys else env
        self.container_name = container_name(args.stack, cluster, node)
        self.container = docker.Container(
            f"{name}-container",
            name=self.container_name,
            image=args.spark.image_id,
            entrypoints=["vllm"],
            command=rank_command(cluster, args.serve, node),
            envs=envs,
            labels=labels,
            **runtime_settings(cluster, args.serve, args.weights_root, args.nccl),
            opts=pulumi.ResourceOptions(parent=self, provider=args.spark.provider, delete_before_replace=True,
                                        replace_on_changes=["*"],
                                        replace_with=[args.head.container] if args.head else None,
                                        depends_on=[r for r in (*args.depends_on, args.spark.image) if r]),
        )
        self.container_id = self.container.id
        self.register_outputs({"containerId": self.container_id, "containerName": self.container_name,
                               "fabricIp": node.fabric_ip})
