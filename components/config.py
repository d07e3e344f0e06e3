"""The validated deployment: stack config plus the cluster and model catalogs.

`load()` reads everything once, before any resource is registered, and either returns a
complete `Deployment` or raises one `ConfigError` naming the file, the key path, the value
and what is accepted. Nothing else in the program reads config.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from .schema import ConfigError, Section

NAMESPACE = "spark-vllm"
SECRET_KEYS = ("apiKey", "hfToken")
# Env vars the program pins to the fabric on every node; user extras may not override them.
PINNED_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME",
              "OMPI_MCA_btl_tcp_if_include", "MASTER_ADDR", "RAY_memory_monitor_refresh_ms",
              "AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")


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
    executor: str = "ray"  # the deployment's `serve.executor`: which ports the nodes open depends on it

    @property
    def head(self) -> NodeSpec:
        return next(n for n in self.nodes if n.head)

    @property
    def workers(self) -> tuple[NodeSpec, ...]:
        return tuple(n for n in self.nodes if not n.head)

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)

    @property
    def guarded_ports(self) -> list[str]:
        """Every TCP port Ray listens on, as iptables --dport values ("6379", "10002:19999"); "ephemeral" is the
        node's own ip_local_port_range, where the raylet's random ports are. With mp: the master port, and the
        ephemeral range where each rank's NCCL, gloo and message-queue ports are."""
        if self.executor == "mp":
            return [str(self.master_port), "ephemeral"]
        low, high = self.worker_ports
        fixed = (self.ray_port, self.dashboard_port, *self.ray_ports.values(), *self.ray_port_env.values())
        return [str(p) for p in fixed] + [f"{low}:{high}", "ephemeral"]


@dataclass(frozen=True)
class ServeSpec:
    model: str  # preset name
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


# What RDMA and NCCL need (the anchors' `--ulimit` flags); a host that cannot grant them sets lower ones.
DEFAULT_ULIMITS = {"memlock": -1, "stack": 67108864, "nofile": 1048576}
# Ray's fixed ports besides the GCS and the dashboard: `ray start` flag -> (key under `ray:`, default). Ray binds
# most of its ports on 0.0.0.0 whatever --node-ip-address says, and has no auth: pinning them lets the fabric guard
# close exactly these on every other network. Where Ray has a default it is kept. The raylet's node manager and
# object manager stay on random (ephemeral) ports, which the guard closes as a range: pinned, a rebooted node's
# new raylet took over its dead predecessor's address, and the GCS kept reserving its GPU for the old node's
# placement group bundles (seen in the lab).
RAY_PORTS = {"runtime-env-agent-port": ("runtimeEnvAgentPort", 6380),
             "dashboard-agent-grpc-port": ("dashboardAgentGrpcPort", 6381),
             "metrics-export-port": ("metricsExportPort", 6382),
             "dashboard-agent-listen-port": ("dashboardAgentPort", 52365),
             "ray-client-server-port": ("clientServerPort", 10001)}
# Two metrics servers on the head that `ray start` has no flag for; Ray reads their ports from the environment.
RAY_PORT_ENV = {"AUTOSCALER_METRIC_PORT": ("autoscalerMetricsPort", 44217),
                "DASHBOARD_METRIC_PORT": ("dashboardMetricsPort", 44227)}
EXECUTORS = ("ray", "mp")  # vLLM's own names for its executors across nodes
LOAD_FORMATS = ("auto", "safetensors", "fastsafetensors", "runai_streamer", "pt", "dummy")


