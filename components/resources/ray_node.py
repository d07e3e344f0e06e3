"""The Ray containers: the head, and one worker per other node, each pinned to its node's fabric address.

Both are `docker.Container`s on the node's own Docker provider. The config diff decides exactly which ones
restart, and every change replaces: pulumi-docker plans some changes as in-place updates that Docker cannot
apply to a running container (a new mount keeps the old one), or that start a stopped container in place (a
refresh after a reboot sets `mustRun` false), which would leave the gates and the serve believing nothing moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker

from ..config.spec import ClusterSpec, NodeSpec, ServeSpec
from .labels import life_labels
from .spark_node import SparkNode
from .vllm_serve import LOG_FILE
from .watchdog import volume_name

HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
HEAD_ONLY_RAY_PORTS = {"ray-client-server-port"}  # the Ray client server runs on the head alone
GCS_WAIT_S = 120  # how long a worker keeps trying to reach its head's GCS


def fabric_env(cluster: ClusterSpec, node: NodeSpec) -> dict[str, str]:
    """Everything that picks an address or interface, set to the fabric, so nothing can pick the management IP.
    Both executors pin these."""
    iface = cluster.fabric_interface
    return {
        "VLLM_HOST_IP": node.fabric_ip,
        "NCCL_SOCKET_IFNAME": iface,
        "GLOO_SOCKET_IFNAME": iface,
        "UCX_NET_DEVICES": iface,
        "TP_SOCKET_IFNAME": iface,
        "OMPI_MCA_btl_tcp_if_include": iface,
        "MASTER_ADDR": cluster.head.fabric_ip,
    }


def pinned_env(cluster: ClusterSpec, node: NodeSpec) -> dict[str, str]:
    """The fabric pinning, and Ray's own."""
    return {
        **fabric_env(cluster, node),
        # Ray's OOM killer counts unified memory as pressure and killed the seed's load at 95 %.
        "RAY_memory_monitor_refresh_ms": "0",
        # `ray start --block` drains its node on SIGTERM for up to 30 s, for actors that finish; vLLM's never do, so
        # every `docker stop` and reboot waited out Docker's 10 s and killed Ray. 0: it stops at once, cleanly.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        # When vLLM's driver connects, the head's raylet starts one idle Python worker per CPU (20 on a Spark, about
        # 70 MB each of the memory the GPU shares) and holds the driver until they are up; vLLM's actors never use
        # them (ray-project/ray 40131). 0: none.
        "RAY_prestart_worker_first_driver": "0",
        # Not an address, but pinned alike: the fabric guard closes these ports, so they must not move.
        **{var: str(port) for var, port in cluster.ray_port_env.items()},
        # A worker may start before its head's GCS listens (node_labels): it tries it once a second, 20 times by
        # default (ray/_private/node.py), then gives up; this is how long it keeps trying.
        **({} if node.head else {"RAY_gcs_server_port_wait_time_s": str(GCS_WAIT_S)}),
    }


def container_env(cluster: ClusterSpec, node: NodeSpec, pinned=pinned_env) -> list[str]:
    env = {**cluster.env, **node.env, **pinned(cluster, node)}
    return [f"{key}={value}" for key, value in sorted(env.items())]


def runtime_settings(cluster: ClusterSpec, serve: ServeSpec, weights_root: Optional[str] = None,
                     nccl: Optional[tuple[str, str]] = None) -> dict:
    """The `docker.Container` settings every engine container shares (Ray's and mp's ranks): host network and
    IPC, shm, GPUs, RDMA, ulimits, the weights read-only (their folder, or `weights_root`, a folder that also holds
    what their links lead to), the HF cache, and with nccl.hostLibrary `nccl`: (the host's libnccl.so.2, the pip
    one it covers), mounted read-only over it, so that the image itself never changes (docs/host-nccl.md)."""
    root = weights_root or serve.model_path
    host_nccl = [docker.ContainerMountArgs(type="bind", source=nccl[0], target=nccl[1], read_only=True)] if nccl else []
    return dict(
        network_mode="host",
        ipc_mode="host",
        shm_size=cluster.shm_size_mb,
        gpus=cluster.docker_gpus,
        # Spelled as Docker reads them back (the CAP_ prefix, the device's defaults): any other spelling is a
        # diff on every refresh, and with "*" below a full restart.
        devices=[docker.ContainerDeviceArgs(host_path="/dev/infiniband", container_path="/dev/infiniband",
                                            permissions="rwm")] if cluster.rdma else None,
        capabilities=docker.ContainerCapabilitiesArgs(adds=["CAP_IPC_LOCK"]) if cluster.rdma else None,
        ulimits=[docker.ContainerUlimitArgs(name=name, soft=limit, hard=limit)
                 for name, limit in sorted(cluster.ulimits.items())],
        mounts=[docker.ContainerMountArgs(type="bind", source=root, target=root, read_only=True),
                docker.ContainerMountArgs(type="bind", source=cluster.hf_cache, target=HF_CACHE_IN_CONTAINER),
                *host_nccl],
        # A rebooted node leaves this down; `pulumi up --refresh` sees it stopped and replaces it.
        restart="no",
    )


