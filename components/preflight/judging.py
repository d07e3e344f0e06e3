"""Preflight's judgement: every node's facts -> findings, one a node and check (pure, so every message is
unit-tested)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from ..config.spec import Deployment, NodeSpec
from ..nodes import image_plan
from ..nodes.hub_plan import HubPlan
from ..nodes.image_plan import Action, ImagePlan
from ..nodes.load_floor import node_floor
from ..nodes.node_facts import GpuSource, InsideImage, NodeFacts
from ..nodes.weight_manifests import WEIGHT_SUFFIXES, weight_bytes
from ..resources.fabric_guard import GuardState, chain_name, guard_state
from ..resources.mp_rank import container_name as rank_container_name
from ..resources.ray_node import container_name
from ..text import size
from .artifact_checks import check_hub, check_image, check_space, check_weights
from .findings import Finding, Reference, Status, could_not
from .liveness import Lives

GIB = 1 << 30
# Another stack's ports: its slot (components/config/placement.py) moves every one of this stack's at once.
OWN_SLOT = ", or give this stack a spark-vllm:portSlot of its own (docs/placement.md)"
# On a GB10 about 101-102 GiB of 121.69 GiB is free at boot, and vLLM refuses to start when the requested share
# is not free: 0.87 fails there, 0.85 (the reference stack) works.
UNIFIED_UTILIZATION_LIMIT = 0.86
# CUDA graph capture needs headroom beyond the KV cache; the seed's load was killed at 95 % without eager mode.
EAGER_OFF_UTILIZATION_LIMIT = 0.80
OVERHEAD_BYTES_PER_GPU = 4 * GIB  # CUDA context, activations and NCCL buffers: a rough estimate
CHECKS = ("ssh+docker", "gpus", "fabric", "image", "ray+vllm", "architecture", "loader", "nccl", "hub", "weights",
          "space", "disk", "memory", "ports", "guard", "running")
# The package each load format imports (vLLM 0.33's model_loader/weight_utils.py), and how it gets into an image.
LOADER_NEEDS = {
    "fastsafetensors": ("fastsafetensors", "pip install fastsafetensors"),
    "instanttensor": ("instanttensor", "pip install vllm[instanttensor]"),
    "runai_streamer": ("runai_model_streamer", "pip install runai-model-streamer"),
    "runai_streamer_sharded": ("runai_model_streamer", "pip install runai-model-streamer"),
    "tensorizer": ("tensorizer", "pip install tensorizer"),
}


def ssh_target(node: NodeSpec) -> str:
    port = "" if node.ssh_port == 22 else f" -p {node.ssh_port}"
    return f"ssh {node.ssh_user}@{node.ssh_host}{port}" + (f" via {node.via}" if node.via else "")


def evaluate(deployment: Deployment, by_node: dict[str, NodeFacts], lives: Lives, hub: Optional[HubPlan] = None,
             images: Optional[ImagePlan] = None) -> list[Finding]:
    """Every node's findings; `hub` is the Hub download's plan (with `serve.hub`), `images` the image's (computed here
    when not given)."""
    cluster = deployment.cluster
    findings = [check_ssh(node, by_node[node.name]) for node in cluster.nodes]
    reachable = {name: facts for name, facts in by_node.items() if facts.reachable}
    images = images if images is not None else image_plan.plan(deployment, reachable)
    reference = reachable.get(images.reference) if images.reference else None
    ref_model = _reference(deployment, reachable, lambda facts: facts.model is not None and facts.model.exists)
    for node in (n for n in cluster.nodes if n.name in reachable):
        facts = reachable[node.name]
        # A node that receives a copy will hold the reference's image: what is inside it is judged from there.
        inside = facts
        if images.action(node.name) is Action.COPY and reference is not None:
            inside = dataclasses.replace(facts, image=reference.image)
        findings += [check_gpus(deployment, node, facts), check_fabric(deployment, node, facts, reachable),
                     check_image(deployment, node, facts, images, reference), check_runtime(deployment, node, inside),
                     check_architecture(deployment, node, inside, hub), check_loader(deployment, node, inside),
                     check_nccl(deployment, node, facts, inside),
                     check_weights(deployment, node, facts, ref_model, hub, reachable.get(deployment.source.name)),
                     check_space(deployment, node, facts, hub, images, reference),
                     check_disk(deployment, node, facts), check_memory(deployment, node, facts, ref_model, hub)]
        if hub is not None and node.name == deployment.source.name:
            findings.append(check_hub(deployment, node, hub, _huggingface_hub(inside, reference)))
        if node.head:
            findings.append(check_ports(deployment, node, facts))
        if cluster.fabric_guard:
            findings.append(check_guard(deployment, node, facts))
        findings.append(check_running(node, facts, lives))
    order = {name: i for i, name in enumerate(CHECKS)}
    nodes_order = {n.name: i for i, n in enumerate(cluster.nodes)}
    return sorted(findings, key=lambda x: (nodes_order[x.node], order[x.check]))


def _huggingface_hub(facts: NodeFacts, reference: Optional[NodeFacts]) -> Optional[str]:
    """The huggingface_hub version in the image the download runs in, "" when it has none, None when unknown."""
    for holder in (facts, reference):
        inside = holder.image.inside if holder is not None and holder.image is not None else None
        if inside is not None and inside.error is None:
            return inside.huggingface_hub
    return None


def _reference(deployment: Deployment, reachable: dict[str, NodeFacts], has) -> Reference:
    """The node others are compared with: the weights' source (the head, or the Hub download's node) when it has
    the thing, else the first node that does."""
    source = deployment.source.name
    for node in sorted(deployment.cluster.nodes, key=lambda n: n.name != source):
        if node.name in reachable and has(reachable[node.name]):
            return node.name, reachable[node.name]
    return None


def check_ssh(node: NodeSpec, facts: NodeFacts) -> Finding:
    check, target = "ssh+docker", ssh_target(node)
    if facts.ssh_error is not None:
        hop = f" and that {node.via} can reach {node.ssh_host}" if node.via else ""
        return Finding(node.name, check, Status.FAIL, f"{target} {facts.ssh_error}; the other checks did not run there",
                       f"check the host, user and key in the cluster catalog{hop}")
    if facts.probe_error is not None:
        return could_not(node.name, check, f"{facts.probe_error}, so no check ran there",
                          "install python3 on the node, or set spark-vllm:preflight.enabled to false")
    docker = facts.docker
    if docker.unavailable:
        return Finding(node.name, check, Status.FAIL, f"docker: {docker.unavailable}",
                       "install Docker with the NVIDIA container runtime")
    if docker.error is not None:
        denied = "permission denied" in docker.error.lower()
        return Finding(node.name, check, Status.FAIL, f"Docker does not answer: {docker.error}",
                       f"add {node.ssh_user} to the docker group (`sudo usermod -aG docker {node.ssh_user}`)" if denied
                       else "start the Docker daemon (`sudo systemctl start docker`)")
    slowest = max(facts.timings.items(), key=lambda item: item[1], default=None)
    return Finding(node.name, check, Status.OK,
                   f"{target}; Docker {docker.server}, storage driver {docker.driver}; "
                   f"probe took {facts.seconds:.1f} s" + (f", the {slowest[0]} facts {slowest[1]:.1f} s of it"
                                                          if slowest else ""))


GPU_SOURCES = {GpuSource.NVIDIA_SMI: "nvidia-smi -L",
               GpuSource.GPU_PROBE: "preflight.gpuProbe of the cluster catalog, a stand-in for nvidia-smi -L",
               GpuSource.RUNTIME: "nvidia-smi -L through the NVIDIA container runtime"}


def check_gpus(deployment: Deployment, node: NodeSpec, facts: NodeFacts) -> Finding:
    gpus, want = facts.gpus, deployment.cluster.gpus_per_node
    if gpus.unavailable or gpus.source is None:
        return could_not(node.name, "gpus", gpus.unavailable or "no GPU facts",
                          "install the NVIDIA driver's nvidia-smi on the node")
    source = GPU_SOURCES[gpus.source]
    if gpus.error is not None:
        return Finding(node.name, "gpus", Status.FAIL, f"{source} failed: {gpus.error}",
                       "check the NVIDIA driver: run nvidia-smi on the node")
    names = gpus.names
    counted = f"{len(names)} GPU{'s' if len(names) != 1 else ''}" + (f" ({', '.join(names)})" if names else "")
    if len(names) < want:
        return Finding(node.name, "gpus", Status.FAIL, f"{counted} from {source}; ray.gpusPerNode is {want}",
                       "check the NVIDIA driver (nvidia-smi), or lower ray.gpusPerNode")
    return Finding(node.name, "gpus", Status.OK, f"{counted} from {source}")


def _unified(facts: NodeFacts) -> bool:
    """A GB10 (DGX Spark): the GPU and the CPU share the node's memory."""
    return any("GB10" in name for name in facts.gpus.names)


