"""The validator: every key of the stack and of the catalog entries it names, checked once, into `spec` types.

Each refusal is one `ConfigError` naming the file, the key path, the value and what is accepted; `schema.Section`
gives the typed getters, and the checks across keys (ports, nodes, jump hosts, extraArgs) are here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from . import artifacts_config, serve_flags, watchdog_config
from .artifacts_config import ImagesSpec
from .schema import HIDDEN, ConfigError, Section, closest, did_you_mean
from .spec import NAMESPACE, REGISTRY_SECRET, SECRET_KEYS, ClusterSpec, NodeSpec, PreflightSpec, ServeSpec, SshSpec
from .watchdog_config import WatchdogSpec

# Environment variables that would carry the secrets (SECRET_KEYS) in plain text, in the containers' create inputs.
PLAIN_SECRET_ENV = {"VLLM_API_KEY": "apiKey", "HF_TOKEN": "hfToken", "HUGGING_FACE_HUB_TOKEN": "hfToken"}
# Env vars the program pins to the fabric on every node; user extras may not override them.
PINNED_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME",
              "OMPI_MCA_btl_tcp_if_include", "MASTER_ADDR", "RAY_memory_monitor_refresh_ms",
              "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "RAY_prestart_worker_first_driver", "AUTOSCALER_METRIC_PORT",
              "DASHBOARD_METRIC_PORT", "RAY_gcs_server_port_wait_time_s")
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
PORT_SLOTS = 9  # `spark-vllm:portSlot` 0-8 (placement.py)


@dataclass(frozen=True)
class StackKeys:
    """The stack file's own keys; the cluster and the model are entries of the catalogs."""
    catalog: str  # the catalogs' folder, as written
    cluster: str
    model: str
    overrides: Section  # `serve:`, read beside the model's preset
    cluster_ready_timeout_s: int
    serve_ready_timeout_s: int
    preflight: PreflightSpec
    preflight_keys: Section  # for the checks against the model's `hub` (loader.py)
    sync_weights: Optional[bool]  # preflight.syncWeights as written; None: left out
    secrets: tuple[str, ...]
    images: ImagesSpec
    watchdog: WatchdogSpec
    watchdog_keys: Section  # for the port's check against the cluster's
    nodes: Optional[tuple[str, ...]]  # the stack's nodes, its head first (placement.py); None: the cluster's
    port_slot: Optional[int]  # placement.py; None: the cluster's ports as written
    top: Section  # the stack's own keys, for placement's errors
    host_nccl: bool = False  # nccl.hostLibrary: the serve uses each host's libnccl.so.2 (docs/host-nccl.md)


