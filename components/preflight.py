"""Preflight: what can be checked on the nodes, checked before any resource is registered.

`run()` probes every node at once over SSH (the same `ssh` options the Docker provider uses, jump host
included), with components/remote/preflight_probe.py, which only gathers facts. `evaluate()` judges them,
all nodes together, into one table: node x check -> ok, warn or fail, with a one-line reason and the fix.
Warnings are printed and the program goes on; any failure stops it with the whole table, before anything
is created, replaced or deleted. It registers no resource, so a no-op preview still has no changes.
`run()` returns every node's facts: with `preflight.syncWeights`, components/weights_sync.py decides from the
weights manifests in them whether a worker's weights need copying, and a difference there is a warning
("will sync from <head>") instead of a failure.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import pulumi

from .config import ClusterSpec, Deployment, NodeSpec
from .fabric_guard import chain_name, chain_prefix
from .mp_rank import container_name as rank_container_name
from .ray_node import container_name
from .remote import script
from .spark_node import ssh_argv

MARK = "SPARK_VLLM_PREFLIGHT "
GIB = 1 << 30
# On a GB10 about 101-102 GiB of 121.69 GiB is free at boot, and vLLM refuses to start when the requested share
# is not free: 0.87 fails there, 0.85 (the reference stack) works.
UNIFIED_UTILIZATION_LIMIT = 0.86
# CUDA graph capture needs headroom beyond the KV cache; the seed's load was killed at 95 % without eager mode.
EAGER_OFF_UTILIZATION_LIMIT = 0.80
OVERHEAD_BYTES_PER_GPU = 4 * GIB  # CUDA context, activations and NCCL buffers: a rough estimate
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
STEP_TIMEOUT_S = 15  # each command of the probe; the image check starts Python in the image, so it gets more
IMAGE_TIMEOUT_S = 40
CHECKS = ("ssh+docker", "gpus", "fabric", "image", "ray+vllm", "architecture", "weights", "memory", "ports", "guard")


@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    status: str  # "ok", "warn" or "fail"
    reason: str
    fix: str = ""


def run(d: Deployment) -> dict[str, dict]:
    """Probes, judges and reports; raises pulumi.RunError (no traceback) with the table if any check failed.

    Returns each node's facts by node name ({} when preflight is off), for the resources whose diff depends on
    them.
    """
    if not d.preflight.enabled:
        pulumi.log.info("preflight is off (spark-vllm:preflight.enabled is false): the nodes were not checked")
        return {}
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(d.cluster.nodes)) as pool:
        facts = dict(zip([n.name for n in d.cluster.nodes], pool.map(lambda n: probe(d, n), d.cluster.nodes)))
    findings = evaluate(d, facts)
    table = render(findings)
    failed = [f for f in findings if f.status == "fail"]
    warned = [f for f in findings if f.status == "warn"]
    summary = (f"preflight of {len(facts)} nodes took {time.monotonic() - start:.1f} s: "
               f"{len(failed)} failed, {len(warned)} warnings")
    if failed:
        raise pulumi.RunError(f"{summary}; nothing was deployed or changed.\n{table}")
    (pulumi.log.warn if warned else pulumi.log.info)(f"{summary}\n{table}")
    return facts


def guard_state(d: Deployment, facts: dict[str, dict], node: NodeSpec) -> Optional[str]:
    """The fabric guard on `node` as preflight found it: "in place" (the current chain is hooked), "stale"
    (only chains of other rules are), "missing" (no chain of this stack is); None when it was not checked."""
    hooked = facts.get(node.name, {}).get("guard", {}).get("hooked")
    if hooked is None:
        return None
    if chain_name(d.stack, d.cluster) in hooked:
        return "in place"
    return "stale" if hooked else "missing"


def head_ports(cluster) -> dict[int, tuple[str, str]]:
    """The fixed ports the head opens, with what holds them and their config key."""
    if cluster.executor == "mp":
        return {cluster.master_port: ("mp master", "mp.masterPort"), cluster.api_port: ("API", "api.port")}
    return {cluster.ray_port: ("Ray GCS", "ray.port"), cluster.dashboard_port: ("dashboard", "ray.dashboardPort"),
            cluster.api_port: ("API", "api.port")}


def probe_spec(d: Deployment, node: NodeSpec) -> dict:
    cluster = d.cluster
    return {"iface": cluster.fabric_interface, "fabricIp": node.fabric_ip,
            "peers": {n.name: n.fabric_ip for n in cluster.nodes if n.name != node.name},
            "image": d.serve.image, "modelPath": d.serve.model_path,
            "ports": list(head_ports(cluster)) if node.head else [],
            "guard": {"script": script("fabric_guard.sh"), "prefix": chain_prefix(d.stack)}
            if cluster.fabric_guard else None,
            "gpuProbe": cluster.gpu_probe, "dockerGpus": cluster.docker_gpus, "hashWeights": d.preflight.hash_weights,
            "syncWeights": d.preflight.sync_weights, "stepTimeout": STEP_TIMEOUT_S, "imageTimeout": IMAGE_TIMEOUT_S}


def ssh_target(d: Deployment, node: NodeSpec) -> str:
    port = "" if node.ssh_port == 22 else f" -p {node.ssh_port}"
    return f"ssh {node.ssh_user}@{node.ssh_host}{port}" + (f" via {node.via}" if node.via else "")


def probe(d: Deployment, node: NodeSpec) -> dict:
    """One node's facts; {"sshError": why} when SSH fails, {"probeError": why} when the probe cannot run."""
    jump = d.cluster.node(node.via) if node.via else None
    argv = ssh_argv(d.cluster.ssh, node, jump, "python3 - " + shlex.quote(json.dumps(probe_spec(d, node))))
    start = time.monotonic()
    try:
        done = subprocess.run(argv, input=script("preflight_probe.py"), capture_output=True, text=True,
                              timeout=d.preflight.timeout_s)
    except subprocess.TimeoutExpired:
        return {"sshError": f"gave no answer within {d.preflight.timeout_s} s (spark-vllm:preflight.timeoutSeconds)"}
    seconds = round(time.monotonic() - start, 1)
    found = [line[len(MARK):] for line in done.stdout.splitlines() if line.startswith(MARK)]
    if found:
        return {**json.loads(found[-1]), "seconds": seconds}
    if done.returncode == 255:
        return {"sshError": f"failed: {_last_line(done.stderr)}"}
    if done.returncode == 127:
        return {"probeError": "python3 is not installed on the node", "seconds": seconds}
    return {"probeError": f"the probe failed: {_last_line(done.stderr)}", "seconds": seconds}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