def load(stack: str, config: Mapping[str, Any], secret_keys: set[str], project_dir: Path) -> Deployment:
    """Validates the stack's config (`spark-vllm:*` keys, already JSON-decoded) and the catalogs it names."""
    stack_file = f"Pulumi.{stack}.yaml"
    top = Section({k[len(NAMESPACE) + 1:]: v for k, v in config.items() if k.startswith(NAMESPACE + ":")},
                  stack_file, NAMESPACE, sep=":")
    catalog_name = top.str("catalog", "catalog")
    catalog_dir = project_dir / catalog_name
    cluster_name = top.str("cluster")
    model_name = top.str("model")
    overrides = top.section("serve")
    timeouts = top.section("timeouts")
    cluster_ready_s = timeouts.int("clusterReadySeconds", 180, lo=10, hi=3600)
    serve_ready_s = timeouts.int("serveReadySeconds", 2400, lo=30, hi=4 * 3600)
    timeouts.done()
    checks = top.section("preflight")
    preflight = PreflightSpec(enabled=checks.bool("enabled", True), hash_weights=checks.bool("hashWeights", False),
                              timeout_s=checks.int("timeoutSeconds", 60, lo=5, hi=4 * 3600),
                              sync_weights=checks.bool("syncWeights", False),
                              sync_timeout_s=checks.int("syncTimeoutSeconds", 3600, lo=10, hi=24 * 3600))
    if preflight.sync_weights and not preflight.enabled:
        raise checks.error("syncWeights", True, "false while preflight.enabled is false",
                           "is true, but the sync acts on what preflight finds, and preflight is off")
    checks.done()
    secrets = []
    for key in SECRET_KEYS:
        if top.has(key):
            top.str(key, accepted="a secret string")
            if f"{NAMESPACE}:{key}" not in secret_keys:
                raise top.error(key, "(plain text)",
                                f"a secret: run `pulumi config set --secret {NAMESPACE}:{key} <value>`",
                                "is stored in plain text")
            secrets.append(key)
    top.done()

    clusters = _catalog_entry(catalog_dir / "clusters.yaml", f"{catalog_name}/clusters.yaml", cluster_name,
                              stack_file, "cluster")
    cluster = _cluster(clusters, cluster_name)
    preset = _catalog_entry(catalog_dir / "models.yaml", f"{catalog_name}/models.yaml", model_name, stack_file, "model")
    serve = _serve(preset, overrides, model_name)
    cluster = dataclasses.replace(cluster, executor=serve.executor)

    world = serve.tensor_parallel * serve.pipeline_parallel
    if world != cluster.total_gpus:
        raise ConfigError(stack_file, f"{NAMESPACE}:serve.tensorParallel x pipelineParallel", world,
                          f"{cluster.total_gpus} (the GPUs in cluster {cluster_name!r}: {len(cluster.nodes)} nodes"
                          f" x {cluster.gpus_per_node})",
                          f"is {serve.tensor_parallel} x {serve.pipeline_parallel} = {world}")
    return Deployment(stack=stack, cluster=cluster, serve=serve, cluster_ready_timeout_s=cluster_ready_s,
                      serve_ready_timeout_s=serve_ready_s, secrets=tuple(secrets),
                      ssh_private_key=_read_key(cluster, clusters.file), preflight=preflight)