def stack_keys(config: Mapping[str, Any], secret_keys: set[str], stack_file: str) -> StackKeys:
    """The stack's `spark-vllm:*` keys (already JSON-decoded); `secret_keys` are those set with --secret."""
    top = top_section(config, secret_keys, stack_file)
    # A site keeps its catalogs outside the checkout: an absolute path, or one under ~; relative to the project.
    catalog = top.str("catalog", "catalog")
    cluster, model = top.str("cluster"), top.str("model")
    overrides = top.section("serve")
    timeouts = top.section("timeouts")
    cluster_ready_s = timeouts.int("clusterReadySeconds", 180, lo=10, hi=3600)
    serve_ready_s = timeouts.int("serveReadySeconds", 2400, lo=30, hi=4 * 3600)
    timeouts.done()
    keys = top.section("preflight")
    sync_weights = keys.bool("syncWeights", None)
    preflight = PreflightSpec(enabled=keys.bool("enabled", True), hash_weights=keys.bool("hashWeights", False),
                              timeout_s=keys.int("timeoutSeconds", 60, lo=5, hi=4 * 3600),
                              sync_weights=bool(sync_weights),
                              sync_timeout_s=keys.int("syncTimeoutSeconds", 3600, lo=10, hi=24 * 3600))
    if preflight.sync_weights and not preflight.enabled:
        raise keys.error("syncWeights", True, "false while preflight.enabled is false",
                         "is true, but the sync acts on what preflight finds, and preflight is off")
    keys.done()
    watchdog_keys = top.section("watchdog")
    watchdog = watchdog_config.parse(watchdog_keys, serve_ready_s)
    secrets = tuple(key for key in SECRET_KEYS if _secret(top, key, secret_keys))
    images = artifacts_config.images(top.section("images"), _secret(top, REGISTRY_SECRET, secret_keys))
    if images.pull != "none" and not preflight.enabled:
        raise top.section("images").error("pull", images.pull, "none while preflight.enabled is false",
                                          f"is {images.pull!r}, but which nodes pull is what preflight finds, and "
                                          "preflight is off")
    nodes = top.str_list("nodes", None)
    if nodes is not None and not nodes:
        raise top.error("nodes", [], "a non-empty list of the cluster's node names, the stack's head first")
    port_slot = top.int("portSlot", None, lo=0, hi=PORT_SLOTS - 1)
    nccl = top.section("nccl")
    host_nccl = nccl.bool("hostLibrary", False)
    if host_nccl and not preflight.enabled:
        raise nccl.error("hostLibrary", True, "false while preflight.enabled is false",
                         "is true, but where each host's library is and which file of the image it covers is what "
                         "preflight finds, and preflight is off")
    nccl.done()
    _refuse_flat_paths(top)
    top.done()
    return StackKeys(catalog, cluster, model, overrides, cluster_ready_s, serve_ready_s, preflight, keys, sync_weights,
                     secrets, images, watchdog, watchdog_keys, nodes, port_slot, top, host_nccl)


def top_section(config: Mapping[str, Any], secret_keys: set[str], stack_file: str) -> Section:
    """The stack file's `spark-vllm:*` keys as one section, the secret ones never shown."""
    _refuse_near_namespaces(config, stack_file)
    top = Section({k[len(NAMESPACE) + 1:]: v for k, v in config.items() if k.startswith(NAMESPACE + ":")},
                  stack_file, NAMESPACE, sep=":")
    top.secret_keys = {*SECRET_KEYS, REGISTRY_SECRET,
                       *(k[len(NAMESPACE) + 1:] for k in secret_keys if k.startswith(NAMESPACE + ":"))}
    return top


def _refuse_near_namespaces(config: Mapping[str, Any], stack_file: str) -> None:
    """`spark-vlm:cluster` is some other program's key to Pulumi, and would leave ours missing."""
    for key in config:
        namespace, _, rest = key.partition(":")
        if rest and namespace != NAMESPACE and closest(namespace, [NAMESPACE]):
            raise ConfigError(stack_file, key, None, f"keys under {NAMESPACE}:",
                              f"is not a {NAMESPACE} key (did you mean {NAMESPACE}:{rest}?)")


def _secret(top: Section, key: str, secret_keys: set[str]) -> bool:
    """Whether the secret `key` (`apiKey`, `hfToken`) is set: with --secret, on one line, sendable in an HTTP header."""
    value = top.str(key, None, accepted="a secret string")
    if value is None:
        return False
    if f"{NAMESPACE}:{key}" not in secret_keys:
        raise top.error(key, value, f"a secret: run `pulumi config set --secret {NAMESPACE}:{key} <value>`",
                        "is stored in plain text")
    if value != value.strip():
        raise top.error(key, value, "a value without them: HTTP drops them from a header, so no client could send it",
                        "starts or ends with a space")
    return True


def _refuse_flat_paths(top: Section) -> None:
    """`pulumi config set spark-vllm:serve.maxModelLen 8192` without --path sets a key named `serve.maxModelLen`."""
    for key in top.unknown():
        if isinstance(key, str) and "." in key and key.split(".")[0] in top._read:
            name, value = f"{NAMESPACE}:{key}", top.data[key]
            again = "<value>" if top.shown(key, value) is HIDDEN else shlex.quote(str(value))
            raise top.error(key, value, f"it set with --path: run `pulumi config rm {name}`, then "
                                        f"`pulumi config set --path {name} {again}`",
                            f"({top.shown(key, value)!r}) is not a known key: set without --path, the whole of "
                            f"{key!r} is one key's name")