# ---- evaluation: facts -> findings (pure, so every message is unit-tested) ----

def evaluate(d: Deployment, facts: dict[str, dict]) -> list[Finding]:
    findings = [check_ssh(d, node, facts[node.name]) for node in d.cluster.nodes]
    reachable = {name: f for name, f in facts.items() if "sshError" not in f and "probeError" not in f}
    nodes = [n for n in d.cluster.nodes if n.name in reachable]
    ref_image = _reference(d, reachable, lambda f: f.get("image", {}).get("present"))
    ref_model = _reference(d, reachable, lambda f: f.get("model", {}).get("exists"))
    for node in nodes:
        f = reachable[node.name]
        findings += [check_gpus(d, node, f), check_fabric(d, node, f, reachable), check_image(d, node, f, ref_image),
                     check_runtime(d, node, f), check_architecture(d, node, f),
                     check_weights(d, node, f, ref_model), check_memory(d, node, f, ref_model)]
        if node.head:
            findings.append(check_ports(d, node, f))
        if d.cluster.fabric_guard:
            findings.append(check_guard(d, node, f))
    order = {name: i for i, name in enumerate(CHECKS)}
    nodes_order = {n.name: i for i, n in enumerate(d.cluster.nodes)}
    return sorted(findings, key=lambda x: (nodes_order[x.node], order[x.check]))