def _ips(cidrs: tuple[str, ...]) -> list[str]:
    return [cidr.split("/")[0] for cidr in cidrs]


def check_fabric(deployment: Deployment, node: NodeSpec, facts: NodeFacts, reachable: dict[str, NodeFacts]) -> Finding:
    cluster = deployment.cluster
    fabric, iface, ip = facts.fabric, cluster.fabric_interface, node.fabric_ip
    if fabric.unavailable:
        return could_not(node.name, "fabric", fabric.unavailable, "install iproute2 on the node")
    if not fabric.exists:
        return Finding(node.name, "fabric", Status.FAIL,
                       f"{iface} does not exist (interfaces: {', '.join(sorted(fabric.addrs))})",
                       "set fabricInterface in the cluster catalog to the fabric port (`ibdev2netdev` shows it)")
    if not fabric.up:
        return Finding(node.name, "fabric", Status.FAIL, f"{iface} is {fabric.state.lower()}",
                       f"bring it up (`sudo ip link set {iface} up`) and check the cable")
    held = fabric.addrs.get(iface, ())
    if ip not in _ips(held):
        elsewhere = [name for name, cidrs in fabric.addrs.items() if ip in _ips(cidrs)]
        where = f"; {ip} is on {elsewhere[0]}, not the fabric" if elsewhere else ""
        fix = (f"set {node.name}'s fabricIp to {_ips(held)[0]} in the cluster catalog, or add {ip} to {iface}"
               if held else f"add {ip} to {iface} (`sudo ip addr add {ip}/24 dev {iface}`)")
        return Finding(node.name, "fabric", Status.FAIL,
                       f"{iface} holds {', '.join(held) or 'no IPv4 address'}, not fabricIp {ip}{where}", fix)
    problems = []
    for peer in cluster.nodes:
        route = fabric.routes.get(peer.name)
        if route is None:
            continue
        if route.error is not None:
            problems.append((f"no route to {peer.name} ({peer.fabric_ip}): {route.error}",
                             f"give {iface} an address in {peer.name}'s fabric subnet"))
        elif route.dev != iface:
            problems.append((f"traffic to {peer.name} ({peer.fabric_ip}) leaves through {route.dev} "
                             f"(from {route.src}), not {iface}: Ray and NCCL would use the management network, "
                             f"the seed's first failure",
                             f"give {iface} an address in {peer.name}'s fabric subnet, or fix {peer.name}'s fabricIp"))
        elif route.src != ip:
            problems.append((f"traffic to {peer.name} ({peer.fabric_ip}) leaves {iface} from {route.src}, "
                             f"not fabricIp {ip}", f"make {ip} the primary address of {iface}"))
        elif route.reach is not None and not route.reach.unavailable and not route.reach.small and \
                not route.reach.full:
            problems.append((f"{peer.name} ({peer.fabric_ip}) does not answer a ping over {iface}"
                             + (f" ({route.reach.error})" if route.reach.error else ""),
                             f"check the cable between {node.name} and {peer.name}, and that {peer.name}'s "
                             f"{iface} is up with {peer.fabric_ip}"))
    if problems:
        return Finding(node.name, "fabric", Status.FAIL, "; ".join(p for p, _ in problems),
                       "; ".join(dict.fromkeys(fix for _, fix in problems)))
    mine = next(cidr for cidr in held if cidr.split("/")[0] == ip)
    peers = [p.name for p in cluster.nodes if p.name in fabric.routes]
    reason = f"{iface} up, {mine}, MTU {fabric.mtu}" + (f"; routes to {', '.join(peers)} leave through it"
                                                        if peers else "")
    reaches = {name: fabric.routes[name].reach for name in peers}
    answered = [name for name, r in reaches.items() if r is not None and r.full]
    if answered:
        reason += f"; {', '.join(answered)} answer{'s' if len(answered) == 1 else ''} a {fabric.mtu}-byte packet " \
                  "unfragmented"
    short = [name for name, r in reaches.items() if r is not None and not r.unavailable and not r.full]
    if short:
        return Finding(node.name, "fabric", Status.WARN,
                       f"{reason}; but a {fabric.mtu}-byte packet, fragmentation off, does not pass to "
                       f"{', '.join(short)} where a small one does: the path's MTU is below {iface}'s",
                       f"set the same MTU (9000 on Sparks) on {iface} of every node, and on any switch between")
    missing = {name: r.unavailable for name, r in reaches.items() if r is not None and r.unavailable}
    if missing:
        verb = "answers" if len(missing) == 1 else "answer"
        return could_not(node.name, "fabric", f"{reason}; whether {', '.join(missing)} {verb}: "
                                              f"{next(iter(missing.values()))}", "install ping (iputils-ping)")
    head = reachable[cluster.head.name].fabric if cluster.head.name in reachable else None
    if not node.head and head is not None and head.exists and head.mtu != fabric.mtu:
        return Finding(node.name, "fabric", Status.WARN, f"{reason}; but {cluster.head.name}'s MTU is {head.mtu}",
                       f"set the same MTU (9000 on Sparks) on {iface} of every node")
    return Finding(node.name, "fabric", Status.OK, reason)


