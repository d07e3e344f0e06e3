"""The validated deployment, as the components read it: what `loader.load()` returns.

The catalogs' and the stack's keys are checked by `validate.py`; nothing here reads a file or Pulumi.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from .artifacts_config import HubSpec, ImagesSpec
from .watchdog_config import WatchdogSpec

NAMESPACE = "spark-vllm"
SECRET_KEYS = ("apiKey", "hfToken")  # the serve's: vLLM reads both from its environment
REGISTRY_SECRET = "registryPassword"  # the image registry's, for `images.pull` (docs/artifacts.md)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    head: bool
    ssh_host: str
    ssh_port: int
    ssh_user: str
    via: Optional[str]  # name of the node used as SSH jump host
    fabric_ip: str
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SshSpec:
    key_file: Optional[str]  # None: the ssh agent
    known_hosts_file: Optional[str]
    strict_host_key_checking: str
    control_persist_s: int  # how long a shared SSH connection outlives its last use; 0: no sharing


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    ssh: SshSpec
    fabric_interface: str
    ray_port: int
    dashboard_port: int
    ray_ports: Mapping[str, int]  # `ray start` flag -> port, for Ray's other fixed ports (RAY_PORTS)
    ray_port_env: Mapping[str, int]  # environment variable -> port, for the ports Ray reads from there (RAY_PORT_ENV)
    worker_ports: tuple[int, int]  # the range Ray's workers take ports from
    fabric_guard: bool  # close Ray's ports on every interface but the fabric and loopback
    gpus_per_node: int
    docker_gpus: Optional[str]  # value for `docker run --gpus`, None to request no GPU devices
    rdma: bool
    shm_size_mb: int
    ulimits: Mapping[str, int]  # soft = hard; -1 is unlimited
    env: Mapping[str, str]
    hf_cache: str
    api_bind: str
    api_port: int
    endpoint_host: str
    nodes: tuple[NodeSpec, ...]
    gpu_probe: Optional[str] = None  # a stand-in for `nvidia-smi -L` where a node has no GPU (the lab)
    master_port: int = 29501  # mp: rank 0's rendezvous port (torch.distributed's store), on the head
    dashboard: bool = True  # Ray's dashboard on the head (about ten Python processes, ~1 GB resident)
    executor: str = "ray"  # the deployment's `serve.executor`: which ports the nodes open depends on it
    watchdog_port: Optional[int] = None  # the head keeper's port (`watchdog.port`), when the watchdog is on
    jump_hosts: tuple[NodeSpec, ...] = ()  # the catalog's nodes outside the stack's `nodes`, reached as jump hosts only

    @property
    def head(self) -> NodeSpec:
        return next(n for n in self.nodes if n.head)

    @property
    def workers(self) -> tuple[NodeSpec, ...]:
        return tuple(n for n in self.nodes if not n.head)

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    @property
    def api_host_on_node(self) -> str:
        """Where a process on the head reaches the API: loopback when the API binds every address."""
        return "127.0.0.1" if self.api_bind == "0.0.0.0" else self.api_bind

    def node(self, name: str) -> NodeSpec:
        return next(n for n in (*self.nodes, *self.jump_hosts) if n.name == name)

    def endpoint_of(self, node: NodeSpec) -> str:
        """Where clients reach an API on `node`: the catalog's endpointHost names the catalog's head."""
        return self.endpoint_host if node.name == self.head.name else node.ssh_host

    @property
    def head_ports(self) -> dict[int, tuple[str, str]]:
        """The fixed ports the head opens, with what holds them and their config key."""
        keeper = {self.watchdog_port: ("watchdog", "watchdog.port")} if self.watchdog_port else {}
        if self.executor == "mp":
            return {self.master_port: ("mp master", "mp.masterPort"), self.api_port: ("API", "api.port"), **keeper}
        return {self.ray_port: ("Ray GCS", "ray.port"), **self._dashboard_ports, self.api_port: ("API", "api.port"),
                **keeper}

    @property
    def _dashboard_ports(self) -> dict[int, tuple[str, str]]:
        """The dashboard's port, when the head runs one (`ray.dashboard`)."""
        return {self.dashboard_port: ("dashboard", "ray.dashboardPort")} if self.dashboard else {}

    @property
    def guarded_ports(self) -> list[str]:
        """Every TCP port Ray listens on, as iptables --dport values ("6379", "10002:19999"); "ephemeral" is the
        node's own ip_local_port_range, where the raylet's random ports are. With mp: the master port, and the
        ephemeral range where each rank's NCCL, gloo and message-queue ports are. The watchdog's port too: its
        keepers speak only over the fabric."""
        keeper = [str(self.watchdog_port)] if self.watchdog_port else []
        if self.executor == "mp":
            return [str(self.master_port), *keeper, "ephemeral"]
        low, high = self.worker_ports
        fixed = (self.ray_port, *self._dashboard_ports, *self.ray_ports.values(), *self.ray_port_env.values())
        return [str(p) for p in fixed] + keeper + [f"{low}:{high}", "ephemeral"]


@dataclass(frozen=True)
class ServeSpec:
    image: str
    model_path: str
    served_name: str
    tensor_parallel: int
    pipeline_parallel: int
    gpu_memory_utilization: float
    max_model_len: Optional[int]
    enforce_eager: bool
    load_format: str
    max_num_seqs: Optional[int]
    extra_args: tuple[str, ...]
    drop_page_cache: bool = False  # drop every node's page cache before each start of the serve (needs root)
    executor: str = "ray"  # vLLM's --distributed-executor-backend across nodes: "ray", or "mp" (no Ray)
    hub: Optional[HubSpec] = None  # where the weights come from, when the program downloads them


@dataclass(frozen=True)
class PreflightSpec:
    enabled: bool
    hash_weights: bool  # compare the shards' SHA-256 too, not only names and sizes (slow)
    timeout_s: int  # bound on each node's probe, SSH included
    sync_weights: bool = False  # copy missing or different files from the head to the workers over the fabric
    sync_timeout_s: int = 3600  # bound on each worker's sync


@dataclass(frozen=True)
class Deployment:
    stack: str
    cluster: ClusterSpec
    serve: ServeSpec
    cluster_ready_timeout_s: int
    serve_ready_timeout_s: int
    secrets: tuple[str, ...]  # which of SECRET_KEYS are set (values are read as Pulumi secrets)
    ssh_private_key: Optional[str]  # contents of the key file; the program wraps it as a secret
    preflight: PreflightSpec
    watchdog: WatchdogSpec = WatchdogSpec()
    images: ImagesSpec = ImagesSpec()
    host_nccl: bool = False  # nccl.hostLibrary: each node's own libnccl.so.2 over the pip one in the image

    @property
    def source(self) -> NodeSpec:
        """The node the others get the weights from: the Hub download's, else the head."""
        hub = self.serve.hub
        return self.cluster.node(hub.node) if hub is not None and hub.node else self.cluster.head