def _catalog_entry(path: Path, shown: str, name: str, stack_file: str, what: str) -> Section:
    """The entry `name` of a catalog file; `shown` is the file's name as errors print it."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(stack_file, f"{NAMESPACE}:catalog", str(path.parent), f"a folder holding {path.name}",
                          f"names a folder where {path.name} cannot be read ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        quoted = f" ({line.strip()!r})" if line.strip() else ""
        raise ConfigError(shown, where, line, "valid YAML",
                          f"{quoted} is not valid YAML: {getattr(e, 'problem', None) or e}") from None
    catalog = Section(data if data is not None else {}, shown, "")
    if not catalog.has(name):
        raise ConfigError(stack_file, f"{NAMESPACE}:{what}", name,
                          f"a {what} defined in {shown}: " + (", ".join(sorted(map(str, catalog.data))) or "none"))
    return catalog.section(name)


def _cluster(c: Section, name: str) -> ClusterSpec:
    ssh = c.section("ssh")
    user = ssh.str("user", "root")
    ssh_spec = SshSpec(key_file=ssh.str("keyFile", None), known_hosts_file=ssh.str("knownHostsFile", None),
                       strict_host_key_checking=ssh.choice("strictHostKeyChecking", ("yes", "accept-new", "no"),
                                                           "accept-new"),
                       control_persist_s=ssh.int("controlPersistSeconds", 60, lo=0, hi=24 * 3600))
    ssh.done()
    fabric_interface = c.str("fabricInterface")
    ray = c.section("ray")
    ray_port = ray.port("port", 6379)
    dashboard_port = ray.port("dashboardPort", 8265)
    gpus_per_node = ray.int("gpusPerNode", 1, lo=1, hi=16)
    ray_ports = {flag: ray.port(key, default) for flag, (key, default) in RAY_PORTS.items()}
    ray_port_env = {var: ray.port(key, default) for var, (key, default) in RAY_PORT_ENV.items()}
    worker_ports = (ray.port("minWorkerPort", 10002), ray.port("maxWorkerPort", 19999))
    fabric_guard = ray.bool("fabricGuard", True)
    ray.done()
    mp = c.section("mp")
    master_port = mp.port("masterPort", 29501)
    mp.done()
    docker = c.section("docker")
    docker_gpus = docker.str("gpus", "all", accepted="'all', 'none', or a docker --gpus value")
    rdma = docker.bool("rdma", True)
    shm_size_mb = docker.int("shmSizeMb", 10240, lo=64, hi=1 << 20)
    limits = docker.section("ulimits")
    ulimits = {name: limits.int(name, default, lo=-1, hi=1 << 62) for name, default in DEFAULT_ULIMITS.items()}
    limits.done()
    docker.done()
    env = c.str_map("env", {})
    for key in env:
        if key in PINNED_ENV:
            raise c.error(f"env.{key}", env[key], "no value here: spark-vllm pins it to each node's fabric address",
                          "overrides a pinned variable")
    hf_cache = c.str("hfCache", "/root/.cache/huggingface")
    api = c.section("api")
    api_bind = api.ipv4("bind", "0.0.0.0")
    api_port = api.port("port", 8000)
    endpoint_host = api.host("endpointHost", None)
    api.done()
    checks = c.section("preflight")
    gpu_probe = checks.str("gpuProbe", None, accepted="a shell command that prints one `GPU <n>: <name>` line a GPU")
    checks.done()
    node_sections = c.sections("nodes")
    nodes = [_node(n, user) for n in node_sections]
    c.done()

    _check_nodes(c, nodes)
    _check_ports(c, {"ray.port": ray_port, "ray.dashboardPort": dashboard_port,
                     **{f"ray.{RAY_PORTS[flag][0]}": port for flag, port in ray_ports.items()},
                     **{f"ray.{RAY_PORT_ENV[var][0]}": port for var, port in ray_port_env.items()},
                     "mp.masterPort": master_port, "api.port": api_port}, worker_ports)
    head = next(n for n in nodes if n.head)
    return ClusterSpec(name=name, ssh=ssh_spec, fabric_interface=fabric_interface, ray_port=ray_port,
                       dashboard_port=dashboard_port, ray_ports=ray_ports, ray_port_env=ray_port_env,
                       worker_ports=worker_ports, fabric_guard=fabric_guard, gpus_per_node=gpus_per_node,
                       docker_gpus=None if docker_gpus == "none" else docker_gpus, rdma=rdma,
                       shm_size_mb=shm_size_mb, ulimits=ulimits, env=env, hf_cache=hf_cache, api_bind=api_bind,
                       api_port=api_port,
                       endpoint_host=endpoint_host or head.ssh_host, nodes=tuple(nodes), gpu_probe=gpu_probe,
                       master_port=master_port)


def _node(n: Section, default_user: str) -> NodeSpec:
    name = n.name("name")
    role = n.choice("role", ("head", "worker"), "worker")
    ssh = n.section("ssh", required=True)
    spec = NodeSpec(name=name, head=role == "head", ssh_host=ssh.host("host"), ssh_port=ssh.port("port", 22),
                    ssh_user=ssh.str("user", default_user), via=ssh.name("via", None), fabric_ip=n.ipv4("fabricIp"),
                    env=n.str_map("env", {}))
    ssh.done()
    for key in spec.env:
        if key in PINNED_ENV:
            raise n.error(f"env.{key}", spec.env[key], "no value here: spark-vllm pins it to the node's fabric address",
                          "overrides a pinned variable")
    n.done()
    return spec


def _check_nodes(c: Section, nodes: list[NodeSpec]) -> None:
    seen_names: dict[str, int] = {}
    seen_ips: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.name in seen_names:
            raise c.error(f"nodes[{i}].name", node.name, "a name used by no other node",
                          f"repeats the name of nodes[{seen_names[node.name]}]")
        if node.fabric_ip in seen_ips:
            raise c.error(f"nodes[{i}].fabricIp", node.fabric_ip, "a fabric IP used by no other node",
                          f"repeats the fabric IP of nodes[{seen_ips[node.fabric_ip]}]")
        seen_names[node.name], seen_ips[node.fabric_ip] = i, i
    heads = [i for i, n in enumerate(nodes) if n.head]
    if len(heads) != 1:
        raise c.error("nodes", [nodes[i].name for i in heads], "exactly one node with `role: head`",
                      f"has {len(heads)} head nodes" + (f" ({', '.join(nodes[i].name for i in heads)})" if heads else ""))
    for i, node in enumerate(nodes):
        if node.via is None:
            continue
        accepted = "the name of another node that is reached directly: " + ", ".join(
            n.name for n in nodes if n.via is None and n.name != node.name)
        if node.via == node.name:
            raise c.error(f"nodes[{i}].ssh.via", node.via, accepted, "names the node itself")
        jump = seen_names.get(node.via)
        if jump is None or nodes[jump].via is not None:
            raise c.error(f"nodes[{i}].ssh.via", node.via, accepted)


def _check_ports(c: Section, ports: dict[str, int], worker_ports: tuple[int, int]) -> None:
    """Ray's ports and the API's must all differ, and stay out of the range Ray gives its workers."""
    low, high = worker_ports
    if low >= high:
        raise c.error("ray.maxWorkerPort", high, f"a port above ray.minWorkerPort ({low})")
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in seen:
            raise c.error(key, port, "a port no other Ray or API port uses", f"is {port}, which {seen[port]} also uses")
        if low <= port <= high:
            raise c.error(key, port, f"a port outside Ray's worker ports ({low}-{high}, ray.minWorkerPort to "
                                     "ray.maxWorkerPort)", f"is {port}, inside Ray's worker ports")
        seen[port] = key


def _serve(preset: Section, overrides: Section, model_name: str) -> ServeSpec:
    def pick(key: str) -> Section:
        """The stack's override if it sets `key`, else the preset: errors then blame the right file."""
        preset._read.add(key)
        return overrides if overrides.has(key) else preset

    path = pick("path").str("path")
    if not path.startswith("/"):
        raise pick("path").error("path", path, "an absolute path to the weights on every node")
    spec = ServeSpec(model=model_name, image=pick("image").str("image"), model_path=path,
                     served_name=pick("servedName").str("servedName", model_name),
                     tensor_parallel=pick("tensorParallel").int("tensorParallel", 1, lo=1, hi=64),
                     pipeline_parallel=pick("pipelineParallel").int("pipelineParallel", 1, lo=1, hi=64),
                     gpu_memory_utilization=pick("gpuMemoryUtilization").fraction("gpuMemoryUtilization", 0.85),
                     max_model_len=pick("maxModelLen").int("maxModelLen", None, lo=16, hi=1 << 24),
                     enforce_eager=pick("enforceEager").bool("enforceEager", True),
                     load_format=pick("loadFormat").choice("loadFormat", LOAD_FORMATS, "auto"),
                     max_num_seqs=pick("maxNumSeqs").int("maxNumSeqs", None, lo=1, hi=65536),
                     extra_args=pick("extraArgs").str_list("extraArgs", ()),
                     drop_page_cache=pick("dropPageCache").bool("dropPageCache", False),
                     executor=pick("executor").choice("executor", EXECUTORS, "ray"))
    preset.done()
    overrides._read |= preset._read  # the stack may override any preset key
    overrides.done()
    return spec


def _read_key(cluster: ClusterSpec, clusters_file: str) -> Optional[str]:
    if cluster.ssh.key_file is None:
        return None
    path = Path(os.path.expanduser(cluster.ssh.key_file))
    try:
        return path.read_text()
    except OSError as e:
        raise ConfigError(clusters_file, f"{cluster.name}.ssh.keyFile", cluster.ssh.key_file,
                          "a readable SSH private key file (or leave it out to use the ssh agent)",
                          f"cannot be read ({e.strerror})") from None



def from_pulumi(project_dir: Path) -> Deployment:
    """`load()` with this stack's config, as the Pulumi engine handed it to the program."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    raw = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    values = {key: _decode(value) for key, value in raw.items()}
    secret_keys = {key for key in raw if runtime_config.is_config_secret(key)}
    return load(pulumi.get_stack(), values, secret_keys, project_dir)


def _decode(value: Any) -> Any:
    # Structured config (objects, lists) reaches the program as JSON text; plain values stay strings.
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