def check_runtime(deployment: Deployment, node: NodeSpec, facts: NodeFacts) -> Finding:
    image = facts.image
    inside = image.inside if image is not None else None
    if image is None or inside is None:
        why = ("Docker does not answer" if image is None else image.unavailable if image.unavailable
               else "the image is not on the node")
        return could_not(node.name, "ray+vllm", why)
    if inside.error is not None:
        return Finding(node.name, "ray+vllm", Status.FAIL,
                       f"python3 does not run in {deployment.serve.image}: {inside.error}",
                       "use an image with python3, Ray and vLLM")
    problems = []
    mp = deployment.serve.executor == "mp"
    if inside.ray_error is not None and not mp:
        problems.append((f"the image has no Ray ({inside.ray_error})",
                         "use `executor: mp` (vLLM's own executor, no Ray), or an image with Ray "
                         "(`pip install ray[default]`): NGC vLLM images from 26.04 on lack it"))
    if inside.vllm_error is not None:
        problems.append((f"the image has no working vLLM ({inside.vllm_error})", "use a vLLM image"))
    elif mp and inside.serve_nnodes is False:
        problems.append(("the image's `vllm serve` takes no --nnodes, so its vLLM cannot run the mp executor "
                         "across nodes", "use a newer vLLM image, or `executor: ray` with an image that has Ray"))
    if problems:
        return Finding(node.name, "ray+vllm", Status.FAIL, "; ".join(p for p, _ in problems),
                       "; ".join(fix for _, fix in problems))
    if mp and inside.serve_nnodes is None:
        return could_not(node.name, "ray+vllm", f"`vllm serve --help` did not run in the image "
                                                 f"({inside.serve_help_error or 'no answer'})")
    if mp:
        return Finding(node.name, "ray+vllm", Status.OK, f"vllm {inside.vllm}, `serve` takes --nnodes (mp: no Ray "
                                                         "needed)")
    return Finding(node.name, "ray+vllm", Status.OK, f"ray {inside.ray}, vllm {inside.vllm}")