def ray_start(cluster: ClusterSpec, node: NodeSpec) -> list[str]:
    low, high = cluster.worker_ports
    common = [f"--node-ip-address={node.fabric_ip}", f"--num-gpus={cluster.gpus_per_node}",
              *(f"--{flag}={port}" for flag, port in cluster.ray_ports.items()
                if node.head or flag not in HEAD_ONLY_RAY_PORTS),
              f"--min-worker-port={low}", f"--max-worker-port={high}", "--disable-usage-stats", "--block"]
    if node.head:
        dashboard = ([f"--dashboard-host={node.fabric_ip}", f"--dashboard-port={cluster.dashboard_port}"]
                     if cluster.dashboard else ["--include-dashboard=false"])
        return ["start", "--head", f"--port={cluster.ray_port}", *dashboard, *common]
    return ["start", f"--address={cluster.head.fabric_ip}:{cluster.ray_port}", *common]


def node_labels(stack: str, node: NodeSpec, head_id: Optional[pulumi.Input[str]],
                *extra: docker.ContainerLabelArgs) -> list[docker.ContainerLabelArgs]:
    """The stack, the role, `extra`, then (for a worker, when given) the id of its head's container.

    A worker must rejoin whenever the head is new. With preflight on, the head's life token does that: a new head
    gives its workers new tokens too (components/preflight/liveness.py), and no label needs the head's id (Ray's
    worker and vLLM's ranks keep trying to reach the head). With preflight off there are no tokens, and the head's
    id in a label makes a new head part of the worker's diff (also a head re-created after drift). Either way
    `replace_with` makes the engine take the worker down *before* a head it replaces, which a label cannot:
    pulumi-docker answers "no diff" while the id is unknown. It also makes the worker wait until the head is
    created: the Python SDK awaits the URN of a resource that `replace_with` names.
    """
    labels = [docker.ContainerLabelArgs(label="spark-vllm.stack", value=stack),
              docker.ContainerLabelArgs(label="spark-vllm.role", value="head" if node.head else "worker"), *extra]
    if head_id is not None:
        labels.append(docker.ContainerLabelArgs(label="spark-vllm.head-id", value=head_id))
    return labels


def container_name(stack: str, node: NodeSpec) -> str:
    return f"spark-vllm-{stack}-ray-{'head' if node.head else 'worker'}"


@dataclass
class RayNodeArgs:
    stack: str
    cluster: ClusterSpec
    serve: ServeSpec
    node: NodeSpec
    spark: SparkNode
    head: Optional["RayNode"] = None  # set for workers: ties them to one head
    head_id_label: bool = False  # the head's id in a label: with preflight off, where no life token follows the head
    guard: Optional[pulumi.Resource] = None  # the node's fabric guard: its rules go in before Ray opens a port
    # Every node's image copy or pull, weights download and sync: nothing that runs is replaced before all are done.
    artifacts: Sequence[pulumi.Resource] = ()
    weights_root: Optional[str] = None  # what it mounts for the weights, when not their folder (runtime_settings)
    nccl: Optional[tuple[str, str]] = None  # the host's NCCL and the image's it covers (runtime_settings)
    life: Optional[str] = None  # its life token (components/preflight/liveness.py): a new one recreates it


class RayNode(pulumi.ComponentResource):
    """A `ray start --block` container on one node: the head, or a worker joined to the head's fabric address."""

    container: docker.Container
    container_id: pulumi.Output[str]
    container_name: str

    def __init__(self, name: str, args: RayNodeArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:RayNode", name, None, opts)
        cluster, node = args.cluster, args.node
        labels = node_labels(args.stack, node, args.head.container_id if args.head and args.head_id_label else None,
                             *life_labels(args.life))
        self.container_name = container_name(args.stack, node)
        settings = runtime_settings(cluster, args.serve, args.weights_root, args.nccl)
        if node.head:
            # The serve's log on the node's volume, so that it outlives the container (rotated by serve_start.sh).
            settings["mounts"] = [*settings["mounts"], docker.ContainerMountArgs(
                type="volume", source=volume_name(args.stack), target=LOG_FILE.rsplit("/", 1)[0])]
        container = docker.Container(
            f"{name}-container",
            name=self.container_name,
            image=args.spark.image_id,
            entrypoints=["ray"],
            command=ray_start(cluster, node),
            envs=container_env(cluster, node),
            labels=labels,
            # Docker's init as pid 1 reaps what `ray start` would leave a zombie: a killed `vllm serve` (its
            # launcher's shell exits at once, so the serve's parent becomes pid 1).
            init=True,
            **settings,
            opts=pulumi.ResourceOptions(parent=self, provider=args.spark.provider, delete_before_replace=True,
                                        replace_on_changes=["*"],
                                        replace_with=[args.head.container] if args.head else None,
                                        depends_on=[r for r in (args.guard, *args.artifacts, args.spark.image)
                                                    if r]),
        )
        self.container = container
        self.container_id = container.id
        self.register_outputs({"containerId": self.container_id, "containerName": self.container_name,
                               "fabricIp": node.fabric_ip})