def _reference(d: Deployment, reachable: dict, has) -> Optional[tuple[str, dict]]:
    """The node others are compared with: the head when it has the thing, else the first node that does."""
    for node in sorted(d.cluster.nodes, key=lambda n: not n.head):
        if node.name in reachable and has(reachable[node.name]):
            return node.name, reachable[node.name]
    return None


def _could_not(node: str, check: str, why: str, fix: str = "") -> Finding:
    return Finding(node, check, "warn", f"could not check: {why}", fix)


def check_ssh(d: Deployment, node: NodeSpec, f: dict) -> Finding:
    check, target = "ssh+docker", ssh_target(d, node)
    if "sshError" in f:
        hop = f" and that {node.via} can reach {node.ssh_host}" if node.via else ""
        return Finding(node.name, check, "fail", f"{target} {f['sshError']}; the other checks did not run there",
                       f"check the host, user and key in the cluster catalog{hop}")
    if "probeError" in f:
        return _could_not(node.name, check, f"{f['probeError']}, so no check ran there",
                          "install python3 on the node, or set spark-vllm:preflight.enabled to false")
    docker = f.get("docker", {})
    if "unavailable" in docker:
        return Finding(node.name, check, "fail", f"docker: {docker['unavailable']}",
                       "install Docker with the NVIDIA container runtime")
    if "error" in docker:
        denied = "permission denied" in docker["error"].lower()
        return Finding(node.name, check, "fail", f"Docker does not answer: {docker['error']}",
                       f"add {node.ssh_user} to the docker group (`sudo usermod -aG docker {node.ssh_user}`)" if denied
                       else "start the Docker daemon (`sudo systemctl start docker`)")
    slowest = max(f.get("timings", {}).items(), key=lambda item: item[1], default=None)
    return Finding(node.name, check, "ok", f"{target}; Docker {docker['server']}, storage driver {docker['driver']}; "
                                         f"probe took {f['seconds']:.1f} s" +
                   (f", the {slowest[0]} facts {slowest[1]:.1f} s of it" if slowest else ""))


GPU_SOURCES = {"nvidia-smi": "nvidia-smi -L",
               "gpuProbe": "preflight.gpuProbe of the cluster catalog, a stand-in for nvidia-smi -L",
               "runtime": "nvidia-smi -L through the NVIDIA container runtime"}


def check_gpus(d: Deployment, node: NodeSpec, f: dict) -> Finding:
    g, want = f.get("gpus", {}), d.cluster.gpus_per_node
    if "unavailable" in g:
        return _could_not(node.name, "gpus", g["unavailable"], "install the NVIDIA driver's nvidia-smi on the node")
    source = GPU_SOURCES[g["source"]]
    if "error" in g:
        return Finding(node.name, "gpus", "fail", f"{source} failed: {g['error']}",
                       "check the NVIDIA driver: run nvidia-smi on the node")
    names = g["names"]
    found = f"{len(names)} GPU{'s' if len(names) != 1 else ''}" + (f" ({', '.join(names)})" if names else "")
    if len(names) < want:
        return Finding(node.name, "gpus", "fail", f"{found} from {source}; ray.gpusPerNode is {want}",
                       "check the NVIDIA driver (nvidia-smi), or lower ray.gpusPerNode")
    return Finding(node.name, "gpus", "ok", f"{found} from {source}")


def _unified(f: dict) -> bool:
    """A GB10 (DGX Spark): the GPU and the CPU share the node's memory."""
    return any("GB10" in name for name in f.get("gpus", {}).get("names", []))