def check_architecture(deployment: Deployment, node: NodeSpec, facts: NodeFacts,
                       hub: Optional[HubPlan] = None) -> Finding:
    """The model's architectures, from its config.json (or, before a Hub download, the Hub's copy of it), against
    the registry of the image's vLLM: refused here, before any restart or download."""
    model, path = facts.model, deployment.serve.model_path
    inside = facts.image.inside if facts.image is not None else None
    config_file = f"{path}/config.json"
    hub_config = hub.config if hub is not None and hub.error is None else None
    if model is not None and model.unavailable:
        return could_not(node.name, "architecture", model.unavailable)
    if (model is None or not model.exists or model.config is None) and hub_config is not None:
        archs, origin = hub_config.get("architectures") or [], "from the Hub's config.json, before the download"
    elif model is None or not model.exists:
        return could_not(node.name, "architecture", f"{path} is not on the node")
    elif model.config is None:
        return Finding(node.name, "architecture", Status.FAIL, f"{config_file} is missing",
                       "copy the complete checkpoint, config.json included")
    else:
        archs, origin = model.config.get("architectures") or [], "from config.json"
    if not archs:
        return Finding(node.name, "architecture", Status.FAIL, f"{config_file} names no architectures",
                       "use a Hugging Face checkpoint whose config.json lists its architectures")
    if inside is None or inside.archs is None:
        return could_not(node.name, "architecture", "the image's vLLM registry could not be read")
    if not set(archs) & set(inside.archs):
        return Finding(node.name, "architecture", Status.FAIL,
                       f"{', '.join(archs)} ({origin}) is not in the registry of the image's vLLM {inside.vllm}",
                       f"use an image whose vLLM supports {archs[0]}, or another model")
    return Finding(node.name, "architecture", Status.OK, f"{', '.join(archs)} is supported by vLLM {inside.vllm}")