def cluster(c: Section, name: str) -> ClusterSpec:
    ssh = c.section("ssh")
    user = ssh.user("user", "root")
    ssh_spec = SshSpec(key_file=ssh.str("keyFile", None), known_hosts_file=ssh.str("knownHostsFile", None),
                       strict_host_key_checking=ssh.choice("strictHostKeyChecking", ("yes", "accept-new", "no"),
                                                           "accept-new"),
                       control_persist_s=ssh.int("controlPersistSeconds", 60, lo=0, hi=24 * 3600))
    ssh.done()
    fabric_interface = c.interface("fabricInterface")
    ray = c.section("ray")
    ray_port = ray.port("port", 6379)
    dashboard_port = ray.port("dashboardPort", 8265)
    gpus_per_node = ray.int("gpusPerNode", 1, lo=1, hi=16)
    ray_ports = {flag: ray.port(key, default) for flag, (key, default) in RAY_PORTS.items()}
    ray_port_env = {var: ray.port(key, default) for var, (key, default) in RAY_PORT_ENV.items()}
    worker_ports = (ray.port("minWorkerPort", 10002), ray.port("maxWorkerPort", 19999))
    fabric_guard = ray.bool("fabricGuard", True)
    dashboard = ray.bool("dashboard", True)
    ray.done()
    mp = c.section("mp")
    master_port = mp.port("masterPort", 29501)
    mp.done()
    docker = c.section("docker")
    docker_gpus = docker.gpus("gpus", "all")
    rdma = docker.bool("rdma", True)
    shm_size_mb = docker.int("shmSizeMb", 10240, lo=64, hi=1 << 20)
    limits = docker.section("ulimits")
    ulimits = {name: limits.int(name, default, lo=-1, hi=1 << 62) for name, default in DEFAULT_ULIMITS.items()}
    limits.done()
    docker.done()
    env = _env(c, "each node's fabric address")
    hf_cache = c.abs_path("hfCache", "/root/.cache/huggingface")
    api = c.section("api")
    api_bind = api.ipv4("bind", "0.0.0.0")
    api_port = api.port("port", 8000)
    endpoint_host = api.host("endpointHost", None)
    api.done()
    preflight = c.section("preflight")
    gpu_probe = preflight.str("gpuProbe", None, accepted="a shell command that prints one `GPU <n>: <name>` line a GPU")
    preflight.done()
    node_sections = c.sections("nodes")
    nodes = [_node(n, user) for n in node_sections]
    c.done()

    _check_nodes(c, nodes)
    _check_ports(c, {"ray.port": ray_port, **({"ray.dashboardPort": dashboard_port} if dashboard else {}),
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
                       master_port=master_port, dashboard=dashboard)


def _node(n: Section, default_user: str) -> NodeSpec:
    name = n.name("name")
    role = n.choice("role", ("head", "worker"), "worker")
    ssh = n.section("ssh", required=True)
    spec = NodeSpec(name=name, head=role == "head", ssh_host=ssh.host("host"), ssh_port=ssh.port("port", 22),
                    ssh_user=ssh.user("user", default_user), via=ssh.name("via", None), fabric_ip=n.ipv4("fabricIp"),
                    env=_env(n, "the node's fabric address"))
    ssh.done()
    n.done()
    return spec


def _env(s: Section, pinned_to: str) -> dict[str, str]:
    """A cluster's or a node's extra environment: neither a pinned variable nor a secret in plain text."""
    env = s.env("env", {})
    for key, value in env.items():
        if key in PINNED_ENV:
            raise s.error(f"env.{key}", value, f"no value here: spark-vllm pins it to {pinned_to}",
                          f"is {value!r}, which would override a variable spark-vllm pins")
        if key in PLAIN_SECRET_ENV:
            secret = PLAIN_SECRET_ENV[key]
            raise s.error(f"env.{key}", value, f"no {key} here: run `pulumi config set --secret {NAMESPACE}:{secret} "
                                               f"<value>`, which reaches vLLM alone, never in plain text",
                          "would put a secret into the containers' environment, in plain text in the state")
    return env


def _check_nodes(c: Section, nodes: list[NodeSpec]) -> None:
    seen_names: dict[str, int] = {}
    seen_ips: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.name in seen_names:
            raise c.error(f"nodes[{i}].name", node.name, "a name used by no other node",
                          f"is {node.name!r}, the name of nodes[{seen_names[node.name]}] too")
        if node.fabric_ip in seen_ips:
            j = seen_ips[node.fabric_ip]
            raise c.error(f"nodes[{i}].fabricIp", node.fabric_ip, "a fabric IP used by no other node",
                          f"is {node.fabric_ip!r}, the fabric IP of nodes[{j}] ({nodes[j].name}) too")
        seen_names[node.name], seen_ips[node.fabric_ip] = i, i
    heads = [i for i, n in enumerate(nodes) if n.head]
    if len(heads) != 1:
        named = f" ({', '.join(nodes[i].name for i in heads)})" if heads else ""
        raise c.error("nodes", [nodes[i].name for i in heads], "exactly one node with `role: head`",
                      f"has {len(heads)} head nodes{named}")
    via = {n.name: n.via for n in nodes}
    others = {n.name: [m for m, hop in via.items() if hop is None and m != n.name] for n in nodes}
    jumps = [(i, n) for i, n in enumerate(nodes) if n.via is not None]

    def refuse(i: int, node: NodeSpec, problem: str) -> ConfigError:
        return c.error(f"nodes[{i}].ssh.via", node.via, "the name of a node reached directly, without ssh.via: "
                       + ", ".join(others[node.name]) if others[node.name] else "the name of a node reached directly, "
                       "but no other node is: reach one without ssh.via", f"is {node.via!r}, {problem}")

    for i, node in jumps:
        if node.via == node.name:
            raise refuse(i, node, "the node itself")
        if node.via not in via:
            raise refuse(i, node, "which is no node's name" + did_you_mean(node.via, others[node.name]))
    for i, node in jumps:
        hops = [node.name, str(node.via)]  # every node in `jumps` has a via
        while (hop := via[hops[-1]]) is not None and hops[-1] not in hops[:-1]:
            hops.append(hop)
        if hops[-1] in hops[:-1]:
            raise refuse(i, node, f"a cycle of jump hosts ({' -> '.join(hops[hops.index(hops[-1]):])})")
        if len(hops) > 2:
            raise refuse(i, node, f"which is itself reached via {via[hops[1]]} (one jump host at most)")


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


def serve(preset: Section, overrides: Section, model_name: str) -> ServeSpec:
    def pick(key: str) -> Section:
        """The stack's override if it sets `key`, else the preset: errors then blame the right file."""
        preset._read.add(key)
        return overrides if overrides.has(key) else preset

    spec = ServeSpec(image=pick("image").image("image"), model_path=pick("path").abs_path("path"),
                     served_name=pick("servedName").str("servedName", model_name),
                     tensor_parallel=pick("tensorParallel").int("tensorParallel", 1, lo=1, hi=64),
                     pipeline_parallel=pick("pipelineParallel").int("pipelineParallel", 1, lo=1, hi=64),
                     gpu_memory_utilization=pick("gpuMemoryUtilization").fraction("gpuMemoryUtilization", 0.85),
                     max_model_len=pick("maxModelLen").int("maxModelLen", None, lo=16, hi=1 << 24),
                     enforce_eager=pick("enforceEager").bool("enforceEager", True),
                     load_format=pick("loadFormat").load_format("loadFormat", "auto"),
                     max_num_seqs=pick("maxNumSeqs").int("maxNumSeqs", None, lo=1, hi=65536),
                     extra_args=_extra_args(pick("extraArgs")),
                     drop_page_cache=pick("dropPageCache").bool("dropPageCache", False),
                     executor=pick("executor").choice("executor", EXECUTORS, "ray"),
                     hub=artifacts_config.hub(preset, overrides))
    preset._read.add("hub")
    preset.done()
    overrides._read |= preset._read  # the stack may override any preset key
    overrides.done()
    return spec


def _extra_args(s: Section) -> tuple[str, ...]:
    """More `vllm serve` flags, each a whole list item; none that spark-vllm sets itself, none that carries a secret."""
    args = s.str_list("extraArgs", ())
    for i, arg in enumerate(args):
        key = f"extraArgs[{i}]"
        if arg == "" or "\0" in arg:
            raise s.error(key, arg, "a flag or a value",
                          "is empty" if arg == "" else f"is {arg!r}, with a NUL character")
        name = arg.split("=", 1)[0]
        if arg.strip().startswith("-") and name != "".join(name.split()):
            raise s.error(key, arg, "one flag an item, its value in the next item or after `=`, such as "
                                    "['--max-num-batched-tokens', '8192']",
                          f"is {arg!r}, with a space in the flag, so vLLM reads it as one unknown word")
        flag = serve_flags.flag(arg)
        if flag in serve_flags.SECRET:
            secret = serve_flags.SECRET[flag]
            raise s.error(key, serve_flags.shown(arg),
                          f"no {flag} here: run `pulumi config set --secret {NAMESPACE}:{secret} <value>`, which "
                          "reaches vLLM in its environment, never on a command line",
                          f"is {serve_flags.shown(arg)!r}, which would put a secret on the serve's command line, in "
                          "plain text in the state")
        if flag is not None:
            source = serve_flags.OWNED[flag]
            read_as = "" if arg.split("=", 1)[0] == flag else f" (vLLM reads it as {flag})"
            raise s.error(key, arg, f"no {flag} in extraArgs" + (f": set {source} instead" if source else ""),
                          f"is {arg!r}{read_as}: spark-vllm sets {flag} "
                          + (f"from {source}" if source else "itself, to run vLLM across its nodes")
                          + ", and vLLM keeps the last of a repeated flag")
    return args


def fixed_ports(cluster: ClusterSpec) -> dict[int, str]:
    """Every fixed port the nodes open, by config key."""
    return {cluster.ray_port: "ray.port", cluster.dashboard_port: "ray.dashboardPort",
            **{port: f"ray.{RAY_PORTS[flag][0]}" for flag, port in cluster.ray_ports.items()},
            **{port: f"ray.{RAY_PORT_ENV[var][0]}" for var, port in cluster.ray_port_env.items()},
            cluster.master_port: "mp.masterPort", cluster.api_port: "api.port"}


def world_size(cluster: ClusterSpec, serve: ServeSpec, stack_file: str) -> None:
    """vLLM takes one GPU a rank: tensor x pipeline parallel must be every GPU of the stack's nodes."""
    world = serve.tensor_parallel * serve.pipeline_parallel
    if world == cluster.total_gpus:
        return
    names = ", ".join(n.name for n in cluster.nodes)
    accepted = (f"{cluster.total_gpus} (the GPUs of this stack's nodes in cluster {cluster.name!r}, {names}: "
                f"{len(cluster.nodes)} x {cluster.gpus_per_node})")
    wanted, rest = divmod(world, cluster.gpus_per_node)
    if not rest and 0 < wanted <= len(cluster.nodes) + len(cluster.jump_hosts):
        accepted += f", or a `{NAMESPACE}:nodes` list of {wanted} of the cluster's nodes"
    raise ConfigError(stack_file, f"{NAMESPACE}:serve.tensorParallel x pipelineParallel", world, accepted,
                      f"is {serve.tensor_parallel} x {serve.pipeline_parallel} = {world}")