def check_fabric(d: Deployment, node: NodeSpec, f: dict, reachable: dict) -> Finding:
    fab, iface, ip = f.get("fabric", {}), d.cluster.fabric_interface, node.fabric_ip
    if "unavailable" in fab:
        return _could_not(node.name, "fabric", fab["unavailable"], "install iproute2 on the node")
    if not fab["exists"]:
        return Finding(node.name, "fabric", "fail",
                       f"{iface} does not exist (interfaces: {', '.join(sorted(fab['addrs']))})",
                       "set fabricInterface in the cluster catalog to the fabric port (`ibdev2netdev` shows it)")
    if not fab["up"]:
        return Finding(node.name, "fabric", "fail", f"{iface} is {fab['state'].lower()}",
                       f"bring it up (`sudo ip link set {iface} up`) and check the cable")
    held = fab["addrs"].get(iface, [])
    if ip not in [a.split("/")[0] for a in held]:
        elsewhere = [name for name, addrs in fab["addrs"].items() if ip in [a.split("/")[0] for a in addrs]]
        where = f"; {ip} is on {elsewhere[0]}, not the fabric" if elsewhere else ""
        fix = (f"set {node.name}'s fabricIp to {held[0].split('/')[0]} in the cluster catalog, or add {ip} to {iface}"
               if held else f"add {ip} to {iface} (`sudo ip addr add {ip}/24 dev {iface}`)")
        return Finding(node.name, "fabric", "fail",
                       f"{iface} holds {', '.join(held) or 'no IPv4 address'}, not fabricIp {ip}{where}", fix)
    problems = []
    for peer in d.cluster.nodes:
        route = fab["routes"].get(peer.name)
        if route is None:
            continue
        if "error" in route:
            problems.append((f"no route to {peer.name} ({peer.fabric_ip}): {route['error']}",
                             f"give {iface} an address in {peer.name}'s fabric subnet"))
        elif route["dev"] != iface:
            problems.append((f"traffic to {peer.name} ({peer.fabric_ip}) leaves through {route['dev']} "
                             f"(from {route['src']}), not {iface}: Ray and NCCL would use the management network, "
                             f"the seed's first failure",
                             f"give {iface} an address in {peer.name}'s fabric subnet, or fix {peer.name}'s fabricIp"))
        elif route["src"] != ip:
            problems.append((f"traffic to {peer.name} ({peer.fabric_ip}) leaves {iface} from {route['src']}, "
                             f"not fabricIp {ip}", f"make {ip} the primary address of {iface}"))
    if problems:
        return Finding(node.name, "fabric", "fail", "; ".join(p for p, _ in problems),
                       "; ".join(dict.fromkeys(fix for _, fix in problems)))
    mine = next(a for a in held if a.split("/")[0] == ip)
    peers = [p.name for p in d.cluster.nodes if p.name in fab["routes"]]
    reason = f"{iface} up, {mine}, MTU {fab['mtu']}" + (f"; routes to {', '.join(peers)} leave through it"
                                                        if peers else "")
    head = reachable.get(d.cluster.head.name, {}).get("fabric", {})
    if not node.head and head.get("exists") and head.get("mtu") != fab["mtu"]:
        return Finding(node.name, "fabric", "warn", f"{reason}; but {d.cluster.head.name}'s MTU is {head['mtu']}",
                       f"set the same MTU (9000 on Sparks) on {iface} of every node")
    return Finding(node.name, "fabric", "ok", reason)


def _short(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]


def check_image(d: Deployment, node: NodeSpec, f: dict, ref: Optional[tuple[str, dict]]) -> Finding:
    img, name = f.get("image"), d.serve.image
    if img is None:
        return _could_not(node.name, "image", "Docker does not answer")
    if "unavailable" in img:
        return _could_not(node.name, "image", img["unavailable"])
    copy = (f"on {ref[0]}: docker save {name} | ssh {node.ssh_user}@{node.fabric_ip} docker load"
            if ref and ref[0] != node.name else f"docker pull {name}")
    if not img["present"]:
        return Finding(node.name, "image", "fail", f"{name} is not on {node.name}", f"put it there: {copy}")
    ref_id = ref[1]["image"]["id"]
    if img["id"] != ref_id:
        return Finding(node.name, "image", "fail",
                       f"{node.name} has {name} as {_short(img['id'])}, {ref[0]} as {_short(ref_id)}",
                       f"put the same build on every node: {copy}")
    return Finding(node.name, "image", "ok", f"{name} is {_short(img['id'])}" +
                   (", the same on every node" if len(d.cluster.nodes) > 1 else ""))