def check_loader(deployment: Deployment, node: NodeSpec, facts: NodeFacts) -> Finding:
    """The load format is one the image's vLLM has, and the package it imports is in the image: refused here, before
    any restart, rather than by the serve once the old one is stopped."""
    fmt, image = deployment.serve.load_format, deployment.serve.image
    inside = facts.image.inside if facts.image is not None else None
    if inside is None or inside.error is not None or inside.vllm_error is not None:
        return could_not(node.name, "loader", "the image's vLLM did not start (see ray+vllm)")
    if inside.load_formats is None:
        return could_not(node.name, "loader", f"vLLM {inside.vllm} does not list its load formats "
                                               f"({inside.load_formats_error})")
    if fmt not in inside.load_formats:
        return Finding(node.name, "loader", Status.FAIL, f"vLLM {inside.vllm} in {image} has no load format {fmt}",
                       f"use one it has ({', '.join(inside.load_formats)}), or an image whose vLLM has {fmt}")
    if fmt not in LOADER_NEEDS:
        return Finding(node.name, "loader", Status.OK, f"{fmt} is a load format of vLLM {inside.vllm}")
    package, install = LOADER_NEEDS[fmt]
    found = inside.loader_packages.get(package)
    if found is None:
        return could_not(node.name, "loader", f"the image was not asked for `{package}`")
    if not found.installed:
        other = "fastsafetensors" if fmt != "fastsafetensors" and _imports(inside, "fastsafetensors") else "auto"
        return Finding(node.name, "loader", Status.FAIL,
                       f"{image} has no `{package}` package, which load format {fmt} needs",
                       f"{install} into the image, or use loadFormat {other}")
    if found.error is not None:
        return Finding(node.name, "loader", Status.WARN,
                       f"`{package}` is in {image} but did not import without a GPU ({found.error}); the load will "
                       f"tell")
    version = f" {found.version}" if found.version else ""
    return Finding(node.name, "loader", Status.OK, f"{fmt}: `{package}`{version} imports in vLLM {inside.vllm}'s image")


def check_nccl(deployment: Deployment, node: NodeSpec, facts: NodeFacts, inside_facts: NodeFacts) -> Finding:
    """Both NCCL libraries of the node, by version and build ID, and which one the serve uses. With
    nccl.hostLibrary, a node whose host has none, or whose image has no pip NCCL for it to cover, is refused."""
    host = facts.nccl
    inside = inside_facts.image.inside if inside_facts.image is not None else None
    pip = inside.nccl if inside is not None else None
    host_text = ("the host's not read" if host is None else "the host has none" if host.missing else
                 f"the host's not read ({host.unavailable or host.error})" if host.unavailable or host.error else
                 f"host {host.describe()}")
    pip_text = ("the image's not read (see ray+vllm)" if inside is None or inside.error is not None else
                f"the image's not read ({inside.nccl_error})" if inside.nccl_error else
                "the image has no pip NCCL" if pip is None else
                f"the image's not read ({pip.error})" if pip.error else f"image {pip.describe()}")
    same_version = (host is not None and pip is not None and host.version and host.version == pip.version
                    and host.build_id != pip.build_id)
    facts_text = f"{host_text}; {pip_text}" + ("; one version, two builds" if same_version else "")
    if not deployment.host_nccl:
        return Finding(node.name, "nccl", Status.OK, f"{facts_text}; the serve uses the image's")
    off = "or set spark-vllm:nccl.hostLibrary false"
    if host is None or host.unavailable:
        return could_not(node.name, "nccl", host.unavailable or "no answer" if host else "no answer", off)
    if host.missing or host.error:
        return Finding(node.name, "nccl", Status.FAIL,
                       f"nccl.hostLibrary is on, but {host_text} (`ldconfig -p` lists no libnccl.so.2)"
                       if host.missing else f"nccl.hostLibrary is on, but {host_text}",
                       f"install NCCL on the host (DGX OS: the libnccl2 package), {off}")
    if inside is None and (inside_facts.image is None or not inside_facts.image.present):
        return Finding(node.name, "nccl", Status.FAIL,
                       "nccl.hostLibrary is on, but the image is on no node yet to find its pip NCCL in (this `up` "
                       "pulls it)", f"deploy once with the setting off, then turn it on, {off}")
    if inside is None or inside.error is not None or inside.nccl_error:
        return could_not(node.name, "nccl", pip_text, off)
    if pip is None or pip.error:
        return Finding(node.name, "nccl", Status.FAIL,
                       f"nccl.hostLibrary is on, but {pip_text}: there is no library of vLLM's pip packages to cover",
                       f"use an image whose vLLM brings NCCL with pip (nvidia-nccl-cu*), {off}")
    return Finding(node.name, "nccl", Status.OK, f"{facts_text}; the serve uses the host's (nccl.hostLibrary), "
                                                 f"mounted read-only over {pip.path}")


def _imports(inside: InsideImage, package: str) -> bool:
    found = inside.loader_packages.get(package)
    return found is not None and found.installed and found.error is None


def check_disk(deployment: Deployment, node: NodeSpec, facts: NodeFacts) -> Finding:
    """The floor of a load on this node: its weights over its disk's read speed, past the page cache."""
    disk = facts.disk
    if disk is None:
        return could_not(node.name, "disk", f"{deployment.serve.model_path} is not on the node")
    if disk.unavailable:
        return could_not(node.name, "disk", disk.unavailable)
    weights, seconds = weight_bytes(facts.model), node_floor(facts)
    return Finding(node.name, "disk", Status.OK,
                   f"reads {disk.bytes_per_second / 1e9:.2f} GB/s past the page cache ({size(disk.bytes)} of "
                   f"{disk.file} in {disk.seconds:.2f} s), so loading its {size(weights or 0)} of weights takes at "
                   f"least {seconds or 0:.1f} s")


def kv_bytes_per_token(config: Mapping[str, Any]) -> Optional[int]:
    """K and V of every layer for one token, 16-bit, across the whole model; None when config.json lacks the shape."""
    layers, heads = config.get("num_hidden_layers"), config.get("num_key_value_heads")
    head_dim = config.get("head_dim")
    if head_dim is None and config.get("hidden_size") and config.get("num_attention_heads"):
        head_dim = config["hidden_size"] // config["num_attention_heads"]
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(head_dim, int)):
        return None
    return 2 * layers * heads * head_dim * 2


def check_memory(deployment: Deployment, node: NodeSpec, facts: NodeFacts, ref: Reference,
                 hub: Optional[HubPlan] = None) -> Finding:
    serve, cluster, memory = deployment.serve, deployment.cluster, facts.memory
    if memory.unavailable:
        return could_not(node.name, "memory", memory.unavailable)
    shared = _shared(deployment, node, facts)
    if shared is not None and shared.status is Status.FAIL:
        return shared
    model = ref[1].model if ref is not None else None
    total_weights, config = (weight_bytes(model), model.config) if model is not None else (None, None)
    if hub is not None and hub.selection is not None:
        # What the nodes hold once the download is done, as the Hub (or its record) lists the files.
        total_weights = sum(f.size for f in hub.selection.fetched if f.path.endswith(WEIGHT_SUFFIXES))
        config = config or hub.config
    if not total_weights:
        return could_not(node.name, "memory", "no node has the weights, so their size is unknown")
    world = serve.tensor_parallel * serve.pipeline_parallel
    share = cluster.gpus_per_node / world  # this node's part of the weights and of the KV cache
    weights = total_weights * share
    config = config or {}
    max_len = serve.max_model_len or config.get("max_position_embeddings")
    per_token = kv_bytes_per_token(config)
    kv = per_token * max_len * share if per_token and isinstance(max_len, int) else 0
    overhead = OVERHEAD_BYTES_PER_GPU * cluster.gpus_per_node
    need, total, util = weights + kv + overhead, memory.total_kib * 1024, serve.gpu_memory_utilization
    budget = total * util
    kv_part = f"KV for one {max_len}-token sequence {size(kv)}" if kv else "KV not estimated"
    reason = (f"needs about {size(need)} (weights {size(weights)}, {kv_part}, overhead {size(overhead)}) "
              f"of {size(budget)} ({util:g} x {size(total)})")
    if need > budget:
        return Finding(node.name, "memory", Status.FAIL, f"{reason}: it does not fit",
                       "spread the model over more nodes, or lower maxModelLen, or raise gpuMemoryUtilization "
                       f"(at most {UNIFIED_UTILIZATION_LIMIT} on a GB10)")
    warnings = []
    if _unified(facts) and util > UNIFIED_UTILIZATION_LIMIT:
        warnings.append((f"gpuMemoryUtilization {util:g} is above {UNIFIED_UTILIZATION_LIMIT} on a unified-memory "
                         f"GB10: only about 101-102 GiB of 121.69 GiB is free at boot, so vLLM's start-up check fails",
                         f"set spark-vllm:serve.gpuMemoryUtilization to {UNIFIED_UTILIZATION_LIMIT - 0.01:g}"))
    if not serve.enforce_eager and util > EAGER_OFF_UTILIZATION_LIMIT:
        warnings.append((f"enforceEager is off at gpuMemoryUtilization {util:g}: CUDA graph capture needs headroom "
                         f"(the seed's load was killed at 95 % memory)",
                         f"set spark-vllm:serve.enforceEager to true, or gpuMemoryUtilization to at most "
                         f"{EAGER_OFF_UTILIZATION_LIMIT:g}"))
    if shared is not None:
        reason += f"; {shared.reason}"
    if warnings:
        return Finding(node.name, "memory", Status.WARN, "; ".join([reason, *(w for w, _ in warnings)]),
                       "; ".join(fix for _, fix in warnings))
    return Finding(node.name, "memory", Status.OK, reason)