def check_runtime(d: Deployment, node: NodeSpec, f: dict) -> Finding:
    img = f.get("image") or {}
    inside = img.get("inside")
    if inside is None:
        return _could_not(node.name, "ray+vllm", "the image is not on the node" if img.get("present") is False
                          else "Docker does not answer" if not img else img["unavailable"])
    if "error" in inside:
        return Finding(node.name, "ray+vllm", "fail", f"python3 does not run in {d.serve.image}: {inside['error']}",
                       "use an image with python3, Ray and vLLM")
    problems = []
    mp = d.serve.executor == "mp"
    if "rayError" in inside and not mp:
        problems.append((f"the image has no Ray ({inside['rayError']})",
                         "use `executor: mp` (vLLM's own executor, no Ray), or an image with Ray "
                         "(`pip install ray[default]`): NGC vLLM images from 26.04 on lack it"))
    if "vllmError" in inside:
        problems.append((f"the image has no working vLLM ({inside['vllmError']})", "use a vLLM image"))
    elif mp and inside.get("serveNnodes") is False:
        problems.append(("the image's `vllm serve` takes no --nnodes, so its vLLM cannot run the mp executor "
                         "across nodes", "use a newer vLLM image, or `executor: ray` with an image that has Ray"))
    if problems:
        return Finding(node.name, "ray+vllm", "fail", "; ".join(p for p, _ in problems),
                       "; ".join(fix for _, fix in problems))
    if mp and "serveNnodes" not in inside:
        return _could_not(node.name, "ray+vllm", f"`vllm serve --help` did not run in the image "
                                                 f"({inside.get('serveHelpError', 'no answer')})")
    if mp:
        return Finding(node.name, "ray+vllm", "ok", f"vllm {inside['vllm']}, `serve` takes --nnodes (mp: no Ray "
                                                    "needed)")
    return Finding(node.name, "ray+vllm", "ok", f"ray {inside['ray']}, vllm {inside['vllm']}")


def check_architecture(d: Deployment, node: NodeSpec, f: dict) -> Finding:
    model, inside = f.get("model", {}), (f.get("image") or {}).get("inside") or {}
    config_file = f"{d.serve.model_path}/config.json"
    if "unavailable" in model:
        return _could_not(node.name, "architecture", model["unavailable"])
    if not model.get("exists"):
        return _could_not(node.name, "architecture", f"{d.serve.model_path} is not on the node")
    if "config" not in model:
        return Finding(node.name, "architecture", "fail", f"{config_file} is missing",
                       "copy the complete checkpoint, config.json included")
    archs = model["config"].get("architectures") or []
    if not archs:
        return Finding(node.name, "architecture", "fail", f"{config_file} names no architectures",
                       "use a Hugging Face checkpoint whose config.json lists its architectures")
    if "archs" not in inside:
        return _could_not(node.name, "architecture", "the image's vLLM registry could not be read")
    if not set(archs) & set(inside["archs"]):
        return Finding(node.name, "architecture", "fail",
                       f"{', '.join(archs)} (from config.json) is not in the registry of the image's "
                       f"vLLM {inside['vllm']}",
                       f"use an image whose vLLM supports {archs[0]}, or another model")
    return Finding(node.name, "architecture", "ok", f"{', '.join(archs)} is supported by vLLM {inside['vllm']}")


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def weight_differences(model: dict, ref_model: dict, hash_weights: bool) -> tuple[list, list, list]:
    """What a node's weights lack against the reference's: (missing, sizes that differ, SHA-256 that differs)."""
    files, theirs = dict(model.get("files", [])), dict(ref_model["files"])
    missing = sorted(set(theirs) - set(files))
    differ = sorted(name for name in set(theirs) & set(files) if theirs[name] != files[name])
    changed = []
    if hash_weights:
        mine, other = model.get("sha256", {}), ref_model.get("sha256", {})
        changed = sorted(name for name in set(mine) & set(other) if mine[name] != other[name] and name not in differ)
    return missing, differ, changed