def _shared(deployment: Deployment, node: NodeSpec, facts: NodeFacts) -> Optional[Finding]:
    """The other stacks deployed on the node, by the claims they left there, added to this one: on unified memory
    each vLLM's fraction is of the whole node, and vLLM's start-up check fails when they add up past what is free.
    None when no other stack is deployed here."""
    claims = facts.claims
    found = claims.by_stack if claims is not None and not claims.unavailable else {}
    others = {s: f for s, f in found.items() if s != deployment.stack}
    if not others:
        return None
    util = deployment.serve.gpu_memory_utilization
    unified = _unified(facts)
    limit = UNIFIED_UTILIZATION_LIMIT if unified else 1.0
    taken = sum(others.values())
    total = util + taken
    sums = " + ".join(f"{f:.2f} ({s}, deployed)" for s, f in sorted(others.items()))
    sums += f" + {util:.2f} (this stack) = {total:.2f}"
    if total <= limit + 1e-9:
        return Finding(node.name, "memory", Status.OK, f"shared: {sums}, within {limit:g}")
    room = limit - taken
    names = sorted(others)
    fix = (f"lower spark-vllm:serve.gpuMemoryUtilization to at most {room:.2f}, or " if room > 0.005 else "") + \
        f"destroy {'stack' if len(names) == 1 else 'stacks'} {', '.join(names)} first, or put this stack on other " \
        "nodes (spark-vllm:nodes)"
    kind = "the unified-memory limit" if unified else "the GPU's memory"
    return Finding(node.name, "memory", Status.FAIL, f"{sums} > {limit:g}, {kind}", fix)


def check_ports(deployment: Deployment, node: NodeSpec, facts: NodeFacts) -> Finding:
    ports, cluster = facts.ports, deployment.cluster
    if ports is None or ports.unavailable:
        return could_not(node.name, "ports", (ports.unavailable if ports else None) or "the probe listed no ports",
                          "install iproute2 (ss) on the node")
    names = cluster.head_ports
    own_names = {name for n in cluster.nodes
                 for name in (container_name(deployment.stack, n), rank_container_name(deployment.stack, cluster, n))}
    status, reasons = Status.OK, []
    fixes: dict[str, list[str]] = {}  # what to do -> the keys whose change would do instead, once each
    for port, (what, key) in names.items():
        state, label = ports.by_port[port], f"{port} ({what})"
        if state.free:
            reasons.append(f"{label} free")
            continue
        if state.hidden:
            # Not root: `docker ps` names the stacks running here, and one of them is taken to hold the port.
            others = [c for c in state.running if c.stack != deployment.stack and c.container not in own_names]
            mine = [c for c in state.running if c not in others]
            if others:
                status = Status.FAIL
                stacks = sorted({c.stack for c in others})
                named = f"stack {stacks[0]} runs" if len(stacks) == 1 else f"stacks {', '.join(stacks)} run"
                reasons.append(f"{label} is in use while {named} here ({', '.join(c.container for c in others)}; "
                               "ss names a port's owner only to root)")
                fixes.setdefault(f"destroy {'that stack' if len(stacks) == 1 else 'those stacks'} first ("
                                 + ", ".join(f"`pulumi destroy -s {stack}`" for stack in stacks) + ")" + OWN_SLOT, [])
            elif mine:
                reasons.append(f"{label} in use while this stack's {mine[0].container} runs")
            else:
                status = Status.FAIL if status is Status.FAIL else Status.WARN
                reasons.append(f"could not check: {label} is in use, and ss shows its owner only to root")
                fixes.setdefault(f"see who holds it: `sudo ss -tlnp 'sport = :{port}'`", [])
            continue
        holders = [h for h in state.holders if not h.exiting]
        if not holders:
            reasons.append(f"{label} free (its holder, pid {state.holders[0].pid}, exited as it was checked)")
            continue
        ours = [h.stack == deployment.stack or h.container in own_names for h in holders]
        if all(ours):
            reasons.append(f"{label} held by this stack's {holders[0].container}")
            continue
        holder = holders[ours.index(False)]
        status = Status.FAIL
        if holder.stack:
            reasons.append(f"{label} is held by {holder.process} (pid {holder.pid}) in {holder.container} of stack "
                           f"{holder.stack}")
            fixes.setdefault(f"destroy that stack first (`pulumi destroy -s {holder.stack}`){OWN_SLOT}", [])
        elif holder.container:
            reasons.append(f"{label} is held by {holder.process} (pid {holder.pid}) in container {holder.container}")
            fixes.setdefault(f"stop it (`docker stop {holder.container}`)", []).append(key)
        else:
            reasons.append(f"{label} is held by {holder.process} (pid {holder.pid}), outside any container")
            fixes.setdefault(f"stop pid {holder.pid}", []).append(key)
    return Finding(node.name, "ports", status, "; ".join(reasons), "; ".join(
        action + (f", or change {' or '.join(keys)}" if keys else "") for action, keys in fixes.items()))


def check_guard(deployment: Deployment, node: NodeSpec, facts: NodeFacts) -> Finding:
    cluster, guard = deployment.cluster, facts.guard
    if guard is not None and guard.unavailable:
        # What stops the check (no iptables, no passwordless sudo) would stop `up` at the guard: fail here, first.
        return Finding(node.name, "guard", Status.FAIL,
                       f"could not check: {guard.unavailable}; `up` could not apply the guard either",
                       f"let {node.ssh_user} run iptables with `sudo -n` (or install iptables), or set "
                       f"ray.fabricGuard: false")
    hooked = guard.hooked if guard is not None else None
    state, chain = guard_state(deployment.stack, cluster, hooked), chain_name(deployment.stack, cluster)
    if state is GuardState.IN_PLACE:
        return Finding(node.name, "guard", Status.OK,
                       f"Ray's ports are closed to all but {cluster.fabric_interface} and loopback (chain {chain})")
    if state is GuardState.STALE and hooked:
        return Finding(node.name, "guard", Status.OK,
                       f"chain {', '.join(hooked)} guards other ports; `up` puts {chain} in first, then removes it")
    return Finding(node.name, "guard", Status.OK, f"the rules that close Ray's ports to all but "
                                                  f"{cluster.fabric_interface} are not in place; `up` applies them")


def check_running(node: NodeSpec, facts: NodeFacts, lives: Lives) -> Finding:
    """What of the deployment runs here; what died since the last `up` is a warning, as `up` recreates it."""
    running = facts.running
    if running is None:
        return could_not(node.name, "running", "Docker does not answer")
    if running.unavailable:
        # Unknown is not dead: restarting everything on a hiccup would be worse than stopping here.
        return Finding(node.name, "running", Status.FAIL, f"could not read what runs: {running.unavailable}",
                       "check Docker on the node, then run again")
    dead, alive = lives.dead.get(node.name, ()), lives.alive.get(node.name, ())
    if dead:
        return Finding(node.name, "running", Status.WARN, "; ".join(dead + alive),
                       "`pulumi up` recreates what died, and what depends on it")
    return Finding(node.name, "running", Status.OK, "; ".join(alive) or "nothing of this stack runs here")