def sync_needed(cluster: ClusterSpec, hash_weights: bool, facts: dict[str, dict]) -> dict[str, bool]:
    """Worker -> whether its weights are known to differ from the head's (what preflight.syncWeights copies).

    A worker whose weights could not be read is not synced: its row already says `could not check`."""
    head = facts.get(cluster.head.name, {}).get("model", {})
    needed = {}
    for node in cluster.workers:
        model = facts.get(node.name, {}).get("model", {})
        if not head.get("exists") or "unavailable" in model or "exists" not in model:
            needed[node.name] = False
        elif not model["exists"]:
            needed[node.name] = not model.get("isFile")
        else:
            needed[node.name] = any(weight_differences(model, head, hash_weights))
    return needed


def check_weights(d: Deployment, node: NodeSpec, f: dict, ref: Optional[tuple[str, dict]]) -> Finding:
    model, path = f.get("model", {}), d.serve.model_path
    if "unavailable" in model:
        return _could_not(node.name, "weights", model["unavailable"], f"let {node.ssh_user} read {path}")
    copy_from = None
    if ref and ref[0] != node.name:
        copy_from = (f"copy them from {ref[0]} over the fabric: on {ref[0]}, rsync -a --progress {path}/ "
                     f"{node.ssh_user}@{node.fabric_ip}:{path}/")
    head = d.cluster.head.name
    syncs = d.preflight.sync_weights and ref is not None and ref[0] == head and ref[0] != node.name

    def differs(reason: str, fix: Optional[str]) -> Finding:
        """A difference the sync can repair is a warning when it is on, and a failure otherwise."""
        if not syncs:
            return Finding(node.name, "weights", "fail", reason, fix)
        lacking = [name for name, facts in ((head, ref[1]), (node.name, f)) if facts.get("rsync") is False]
        if lacking:
            return Finding(node.name, "weights", "fail",
                           f"{reason}; spark-vllm:preflight.syncWeights cannot copy them: rsync is not installed on "
                           f"{' and '.join(lacking)}",
                           f"install rsync on {' and '.join(lacking)} (`sudo apt-get install rsync`)")
        return Finding(node.name, "weights", "warn",
                       f"{reason}; will sync from {head} over the fabric (spark-vllm:preflight.syncWeights)")

    if not model["exists"]:
        if model.get("isFile"):
            return Finding(node.name, "weights", "fail", f"{path} is a file, not a folder on {node.name}",
                           copy_from or f"put the model's weights at {path} on every node")
        return differs(f"{path} is not there on {node.name}",
                       copy_from or f"put the model's weights at {path} on every node")
    files = dict(model["files"])
    weights = {name: n for name, n in files.items() if name.endswith(WEIGHT_SUFFIXES)}
    if not weights:
        return differs(f"{path} holds no *.safetensors, *.bin or *.pt files",
                       copy_from or "copy the complete checkpoint")
    summary = f"{len(weights)} weight file{'s' if len(weights) != 1 else ''}, {size(sum(weights.values()))}"
    if ref is None or ref[0] == node.name:
        return Finding(node.name, "weights", "ok", summary + _hash_note(d, model, None))
    theirs = dict(ref[1]["model"]["files"])
    missing, differ, changed = weight_differences(model, ref[1]["model"], d.preflight.hash_weights)
    extra = sorted(set(files) - set(theirs))
    problems = []
    if missing:
        problems.append(f"{node.name} lacks {_some(missing)}")
    problems += [f"{node.name}'s {name} is {size(files[name])}, {ref[0]}'s is {size(theirs[name])}"
                 for name in differ[:3]]
    if len(differ) > 3:
        problems.append(f"{len(differ) - 3} more files differ in size")
    if changed and (not problems or syncs):
        problems.append(f"{node.name}'s {_some(changed)} differ{'s' if len(changed) == 1 else ''} "
                        f"from {ref[0]}'s (SHA-256)")
    if problems:
        return differs("; ".join(problems), copy_from)
    if extra:
        return Finding(node.name, "weights", "warn", f"{summary}: every file of {ref[0]}, the same size, and also "
                                                     f"{_some(extra)}" + _hash_note(d, model, ref[0]),
                       f"remove what {ref[0]} does not have, so every node loads the same files")
    return Finding(node.name, "weights", "ok",
                   f"{summary}, the same names and sizes as {ref[0]}" + _hash_note(d, model, ref[0]))


def _hash_note(d: Deployment, model: dict, ref: Optional[str]) -> str:
    if not d.preflight.hash_weights:
        return " (contents not hashed: spark-vllm:preflight.hashWeights is off)"
    return f"; SHA-256 the same as {ref}'s" if ref else f"; {len(model.get('sha256', {}))} SHA-256 sums taken"


def kv_bytes_per_token(config: dict) -> Optional[int]:
    """K and V of every layer for one token, 16-bit, across the whole model; None when config.json lacks the shape."""
    layers, heads = config.get("num_hidden_layers"), config.get("num_key_value_heads")
    head_dim = config.get("head_dim")
    if head_dim is None and config.get("hidden_size") and config.get("num_attention_heads"):
        head_dim = config["hidden_size"] // config["num_attention_heads"]
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(head_dim, int)):
        return None
    return 2 * layers * heads * head_dim * 2


def check_memory(d: Deployment, node: NodeSpec, f: dict, ref: Optional[tuple[str, dict]]) -> Finding:
    serve, mem = d.serve, f.get("memory", {})
    if "unavailable" in mem:
        return _could_not(node.name, "memory", mem["unavailable"])
    if ref is None:
        return _could_not(node.name, "memory", "no node has the weights, so their size is unknown")
    world = serve.tensor_parallel * serve.pipeline_parallel
    share = d.cluster.gpus_per_node / world  # this node's part of the weights and of the KV cache
    model = ref[1]["model"]
    weights = sum(n for name, n in model["files"] if name.endswith(WEIGHT_SUFFIXES)) * share
    config = model.get("config", {})
    max_len = serve.max_model_len or config.get("max_position_embeddings")
    per_token = kv_bytes_per_token(config)
    kv = per_token * max_len * share if per_token and isinstance(max_len, int) else 0
    overhead = OVERHEAD_BYTES_PER_GPU * d.cluster.gpus_per_node
    need, total, util = weights + kv + overhead, mem["totalKib"] * 1024, serve.gpu_memory_utilization
    budget = total * util
    kv_part = f"KV for one {max_len}-token sequence {size(kv)}" if kv else "KV not estimated"
    reason = (f"needs about {size(need)} (weights {size(weights)}, {kv_part}, overhead {size(overhead)}) "
              f"of {size(budget)} ({util:g} x {size(total)})")
    if need > budget:
        return Finding(node.name, "memory", "fail", f"{reason}: it does not fit",
                       "spread the model over more nodes, or lower maxModelLen, or raise gpuMemoryUtilization "
                       f"(at most {UNIFIED_UTILIZATION_LIMIT} on a GB10)")
    warnings = []
    if _unified(f) and util > UNIFIED_UTILIZATION_LIMIT:
        warnings.append((f"gpuMemoryUtilization {util:g} is above {UNIFIED_UTILIZATION_LIMIT} on a unified-memory "
                         f"GB10: only about 101-102 GiB of 121.69 GiB is free at boot, so vLLM's start-up check fails",
                         f"set spark-vllm:serve.gpuMemoryUtilization to {UNIFIED_UTILIZATION_LIMIT - 0.01:g}"))
    if not serve.enforce_eager and util > EAGER_OFF_UTILIZATION_LIMIT:
        warnings.append((f"enforceEager is off at gpuMemoryUtilization {util:g}: CUDA graph capture needs headroom "
                         f"(the seed's load was killed at 95 % memory)",
                         f"set spark-vllm:serve.enforceEager to true, or gpuMemoryUtilization to at most "
                         f"{EAGER_OFF_UTILIZATION_LIMIT:g}"))
    if warnings:
        return Finding(node.name, "memory", "warn", "; ".join([reason, *(w for w, _ in warnings)]),
                       "; ".join(fix for _, fix in warnings))
    return Finding(node.name, "memory", "ok", reason)


def check_ports(d: Deployment, node: NodeSpec, f: dict) -> Finding:
    ports = f.get("ports", {})
    if "unavailable" in ports:
        return _could_not(node.name, "ports", ports["unavailable"], "install iproute2 (ss) on the node")
    cluster = d.cluster
    names = head_ports(cluster)
    own_names = {name(d.stack, n) for n in cluster.nodes
                 for name in (container_name, lambda stack, node: rank_container_name(stack, cluster, node))}
    status, reasons, fixes = "ok", [], []
    for port, (what, key) in names.items():
        state, label = ports[str(port)], f"{port} ({what})"
        if state["free"]:
            reasons.append(f"{label} free")
            continue
        if state.get("hidden"):
            status = "fail" if status == "fail" else "warn"
            reasons.append(f"could not check: {label} is in use, and ss shows its owner only to root")
            fixes.append(f"see who holds it: `sudo ss -tlnp 'sport = :{port}'`")
            continue
        holders = [h for h in state["holders"] if not h.get("exiting")]
        if not holders:
            reasons.append(f"{label} free (its holder, pid {state['holders'][0]['pid']}, exited as it was checked)")
            continue
        if all(h.get("stack") == d.stack or h.get("container") in own_names for h in holders):
            reasons.append(f"{label} held by this stack's {holders[0]['container']}")
            continue
        h = next(h for h in holders if not (h.get("stack") == d.stack or h.get("container") in own_names))
        status = "fail"
        if h.get("stack"):
            reasons.append(f"{label} is held by {h['process']} (pid {h['pid']}) in {h['container']} of stack "
                           f"{h['stack']}")
            fixes.append(f"destroy that stack first (`pulumi destroy -s {h['stack']}`), or change {key}")
        elif h.get("container"):
            reasons.append(f"{label} is held by {h['process']} (pid {h['pid']}) in container {h['container']}")
            fixes.append(f"stop it (`docker stop {h['container']}`), or change {key}")
        else:
            reasons.append(f"{label} is held by {h['process']} (pid {h['pid']}), outside any container")
            fixes.append(f"stop that process, or change {key}")
    return Finding(node.name, "ports", status, "; ".join(reasons), "; ".join(fixes))


def check_guard(d: Deployment, node: NodeSpec, f: dict) -> Finding:
    g = f.get("guard", {})
    if "unavailable" in g:
        # What stops the check (no iptables, no passwordless sudo) would stop `up` at the guard: fail here, first.
        return Finding(node.name, "guard", "fail",
                       f"could not check: {g['unavailable']}; `up` could not apply the guard either",
                       f"let {node.ssh_user} run iptables with `sudo -n` (or install iptables), or set "
                       f"ray.fabricGuard: false")
    state, chain = guard_state(d, {node.name: f}, node), chain_name(d.stack, d.cluster)
    if state == "in place":
        return Finding(node.name, "guard", "ok", f"Ray's ports are closed to all but {d.cluster.fabric_interface} "
                                                 f"and loopback (chain {chain})")
    if state == "stale":
        return Finding(node.name, "guard", "ok", f"chain {', '.join(g['hooked'])} guards other ports; `up` puts "
                                                 f"{chain} in first, then removes it")
    return Finding(node.name, "guard", "ok", f"the rules that close Ray's ports to all but "
                                             f"{d.cluster.fabric_interface} are not in place; `up` applies them")


def render(findings: list[Finding]) -> str:
    rows = [(f.node, f.check, "FAIL" if f.status == "fail" else f.status,
             f.reason + (f". Fix: {f.fix}" if f.fix and f.status != "ok" else "")) for f in findings]
    widths = [max(len(r[i]) for r in [("node", "check", "result", ""), *rows]) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {text}".rstrip()
             for a, b, c, text in [("node", "check", "result", ""), *rows]]
    return "\n".join(lines)
