"""Preflight's judgement, facts -> table, for every check: pass, warn, fail and could-not-check, with exact messages.

The facts are what components/remote/preflight_probe.py prints on a node; the lab runs the probe for real
(tests/e2e/test_preflight.py). The probe's own fact-gathering is exercised here against this machine.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys

import pulumi
import pytest

from components.preflight import liveness
from components.config import loader, spec
from components.nodes import node_runner, weight_manifests
from components import preflight
from components.resources.fabric_guard import GuardState, guard_state
from components.nodes.node_facts import Docker, parse
from components.preflight import probing as preflight_probe
from components.preflight.table import render
from components.resources.fabric_guard import chain_name
from components.preflight.judging import CHECKS, LOADER_NEEDS, Finding, evaluate
from components.config.schema import ConfigError
from components.nodes.node_runner import provider_ssh_opts
from fixtures import cluster_with, stack_config, write_catalog
from harness import ROOT, run_program

GIB = 1 << 30
IMAGE_ID = "sha256:" + "ab12" * 16
OTHER_ID = "sha256:" + "cd34" * 16
ARCHS = ["LlamaForCausalLM", "Qwen3ForCausalLM"]
FABRIC = {"spark1": "192.168.200.1", "spark2": "192.168.200.2", "spark3": "192.168.200.3"}
SHARDS = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
MODEL_FILES = [["config.json", 900], *[[name, 6 * GIB] for name in SHARDS], ["tokenizer.json", 1000]]
# 64 layers x 8 KV heads x 128 x K,V x 2 bytes = 256 KiB a token; 8192 tokens = 2 GiB, a third on each node.
MODEL_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 64, "num_key_value_heads": 8,
                "head_dim": 128, "max_position_embeddings": 40960}
# vLLM 0.33's loader registry (SPARK-FACTS.md, from model_executor/model_loader/__init__.py).
LOAD_FORMATS = ("auto", "dummy", "fastsafetensors", "hf", "instanttensor", "ipc_cache", "mistral", "modelexpress",
                "npcache", "pt", "runai_streamer", "runai_streamer_sharded", "safetensors", "sharded_state",
                "tensorizer")
NEED = "weights 6.0 GiB, KV for one 8192-token sequence 682.7 MiB, overhead 4.0 GiB"

# The fix when another stack holds a port (written out here, not imported from the code under test).
OWN_SLOT = ", or give this stack a spark-vllm:portSlot of its own (docs/placement.md)"


def deployment(tmp_path, serve=None, **checks):
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True, **checks})
    if serve:
        cfg["spark-vllm:serve"] = serve
    return loader.load("test", cfg, set(), ROOT)


def healthy() -> dict:
    """Facts of the fixtures' three-node cluster (spark1 head; spark2 behind spark1) where every check passes."""
    facts = {}
    for name, ip in FABRIC.items():
        facts[name] = {
            "seconds": 1.2,
            "docker": {"server": "28.0.1", "driver": "overlay2"},
            "image": {"present": True, "id": IMAGE_ID, "size": 20 * GIB, "inside": {
                "ray": "2.60.0", "vllm": "0.11.0", "archs": ARCHS, "loadFormats": list(LOAD_FORMATS),
                "loaderPackages": {"fastsafetensors": {"installed": True, "version": "0.1.15"},
                                   "instanttensor": {"installed": False}, "runai_model_streamer": {"installed": False},
                                   "tensorizer": {"installed": False}}}},
            "gpus": {"source": "nvidia-smi", "names": ["NVIDIA GB10"]},
            "fabric": {"exists": True, "up": True, "state": "UP", "mtu": 9000,
                       "addrs": {"lo": ["127.0.0.1/8"], "enP7s7": ["10.10.10.1/24"], "enp1s0f1np1": [f"{ip}/24"]},
                       "routes": {peer: {"dev": "enp1s0f1np1", "src": ip, "via": None}
                                  for peer in FABRIC if peer != name}},
            "model": {"exists": True, "files": copy.deepcopy(MODEL_FILES), "config": dict(MODEL_CONFIG)},
            "disk": {"file": SHARDS[0], "bytes": GIB, "seconds": 0.5},
            "memory": {"totalKib": 128 * 1024 * 1024},
            "guard": {"hooked": ["svl-test-0f042094"]},
            "running": {"containers": {}},  # nothing deployed yet
            "space": {"weightsFree": 500 * GIB, "weightsMount": "/models", "dockerFree": 400 * GIB,
                      "dockerRoot": "/var/lib/docker"},
        }
    facts["spark1"]["ports"] = {"6379": {"free": True}, "8265": {"free": True}, "8000": {"free": True},
                                "29511": {"free": True}}
    return facts


def typed(facts: dict) -> dict:
    """The probe's JSON of every node, as preflight reads it."""
    return {name: parse(raw) for name, raw in facts.items()}


def judged(d, facts) -> dict[tuple[str, str], Finding]:
    return {(f.node, f.check): f for f in evaluate(d, typed(facts), liveness.judge(d, typed(facts)))}


def one(d, facts, node, check) -> tuple[str, str, str]:
    f = judged(d, facts)[(node, check)]
    return f.status, f.reason, f.fix


def test_a_healthy_cluster_passes_every_check_on_every_node(tmp_path):
    d = deployment(tmp_path)
    table = judged(d, healthy())
    assert all(f.status == "ok" for f in table.values()), [f for f in table.values() if f.status != "ok"]
    # The hub row belongs to a model from the Hub (test_hub_preflight.py).
    assert set(table) == {(n, c) for n in FABRIC for c in CHECKS if c not in ("ports", "hub")} | {("spark1", "ports")}
    assert table[("spark2", "ssh+docker")].reason == \
        "ssh nvidia@192.168.200.2 via spark1; Docker 28.0.1, storage driver overlay2; probe took 1.2 s"
    assert table[("spark1", "gpus")].reason == "1 GPU (NVIDIA GB10) from nvidia-smi -L"
    assert table[("spark1", "fabric")].reason == \
        "enp1s0f1np1 up, 192.168.200.1/24, MTU 9000; routes to spark2, spark3 leave through it"
    assert table[("spark2", "image")].reason == "vllm:a is ab12ab12ab12, the same on every node"
    assert table[("spark2", "ray+vllm")].reason == "ray 2.60.0, vllm 0.11.0"
    assert table[("spark2", "architecture")].reason == "Qwen3ForCausalLM is supported by vLLM 0.11.0"
    assert table[("spark1", "weights")].reason == \
        "3 weight files, 18.0 GiB (contents not hashed: spark-vllm:preflight.hashWeights is off)"
    assert table[("spark3", "weights")].reason == ("3 weight files, 18.0 GiB, the same names and sizes as spark1 "
                                                   "(contents not hashed: spark-vllm:preflight.hashWeights is off)")
    assert table[("spark2", "memory")].reason == (f"needs about 10.7 GiB ({NEED}) of 108.8 GiB (0.85 x 128.0 GiB)")
    assert table[("spark2", "space")].reason == "500.0 GiB free at /models; nothing is to arrive"
    assert table[("spark1", "ports")].reason == ("6379 (Ray GCS) free; 8265 (dashboard) free; 8000 (API) free; "
                                                 "29511 (watchdog) free")
    assert table[("spark1", "running")].reason == ("spark-vllm-test-ray-head is not on spark1: up creates it; "
                                                   "spark-vllm-test-keeper is not on spark1: up creates it")


def test_the_ssh_row_names_the_slowest_step_of_the_probe(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["timings"] = {"docker": 0.1, "image": 0.83, "model": 0.02}
    assert one(d, facts, "spark1", "ssh+docker") == (
        "ok", "ssh nvidia@10.10.10.11; Docker 28.0.1, storage driver overlay2; probe took 1.2 s, the image facts 0.8 s "
              "of it", "")


# ---- settings ----

def test_preflight_is_on_by_default_with_its_settings_validated(tmp_path):
    cfg = stack_config(write_catalog(tmp_path / "catalog"))
    del cfg["spark-vllm:preflight"]
    d = loader.load("test", cfg, set(), ROOT)
    assert d.preflight == spec.PreflightSpec(enabled=True, hash_weights=False, timeout_s=60, sync_weights=False,
                                               sync_timeout_s=3600)
    assert d.cluster.gpu_probe is None
    for bad, message in [
        ({"enabled": "maybe"}, "spark-vllm:preflight.enabled is 'maybe'; expected true or false."),
        ({"timeoutSeconds": 1}, "spark-vllm:preflight.timeoutSeconds is 1; expected a whole number from 5 to 14400."),
        ({"hashWeight": True}, "spark-vllm:preflight.hashWeight (True) is not a known key (did you mean hashWeights?); "
                               "expected one of the known keys: enabled, hashWeights, syncTimeoutSeconds, syncWeights, "
                               "timeoutSeconds."),
        ({"syncWeights": "later"}, "spark-vllm:preflight.syncWeights is 'later'; expected true or false."),
        ({"syncWeights": True, "syncTimeoutSeconds": 5},
         "spark-vllm:preflight.syncTimeoutSeconds is 5; expected a whole number from 10 to 86400."),
        ({"enabled": False, "syncWeights": True},
         "spark-vllm:preflight.syncWeights is true, but the sync acts on what preflight finds, and preflight is off; "
         "expected false while preflight.enabled is false."),
    ]:
        with pytest.raises(ConfigError) as err:
            loader.load("test", {**cfg, "spark-vllm:preflight": bad}, set(), ROOT)
        assert str(err.value) == f"Pulumi.test.yaml: {message}"


def test_the_clusters_gpu_stand_in_is_read_from_the_catalog(tmp_path):
    clusters = cluster_with(lambda c: c.update(preflight={"gpuProbe": "echo 'GPU 0: stand-in'"}))
    d = loader.load("test", stack_config(write_catalog(tmp_path / "catalog", clusters)), set(), ROOT)
    assert d.cluster.gpu_probe == "echo 'GPU 0: stand-in'"
    assert preflight_probe.probe_spec(d, d.cluster.head)["gpuProbe"] == "echo 'GPU 0: stand-in'"
    bad = cluster_with(lambda c: c.update(preflight={"gpuProbe": ""}))
    with pytest.raises(ConfigError, match=r"c3.preflight.gpuProbe is ''; expected a shell command"):
        loader.load("test", stack_config(write_catalog(tmp_path / "bad", bad)), set(), ROOT)


# ---- ssh+docker ----

def test_ssh_failure_through_the_jump_host_names_both_and_skips_that_nodes_other_checks(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"] = {"sshError": "failed: ssh: connect to host 192.168.200.2 port 22: No route to host"}
    table = judged(d, facts)
    f = table[("spark2", "ssh+docker")]
    assert (f.status, f.reason, f.fix) == (
        "fail", "ssh nvidia@192.168.200.2 via spark1 failed: ssh: connect to host 192.168.200.2 port 22: No route "
                "to host; the other checks did not run there",
        "check the host, user and key in the cluster catalog and that spark1 can reach 192.168.200.2")
    assert [c for n, c in table if n == "spark2"] == ["ssh+docker"]
    # The others are still judged, and compared among themselves.
    assert table[("spark3", "weights")].status == "ok"


def test_ssh_timeout_names_the_setting(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"] = {"sshError": "gave no answer within 60 s (spark-vllm:preflight.timeoutSeconds)"}
    assert one(d, facts, "spark3", "ssh+docker") == (
        "fail", "ssh nvidia@10.10.10.13 gave no answer within 60 s (spark-vllm:preflight.timeoutSeconds); the other "
                "checks did not run there", "check the host, user and key in the cluster catalog")


def test_a_node_without_python_could_not_be_checked_which_is_not_a_pass(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"] = {"probeError": "python3 is not installed on the node", "seconds": 0.4}
    assert one(d, facts, "spark3", "ssh+docker") == (
        "warn", "could not check: python3 is not installed on the node, so no check ran there",
        "install python3 on the node, or set spark-vllm:preflight.enabled to false")


@pytest.mark.parametrize("docker,reason,fix", [
    ({"unavailable": "`docker` is not installed"}, "docker: `docker` is not installed",
     "install Docker with the NVIDIA container runtime"),
    ({"error": "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock"},
     "Docker does not answer: permission denied while trying to connect to the Docker daemon socket at "
     "unix:///var/run/docker.sock", "add nvidia to the docker group (`sudo usermod -aG docker nvidia`)"),
    ({"error": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"},
     "Docker does not answer: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
     "daemon running?", "start the Docker daemon (`sudo systemctl start docker`)"),
])
def test_docker_that_does_not_answer_fails(tmp_path, docker, reason, fix):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"]["docker"] = docker
    del facts["spark3"]["image"]  # the probe skips the image when Docker does not answer
    assert one(d, facts, "spark3", "ssh+docker") == ("fail", reason, fix)
    assert one(d, facts, "spark3", "image") == ("warn", "could not check: Docker does not answer", "")
    assert one(d, facts, "spark3", "ray+vllm") == ("warn", "could not check: Docker does not answer", "")


# ---- gpus ----

def test_gpus_from_the_catalogs_stand_in_say_so(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["gpus"] = {"source": "gpuProbe", "names": ["NVIDIA GB10 (lab stand-in)"]}
    assert one(d, facts, "spark1", "gpus") == (
        "ok", "1 GPU (NVIDIA GB10 (lab stand-in)) from preflight.gpuProbe of the cluster catalog, a stand-in for "
              "nvidia-smi -L", "")


def test_too_few_gpus_fail(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["gpus"] = {"source": "runtime", "names": []}
    assert one(d, facts, "spark2", "gpus") == (
        "fail", "0 GPUs from nvidia-smi -L through the NVIDIA container runtime; ray.gpusPerNode is 1",
        "check the NVIDIA driver (nvidia-smi), or lower ray.gpusPerNode")


def test_a_failing_nvidia_smi_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["gpus"] = {"source": "nvidia-smi", "error": "NVIDIA-SMI has failed because it couldn't "
                                                                "communicate with the NVIDIA driver."}
    assert one(d, facts, "spark2", "gpus") == (
        "fail", "nvidia-smi -L failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "check the NVIDIA driver: run nvidia-smi on the node")


def test_gpus_that_cannot_be_listed_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["gpus"] = {"unavailable": "`nvidia-smi` is not installed, and the NVIDIA runtime cannot be "
                                              "asked: docker.gpus is none"}
    assert one(d, facts, "spark2", "gpus") == (
        "warn", "could not check: `nvidia-smi` is not installed, and the NVIDIA runtime cannot be asked: docker.gpus "
                "is none", "install the NVIDIA driver's nvidia-smi on the node")


# ---- fabric ----

def test_a_missing_fabric_interface_fails_listing_the_interfaces(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["fabric"].update(exists=False, addrs={"lo": [], "enP7s7": ["10.10.10.2/24"]})
    assert one(d, facts, "spark2", "fabric") == (
        "fail", "enp1s0f1np1 does not exist (interfaces: enP7s7, lo)",
        "set fabricInterface in the cluster catalog to the fabric port (`ibdev2netdev` shows it)")


def test_a_fabric_interface_that_is_down_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["fabric"].update(up=False, state="DOWN")
    assert one(d, facts, "spark2", "fabric") == (
        "fail", "enp1s0f1np1 is down", "bring it up (`sudo ip link set enp1s0f1np1 up`) and check the cable")


def test_a_wrong_fabric_ip_names_the_address_the_interface_holds(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["fabric"]["addrs"]["enp1s0f1np1"] = ["192.168.200.12/24"]
    assert one(d, facts, "spark2", "fabric") == (
        "fail", "enp1s0f1np1 holds 192.168.200.12/24, not fabricIp 192.168.200.2",
        "set spark2's fabricIp to 192.168.200.12 in the cluster catalog, or add 192.168.200.2 to enp1s0f1np1")


def test_a_fabric_ip_that_is_on_the_management_port_is_named(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    addrs = facts["spark3"]["fabric"]["addrs"]
    addrs.update(enp1s0f1np1=[], enP7s7=["192.168.200.3/24"])
    assert one(d, facts, "spark3", "fabric") == (
        "fail", "enp1s0f1np1 holds no IPv4 address, not fabricIp 192.168.200.3; 192.168.200.3 is on enP7s7, not the "
                "fabric", "add 192.168.200.3 to enp1s0f1np1 (`sudo ip addr add 192.168.200.3/24 dev enp1s0f1np1`)")


def test_a_peer_reached_over_the_management_network_is_the_seeds_first_failure(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["fabric"]["routes"]["spark3"] = {"dev": "enP7s7", "src": "10.10.10.1", "via": "10.10.10.254"}
    assert one(d, facts, "spark1", "fabric") == (
        "fail", "traffic to spark3 (192.168.200.3) leaves through enP7s7 (from 10.10.10.1), not enp1s0f1np1: Ray and "
                "NCCL would use the management network, the seed's first failure",
        "give enp1s0f1np1 an address in spark3's fabric subnet, or fix spark3's fabricIp")


def test_no_route_to_a_peer_and_a_wrong_source_address_fail_together(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    routes = facts["spark3"]["fabric"]["routes"]
    routes["spark1"] = {"error": "RTNETLINK answers: Network is unreachable"}
    routes["spark2"] = {"dev": "enp1s0f1np1", "src": "192.168.200.33", "via": None}
    assert one(d, facts, "spark3", "fabric") == (
        "fail", "no route to spark1 (192.168.200.1): RTNETLINK answers: Network is unreachable; traffic to spark2 "
                "(192.168.200.2) leaves enp1s0f1np1 from 192.168.200.33, not fabricIp 192.168.200.3",
        "give enp1s0f1np1 an address in spark1's fabric subnet; make 192.168.200.3 the primary address of enp1s0f1np1")


def test_an_mtu_unlike_the_heads_warns(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["fabric"]["mtu"] = 1500
    assert one(d, facts, "spark2", "fabric") == (
        "warn", "enp1s0f1np1 up, 192.168.200.2/24, MTU 1500; routes to spark1, spark3 leave through it; but spark1's "
                "MTU is 9000", "set the same MTU (9000 on Sparks) on enp1s0f1np1 of every node")


def test_fabric_without_ip_tools_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["fabric"] = {"unavailable": "`ip` is not installed"}
    assert one(d, facts, "spark2", "fabric") == (
        "warn", "could not check: `ip` is not installed", "install iproute2 on the node")


# ---- image ----

COPIES = "up copies spark1's (ab12ab12ab12, 20.0 GiB) over the fabric before anything starts here"


def test_an_image_missing_on_a_worker_is_copied_from_the_head(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"]["image"] = {"present": False}
    assert one(d, facts, "spark3", "image") == ("warn", f"spark3 lacks vllm:a; {COPIES}", "")
    # What is inside is the head's image, which spark3 will hold: judged from there.
    assert one(d, facts, "spark3", "ray+vllm") == ("ok", "ray 2.60.0, vllm 0.11.0", "")
    assert one(d, facts, "spark3", "architecture") == ("ok", "Qwen3ForCausalLM is supported by vLLM 0.11.0", "")
    assert one(d, facts, "spark3", "space") == ("ok", "400.0 GiB free at /var/lib/docker, the image needs 20.0 GiB", "")
    assert one(d, facts, "spark2", "image") == ("ok", "vllm:a is ab12ab12ab12", "")


def test_an_image_id_that_differs_from_the_heads_is_replaced_by_the_heads(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["image"]["id"] = OTHER_ID
    assert one(d, facts, "spark2", "image") == ("warn", f"spark2 holds vllm:a as cd34cd34cd34; {COPIES}", "")


def test_a_node_without_room_for_the_image_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["image"] = {"present": False}
    facts["spark2"]["space"]["dockerFree"] = 5 * GIB
    assert one(d, facts, "spark2", "space") == (
        "fail", "5.0 GiB free at /var/lib/docker, the image needs 20.0 GiB",
        "free space on spark2, or put the weights' path on a larger disk")


def test_without_the_image_on_the_head_the_first_node_that_has_it_is_the_reference(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["image"] = {"present": False}
    facts["spark3"]["image"]["id"] = OTHER_ID
    table = judged(d, facts)
    copies = "up copies spark2's (ab12ab12ab12, 20.0 GiB) over the fabric before anything starts here"
    assert (table[("spark1", "image")].reason, table[("spark1", "image")].fix) == (f"spark1 lacks vllm:a; {copies}", "")
    assert table[("spark3", "image")].reason == f"spark3 holds vllm:a as cd34cd34cd34; {copies}"


def test_an_image_on_no_node_fails_unless_the_head_pulls_it(tmp_path):
    facts = healthy()
    for node in facts.values():
        node["image"] = {"present": False}
    assert one(deployment(tmp_path / "a"), facts, "spark2", "image") == (
        "fail", "vllm:a is on no node of the stack, and none pulls it",
        "set spark-vllm:images.pull to head, so that the head pulls it (with spark-vllm:images.registryUser and the "
        "secret spark-vllm:registryPassword for a private registry), or load it on one node")
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True}, images={"pull": "head"})
    d = loader.load("test", cfg, set(), ROOT)
    assert one(d, facts, "spark1", "image") == (
        "warn", "spark1 lacks vllm:a; up pulls it from docker.io without a login before anything starts here", "")
    assert one(d, facts, "spark2", "image") == (
        "warn", "spark2 lacks vllm:a; up copies spark1's over the fabric before anything starts here", "")


def test_an_image_that_cannot_be_inspected_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"]["image"] = {"unavailable": "`docker image inspect` gave no answer within 15 s"}
    assert one(d, facts, "spark3", "image") == (
        "warn", "could not check: `docker image inspect` gave no answer within 15 s", "")
    assert one(d, facts, "spark3", "ray+vllm") == (
        "warn", "could not check: `docker image inspect` gave no answer within 15 s", "")


# ---- ray+vllm ----

def test_an_image_without_ray_fails_naming_the_ngc_change(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    inside = facts["spark1"]["image"]["inside"]
    del inside["ray"]
    inside["rayError"] = "ModuleNotFoundError: No module named 'ray'"
    assert one(d, facts, "spark1", "ray+vllm") == (
        "fail", "the image has no Ray (ModuleNotFoundError: No module named 'ray')",
        "use `executor: mp` (vLLM's own executor, no Ray), or an image with Ray (`pip install ray[default]`): "
        "NGC vLLM images from 26.04 on lack it")


def mp_image(facts, **inside):
    """The facts of an NGC-like image without Ray, whose `vllm serve` takes --nnodes unless `inside` says."""
    for node in facts.values():
        node["image"]["inside"] = {"rayError": "ModuleNotFoundError: No module named 'ray'", "vllm": "0.31.0",
                                   "archs": ARCHS, "serveNnodes": True, "loadFormats": list(LOAD_FORMATS),
                                   "loaderPackages": node["image"]["inside"]["loaderPackages"], **inside}
    facts["spark1"]["ports"] = {"29501": {"free": True}, "8000": {"free": True}, "29511": {"free": True}}
    return facts


def test_mp_needs_no_ray_but_a_serve_that_takes_nnodes(tmp_path):
    d = deployment(tmp_path, serve={"executor": "mp"})
    facts = mp_image(healthy())
    table = judged(d, facts)
    assert all(f.status == "ok" for f in table.values()), [f for f in table.values() if f.status != "ok"]
    assert table[("spark2", "ray+vllm")].reason == "vllm 0.31.0, `serve` takes --nnodes (mp: no Ray needed)"
    assert table[("spark1", "ports")].reason == "29501 (mp master) free; 8000 (API) free; 29511 (watchdog) free"
    facts = mp_image(healthy(), serveNnodes=False)
    assert one(d, facts, "spark3", "ray+vllm") == (
        "fail", "the image's `vllm serve` takes no --nnodes, so its vLLM cannot run the mp executor across nodes",
        "use a newer vLLM image, or `executor: ray` with an image that has Ray")
    facts = mp_image(healthy(), serveHelpError="TimeoutExpired: ...")
    del facts["spark3"]["image"]["inside"]["serveNnodes"]
    assert one(d, facts, "spark3", "ray+vllm")[:2] == (
        "warn", "could not check: `vllm serve --help` did not run in the image (TimeoutExpired: ...)")


def test_mp_ports_name_the_master_port_and_its_holder(tmp_path):
    d = deployment(tmp_path, serve={"executor": "mp"})
    facts = mp_image(healthy())
    facts["spark1"]["ports"] = {"29501": {"free": False, "holders": [
        {"pid": 42, "process": "python3", "container": "spark-vllm-other-vllm-rank0", "stack": "other"}]},
        "8000": {"free": True}, "29511": {"free": True}}
    status, reason, fix = one(d, facts, "spark1", "ports")
    assert status == "fail"
    assert "29501 (mp master) is held by python3 (pid 42) in spark-vllm-other-vllm-rank0 of stack other" in reason
    assert fix == "destroy that stack first (`pulumi destroy -s other`)" + OWN_SLOT


def test_an_image_without_vllm_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["image"]["inside"] = {"ray": "2.60.0", "vllmError": "ModuleNotFoundError: No module named 'vllm'"}
    assert one(d, facts, "spark1", "ray+vllm") == (
        "fail", "the image has no working vLLM (ModuleNotFoundError: No module named 'vllm')", "use a vLLM image")
    assert one(d, facts, "spark1", "architecture") == (
        "warn", "could not check: the image's vLLM registry could not be read", "")


def test_an_image_where_python_does_not_run_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["image"]["inside"] = {"error": "docker: Error response from daemon: failed to create task: exec: "
                                                   "\"python3\": executable file not found in $PATH: unknown."}
    assert one(d, facts, "spark1", "ray+vllm") == (
        "fail", "python3 does not run in vllm:a: docker: Error response from daemon: failed to create task: exec: "
                "\"python3\": executable file not found in $PATH: unknown.", "use an image with python3, Ray and vLLM")


# ---- disk ----

def test_the_disk_row_gives_the_floor_of_the_nodes_load(tmp_path):
    assert one(deployment(tmp_path), healthy(), "spark2", "disk") == (
        "ok", f"reads 2.15 GB/s past the page cache (1.0 GiB of {SHARDS[0]} in 0.50 s), so loading its 18.0 GiB of "
              "weights takes at least 9.0 s", "")


def test_a_disk_that_cannot_be_read_past_the_page_cache_only_warns(tmp_path):
    facts = healthy()
    facts["spark3"]["disk"] = {"unavailable": f"{SHARDS[0]} cannot be opened with O_DIRECT here (Invalid argument), "
                                              "so a read would come from the page cache"}
    assert one(deployment(tmp_path), facts, "spark3", "disk") == (
        "warn", f"could not check: {SHARDS[0]} cannot be opened with O_DIRECT here (Invalid argument), so a read "
                "would come from the page cache", "")


def test_the_probe_reads_one_weight_file_past_the_page_cache_once_per_boot(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    probe = load_probe()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.safetensors").write_bytes(b"x" * (3 << 20))
    (tmp_path / "m" / "b.safetensors").write_bytes(b"y" * (5 << 20))
    weights = [["a.safetensors", 3 << 20], ["b.safetensors", 5 << 20]]
    first = probe.disk({"modelPath": str(tmp_path / "m")}, weights)
    assert first["file"] == "b.safetensors" and first["bytes"] == 5 << 20 and first["seconds"] > 0, first

    def no_read(*args):
        raise AssertionError("read again")

    monkeypatch.setattr(probe.os, "open", no_read)  # the first measure is kept for this boot and file
    assert probe.disk({"modelPath": str(tmp_path / "m")}, weights) == first
    assert len(list((tmp_path / "home/.cache/spark-vllm/preflight").glob("disk-*.json"))) == 1


# ---- loader ----

def test_the_default_load_format_is_one_the_images_vllm_has(tmp_path):
    assert one(deployment(tmp_path), healthy(), "spark2", "loader") == (
        "ok", "auto is a load format of vLLM 0.11.0", "")


def test_a_loader_whose_package_imports_passes_with_its_version(tmp_path):
    d = deployment(tmp_path, serve={"loadFormat": "fastsafetensors"})
    assert one(d, healthy(), "spark3", "loader") == (
        "ok", "fastsafetensors: `fastsafetensors` 0.1.15 imports in vLLM 0.11.0's image", "")


def test_instanttensor_without_its_package_fails_on_every_node_naming_the_image_and_the_fix(tmp_path):
    d = deployment(tmp_path, serve={"loadFormat": "instanttensor"})
    table = judged(d, healthy())
    for node in ("spark1", "spark2", "spark3"):
        f = table[(node, "loader")]
        assert (f.status, f.reason, f.fix) == (
            "fail", "vllm:a has no `instanttensor` package, which load format instanttensor needs",
            "pip install vllm[instanttensor] into the image, or use loadFormat fastsafetensors")


def test_without_fastsafetensors_either_the_fix_falls_back_to_the_default_loader(tmp_path):
    facts = healthy()
    facts["spark2"]["image"]["inside"]["loaderPackages"]["fastsafetensors"] = {"installed": False}
    d = deployment(tmp_path, serve={"loadFormat": "fastsafetensors"})
    assert one(d, facts, "spark2", "loader") == (
        "fail", "vllm:a has no `fastsafetensors` package, which load format fastsafetensors needs",
        "pip install fastsafetensors into the image, or use loadFormat auto")
    d = deployment(tmp_path, serve={"loadFormat": "runai_streamer"})
    assert one(d, facts, "spark2", "loader")[2] == ("pip install runai-model-streamer into the image, or use "
                                                    "loadFormat auto")


def test_a_format_the_images_vllm_lacks_fails_listing_those_it_has(tmp_path):
    facts = healthy()
    facts["spark1"]["image"]["inside"]["loadFormats"] = ["auto", "dummy", "safetensors"]
    d = deployment(tmp_path, serve={"loadFormat": "instanttensor"})
    assert one(d, facts, "spark1", "loader") == (
        "fail", "vLLM 0.11.0 in vllm:a has no load format instanttensor",
        "use one it has (auto, dummy, safetensors), or an image whose vLLM has instanttensor")


def test_a_package_that_does_not_import_without_a_gpu_only_warns(tmp_path):
    facts = healthy()
    facts["spark3"]["image"]["inside"]["loaderPackages"]["instanttensor"] = {
        "installed": True, "error": "RuntimeError: no CUDA device"}
    d = deployment(tmp_path, serve={"loadFormat": "instanttensor"})
    assert one(d, facts, "spark3", "loader") == (
        "warn", "`instanttensor` is in vllm:a but did not import without a GPU (RuntimeError: no CUDA device); the "
                "load will tell", "")


def test_a_vllm_without_the_loader_registry_could_not_be_checked(tmp_path):
    facts = healthy()
    inside = facts["spark2"]["image"]["inside"]
    del inside["loadFormats"]
    inside["loadFormatsError"] = "ImportError: cannot import name '_LOAD_FORMAT_TO_MODEL_LOADER'"
    assert one(deployment(tmp_path), facts, "spark2", "loader") == (
        "warn", "could not check: vLLM 0.11.0 does not list its load formats (ImportError: cannot import name "
                "'_LOAD_FORMAT_TO_MODEL_LOADER')", "")


def test_the_probe_asks_the_image_for_every_package_a_loader_needs():
    assert {package for package, _ in LOADER_NEEDS.values()} == set(load_probe().LOADER_PACKAGES)


# ---- architecture ----

def test_an_architecture_missing_from_the_images_registry_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    for f in facts.values():
        f["model"]["config"]["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    assert one(d, facts, "spark2", "architecture") == (
        "fail", "Qwen3_5MoeForConditionalGeneration (from config.json) is not in the registry of the image's vLLM "
                "0.11.0", "use an image whose vLLM supports Qwen3_5MoeForConditionalGeneration, or another model")


def test_any_supported_architecture_of_several_passes(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["model"]["config"]["architectures"] = ["NoSuchArch", "LlamaForCausalLM"]
    assert one(d, facts, "spark2", "architecture") == (
        "ok", "NoSuchArch, LlamaForCausalLM is supported by vLLM 0.11.0", "")


def test_a_checkpoint_without_config_or_architectures_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    del facts["spark2"]["model"]["config"]
    facts["spark3"]["model"]["config"]["architectures"] = []
    assert one(d, facts, "spark2", "architecture") == (
        "fail", "/models/big/config.json is missing", "copy the complete checkpoint, config.json included")
    assert one(d, facts, "spark3", "architecture") == (
        "fail", "/models/big/config.json names no architectures",
        "use a Hugging Face checkpoint whose config.json lists its architectures")


def test_architecture_without_the_weights_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"]["model"] = {"exists": False, "isFile": False}
    assert one(d, facts, "spark3", "architecture") == ("warn", "could not check: /models/big is not on the node", "")


# ---- weights ----

RSYNC = ("copy them from spark1 over the fabric: on spark1, rsync -a --copy-links --progress /models/big/ "
         "nvidia@192.168.200.2:/models/big/")


def test_a_missing_shard_names_the_node_and_the_shard(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["model"]["files"] = [f for f in MODEL_FILES if f[0] != SHARDS[2]]
    assert one(d, facts, "spark2", "weights") == (
        "fail", "spark2 lacks model-00003-of-00003.safetensors", RSYNC)


def test_many_missing_files_are_counted_and_sizes_that_differ_are_named(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    for f in facts.values():
        f["model"]["files"] += [[f"extra-{k}.bin", 10] for k in range(5)]
    facts["spark2"]["model"]["files"] = [["config.json", 900], [SHARDS[0], 5 * GIB], [SHARDS[1], 6 * GIB]]
    assert one(d, facts, "spark2", "weights") == (
        "fail", "spark2 lacks extra-0.bin, extra-1.bin, extra-2.bin and 4 more; spark2's model-00001-of-00003."
                "safetensors is 5.0 GiB, spark1's is 6.0 GiB", RSYNC)


def test_extra_files_on_a_worker_warn(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["model"]["files"].append(["model-00004-of-00003.safetensors", 1024])
    assert one(d, facts, "spark2", "weights") == (
        "warn", "4 weight files, 18.0 GiB: every file of spark1, the same size, and also "
                "model-00004-of-00003.safetensors (contents not hashed: spark-vllm:preflight.hashWeights is off)",
        "remove what spark1 does not have, so every node loads the same files")


def test_weights_missing_on_a_worker_fail_with_the_copy_command(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["model"] = {"exists": False, "isFile": False}
    assert one(d, facts, "spark2", "weights") == ("fail", "/models/big is not there on spark2", RSYNC)


def test_weights_missing_everywhere_fail_without_a_source(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    for f in facts.values():
        f["model"] = {"exists": False, "isFile": False}
    assert one(d, facts, "spark1", "weights") == (
        "fail", "/models/big is not there on spark1", "put the model's weights at /models/big on every node")
    assert one(d, facts, "spark1", "memory") == (
        "warn", "could not check: no node has the weights, so their size is unknown", "")


def test_a_path_that_is_a_file_or_holds_no_weights_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["model"] = {"exists": False, "isFile": True}
    facts["spark3"]["model"]["files"] = [["config.json", 900]]
    assert one(d, facts, "spark1", "weights") == (
        "fail", "/models/big is a file, not a folder on spark1",
        "copy them from spark2 over the fabric: on spark2, rsync -a --copy-links --progress /models/big/ "
        "nvidia@192.168.200.1:/models/big/")
    assert one(d, facts, "spark3", "weights") == (
        "fail", "/models/big holds no *.safetensors, *.bin or *.pt files",
        "copy them from spark2 over the fabric: on spark2, rsync -a --copy-links --progress /models/big/ "
        "nvidia@192.168.200.3:/models/big/")


def test_hashed_weights_name_a_shard_whose_contents_differ(tmp_path):
    d, facts = deployment(tmp_path, hashWeights=True), healthy()
    for f in facts.values():
        f["model"]["sha256"] = {name: "0" * 64 for name in SHARDS}
    facts["spark2"]["model"]["sha256"][SHARDS[1]] = "1" * 64
    table = judged(d, facts)
    assert table[("spark1", "weights")].reason == "3 weight files, 18.0 GiB; 3 SHA-256 sums taken"
    assert table[("spark3", "weights")].reason == \
        "3 weight files, 18.0 GiB, the same names and sizes as spark1; SHA-256 the same as spark1's"
    f = table[("spark2", "weights")]
    assert (f.status, f.reason, f.fix) == (
        "fail", "spark2's model-00002-of-00003.safetensors differs from spark1's (SHA-256)", RSYNC)


def needed(d, facts) -> dict[str, bool]:
    return weight_manifests.sync_needed(d.cluster, d.cluster.head, d.preflight.hash_weights, typed(facts))


SYNC = "will sync from spark1 over the fabric (spark-vllm:preflight.syncWeights)"


def test_with_sync_on_what_the_sync_repairs_warns_and_names_the_head(tmp_path):
    d, facts = deployment(tmp_path, syncWeights=True), healthy()
    facts["spark2"]["model"]["files"] = [f for f in MODEL_FILES if f[0] != SHARDS[2]]
    facts["spark3"]["model"] = {"exists": False, "isFile": False}
    assert one(d, facts, "spark2", "weights") == (
        "warn", f"spark2 lacks model-00003-of-00003.safetensors; {SYNC}", "")
    assert one(d, facts, "spark3", "weights") == ("warn", f"/models/big is not there on spark3; {SYNC}", "")
    assert needed(d, facts) == {"spark2": True, "spark3": True}
    facts["spark3"]["model"] = {"exists": True, "files": [["config.json", 900]]}
    assert one(d, facts, "spark3", "weights") == (
        "warn", f"/models/big holds no *.safetensors, *.bin or *.pt files; {SYNC}", "")


def test_with_sync_on_equal_weights_pass_and_need_no_sync(tmp_path):
    d, facts = deployment(tmp_path, syncWeights=True), healthy()
    facts["spark3"]["model"]["files"].append(["notes.txt", 5])  # extra files are not the sync's business
    assert needed(d, facts) == {"spark2": False, "spark3": False}
    assert one(d, facts, "spark2", "weights")[0] == "ok" and one(d, facts, "spark3", "weights")[0] == "warn"


def test_with_sync_and_hashes_every_difference_is_named_and_synced(tmp_path):
    d, facts = deployment(tmp_path, syncWeights=True, hashWeights=True), healthy()
    for f in facts.values():
        f["model"]["sha256"] = {name: "0" * 64 for name in SHARDS}
    facts["spark2"]["model"]["sha256"][SHARDS[1]] = "1" * 64
    facts["spark2"]["model"]["files"][1] = [SHARDS[0], 5 * GIB]
    facts["spark2"]["model"]["sha256"][SHARDS[0]] = "2" * 64
    assert one(d, facts, "spark2", "weights") == (
        "warn", "spark2's model-00001-of-00003.safetensors is 5.0 GiB, spark1's is 6.0 GiB; spark2's "
                f"model-00002-of-00003.safetensors differs from spark1's (SHA-256); {SYNC}", "")
    facts["spark2"]["model"]["files"][1] = [SHARDS[0], 6 * GIB]
    facts["spark2"]["model"]["sha256"][SHARDS[0]] = "0" * 64
    assert needed(d, facts) == {"spark2": True, "spark3": False}
    d_sizes = deployment(tmp_path / "sizes", syncWeights=True)  # without hashWeights, same sizes are the same
    assert needed(d_sizes, facts) == {"spark2": False, "spark3": False}


def test_with_sync_on_a_node_without_rsync_still_fails(tmp_path):
    d, facts = deployment(tmp_path, syncWeights=True), healthy()
    facts["spark2"]["model"]["files"] = [f for f in MODEL_FILES if f[0] != SHARDS[2]]
    facts["spark1"]["rsync"], facts["spark2"]["rsync"] = False, False
    assert one(d, facts, "spark2", "weights") == (
        "fail", "spark2 lacks model-00003-of-00003.safetensors; spark-vllm:preflight.syncWeights cannot copy them: "
                "rsync is not installed on spark1 and spark2",
        "install rsync on spark1 and spark2 (`sudo apt-get install rsync`)")


def test_with_sync_on_what_it_cannot_repair_still_fails(tmp_path):
    d, facts = deployment(tmp_path, syncWeights=True), healthy()
    facts["spark2"]["model"] = {"exists": False, "isFile": True}
    assert one(d, facts, "spark2", "weights") == ("fail", "/models/big is a file, not a folder on spark2", RSYNC)
    facts["spark1"]["model"] = {"exists": False, "isFile": False}  # the head, the sync's source, lacks the model
    facts["spark3"]["model"]["files"] = facts["spark3"]["model"]["files"][:2]
    assert one(d, facts, "spark1", "weights") == (
        "fail", "/models/big is not there on spark1", "copy them from spark3 over the fabric: on spark3, rsync -a "
                                                      "--copy-links --progress /models/big/ "
                                                      "nvidia@192.168.200.1:/models/big/")
    assert one(d, facts, "spark3", "weights")[0] == "ok"  # spark3 is the reference now
    assert needed(d, facts) == {"spark2": False, "spark3": False}


def test_weights_that_could_not_be_read_are_not_synced(tmp_path):
    d, facts = deployment(tmp_path, syncWeights=True), healthy()
    facts["spark2"]["model"] = {"unavailable": "permission denied on /models/big"}
    del facts["spark3"]["model"]
    assert needed(d, facts) == {"spark2": False, "spark3": False}


def test_unreadable_weights_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"]["model"] = {"unavailable": "permission denied on /models/big"}
    assert one(d, facts, "spark3", "weights") == (
        "warn", "could not check: permission denied on /models/big", "let nvidia read /models/big")
    assert one(d, facts, "spark3", "architecture") == ("warn", "could not check: permission denied on /models/big", "")


# ---- memory ----

def test_a_model_that_does_not_fit_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"]["memory"] = {"totalKib": 12 * 1024 * 1024}
    assert one(d, facts, "spark3", "memory") == (
        "fail", f"needs about 10.7 GiB ({NEED}) of 10.2 GiB (0.85 x 12.0 GiB): it does not fit",
        "spread the model over more nodes, or lower maxModelLen, or raise gpuMemoryUtilization "
        "(at most 0.86 on a GB10)")


def test_utilization_above_the_gb10_start_up_limit_warns(tmp_path):
    d, facts = deployment(tmp_path, serve={"gpuMemoryUtilization": 0.87}), healthy()
    assert one(d, facts, "spark1", "memory") == (
        "warn", f"needs about 10.7 GiB ({NEED}) of 111.4 GiB (0.87 x 128.0 GiB); gpuMemoryUtilization 0.87 is "
                "above 0.86 on a unified-memory GB10: only about 101-102 GiB of 121.69 GiB is free at boot, so vLLM's "
                "start-up check fails",
        "set spark-vllm:serve.gpuMemoryUtilization to 0.85")
    facts["spark1"]["gpus"]["names"] = ["NVIDIA H100 80GB HBM3"]  # not unified: vLLM checks the GPU's own memory
    assert one(d, facts, "spark1", "memory")[0] == "ok"


def test_cuda_graphs_at_high_utilization_warn(tmp_path):
    d, facts = deployment(tmp_path, serve={"enforceEager": False, "maxModelLen": None}), healthy()
    # Without maxModelLen the KV estimate takes config.json's max_position_embeddings (40960: 10 GiB, a third here).
    assert one(d, facts, "spark1", "memory") == (
        "warn", "needs about 13.3 GiB (weights 6.0 GiB, KV for one 40960-token sequence 3.3 GiB, overhead 4.0 GiB) "
                "of 108.8 GiB (0.85 x 128.0 GiB); enforceEager is off at gpuMemoryUtilization 0.85: CUDA graph "
                "capture needs headroom (the seed's load was killed at 95 % memory)",
        "set spark-vllm:serve.enforceEager to true, or gpuMemoryUtilization to at most 0.8")


def test_memory_without_the_kv_shape_says_so(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    del facts["spark1"]["model"]["config"]["num_key_value_heads"]
    assert one(d, facts, "spark2", "memory") == (
        "ok", "needs about 10.0 GiB (weights 6.0 GiB, KV not estimated, overhead 4.0 GiB) of 108.8 GiB "
              "(0.85 x 128.0 GiB)", "")


def test_other_stacks_deployed_on_a_node_add_up_with_this_one(tmp_path):
    """Their claims (a labelled volume a node, resources/memory_claim.py) count, whoever deployed them; this stack's
    own claim (an earlier up of it) does not count twice."""
    d, facts = deployment(tmp_path, serve={"gpuMemoryUtilization": 0.5}), healthy()
    facts["spark2"]["claims"] = {"byStack": {"qwen3-30b": 0.45, "test": 0.5}}
    assert one(d, facts, "spark2", "memory") == (
        "fail", "0.45 (qwen3-30b, deployed) + 0.50 (this stack) = 0.95 > 0.86, the unified-memory limit",
        "lower spark-vllm:serve.gpuMemoryUtilization to at most 0.41, or destroy stack qwen3-30b first, or put this "
        "stack on other nodes (spark-vllm:nodes)")
    facts["spark2"]["claims"] = {"byStack": {"b": 0.3, "a": 0.2}}
    assert one(d, facts, "spark2", "memory") == (
        "fail", "0.20 (a, deployed) + 0.30 (b, deployed) + 0.50 (this stack) = 1.00 > 0.86, the unified-memory limit",
        "lower spark-vllm:serve.gpuMemoryUtilization to at most 0.36, or destroy stacks a, b first, or put this stack "
        "on other nodes (spark-vllm:nodes)")
    facts["spark2"]["claims"] = {"byStack": {"a": 0.3}}
    assert one(d, facts, "spark2", "memory") == (
        "ok", f"needs about 10.7 GiB ({NEED}) of 64.0 GiB (0.5 x 128.0 GiB); shared: 0.30 (a, deployed) + 0.50 "
              "(this stack) = 0.80, within 0.86", "")
    facts["spark2"]["claims"] = {"byStack": {"a": 0.45}}
    facts["spark2"]["gpus"]["names"] = ["NVIDIA H100 80GB HBM3"]  # its own memory: the fractions may reach 1
    assert one(d, facts, "spark2", "memory")[0] == "ok"
    facts["spark2"]["claims"] = {"byStack": {"a": 0.55}}
    assert one(d, facts, "spark2", "memory")[1] == (
        "0.55 (a, deployed) + 0.50 (this stack) = 1.05 > 1, the GPU's memory")


def test_memory_without_meminfo_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["memory"] = {"unavailable": "/proc/meminfo has no MemTotal"}
    assert one(d, facts, "spark2", "memory") == ("warn", "could not check: /proc/meminfo has no MemTotal", "")


# ---- ports ----

def holder(process, pid, container=None, stack=None):
    return {"pid": pid, "process": process, **({"container": container, "stack": stack or ""} if container else {})}


def test_ports_held_by_this_stacks_own_containers_pass(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["ports"] = {
        "6379": {"free": False, "holders": [holder("gcs_server", 41, "spark-vllm-test-ray-head", "test")]},
        "8265": {"free": False, "holders": [holder("python3", 42, "spark-vllm-test-ray-head", "test")]},
        "8000": {"free": True}, "29511": {"free": True}}
    assert one(d, facts, "spark1", "ports") == (
        "ok", "6379 (Ray GCS) held by this stack's spark-vllm-test-ray-head; 8265 (dashboard) held by this stack's "
              "spark-vllm-test-ray-head; 8000 (API) free; 29511 (watchdog) free", "")


def test_ports_held_by_others_fail_naming_the_holder_and_the_fix(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["ports"] = {
        "6379": {"free": False, "holders": [holder("gcs_server", 41, "spark-vllm-gpt-oss-ray-head", "gpt-oss")]},
        "8265": {"free": False, "holders": [holder("python3", 42, "ray-by-hand")]},
        "8000": {"free": False, "holders": [holder("vllm", 43)]},
        "29511": {"free": True}}
    assert one(d, facts, "spark1", "ports") == (
        "fail", "6379 (Ray GCS) is held by gcs_server (pid 41) in spark-vllm-gpt-oss-ray-head of stack gpt-oss; "
                "8265 (dashboard) is held by python3 (pid 42) in container ray-by-hand; 8000 (API) is held by vllm "
                "(pid 43), outside any container; 29511 (watchdog) free",
        "destroy that stack first (`pulumi destroy -s gpt-oss`)" + OWN_SLOT + "; stop it (`docker stop "
        "ray-by-hand`), or change ray.dashboardPort; stop pid 43, or change api.port")


def test_a_stack_holding_several_ports_is_named_once_in_the_fix(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    held = (("6379", "gcs_server", 41), ("8265", "python3", 42), ("8000", "vllm", 43))
    facts["spark1"]["ports"].update({port: {"free": False, "holders": [holder(p, pid, "spark-vllm-lab-ray-head",
                                                                              "lab")]} for port, p, pid in held})
    assert one(d, facts, "spark1", "ports")[2] == (
        "destroy that stack first (`pulumi destroy -s lab`)" + OWN_SLOT)


def test_a_port_whose_holder_exited_as_it_was_checked_is_free(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["ports"]["8000"] = {"free": False, "holders": [{"pid": 43, "process": "vllm", "exiting": True}]}
    assert one(d, facts, "spark1", "ports") == (
        "ok", "6379 (Ray GCS) free; 8265 (dashboard) free; 8000 (API) free (its holder, pid 43, exited as it was "
              "checked); 29511 (watchdog) free", "")


def test_a_port_whose_owner_is_hidden_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["ports"]["8000"] = {"free": False, "hidden": True}
    assert one(d, facts, "spark1", "ports") == (
        "warn", "6379 (Ray GCS) free; 8265 (dashboard) free; could not check: 8000 (API) is in use, and ss shows its "
                "owner only to root; 29511 (watchdog) free", "see who holds it: `sudo ss -tlnp 'sport = :8000'`")


def running(*containers):
    return [{"container": name, "stack": stack} for name, stack in containers]


def test_a_hidden_owner_while_another_stack_runs_fails_naming_that_stack(tmp_path):
    # Not root: ss names no owner, but `docker ps` names the stack whose containers run on the head.
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["ports"]["8000"] = {"free": False, "hidden": True,
                                        "running": running(("spark-vllm-gpt-oss-ray-head", "gpt-oss"))}
    assert one(d, facts, "spark1", "ports") == (
        "fail", "6379 (Ray GCS) free; 8265 (dashboard) free; 8000 (API) is in use while stack gpt-oss runs here "
                "(spark-vllm-gpt-oss-ray-head; ss names a port's owner only to root); 29511 (watchdog) free",
        "destroy that stack first (`pulumi destroy -s gpt-oss`)" + OWN_SLOT)


def test_a_hidden_owner_while_two_other_stacks_run_names_both(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["ports"]["6379"] = {"free": False, "hidden": True, "running": running(
        ("spark-vllm-b-ray-head", "b"), ("spark-vllm-a-vllm-rank-spark1", "a"), ("spark-vllm-test-ray-head", "test"))}
    assert one(d, facts, "spark1", "ports") == (
        "fail", "6379 (Ray GCS) is in use while stacks a, b run here (spark-vllm-b-ray-head, "
                "spark-vllm-a-vllm-rank-spark1; ss names a port's owner only to root); 8265 (dashboard) free; "
                "8000 (API) free; 29511 (watchdog) free",
        "destroy those stacks first (`pulumi destroy -s a`, `pulumi destroy -s b`)" + OWN_SLOT)


def test_a_hidden_owner_while_only_this_stack_runs_passes(tmp_path):
    # `up` again over this stack's own deployment, as a user who is not root.
    d, facts = deployment(tmp_path), healthy()
    for port in ("6379", "8265", "8000"):
        facts["spark1"]["ports"][port] = {"free": False, "hidden": True,
                                          "running": running(("spark-vllm-test-ray-head", "test"))}
    assert one(d, facts, "spark1", "ports") == (
        "ok", "6379 (Ray GCS) in use while this stack's spark-vllm-test-ray-head runs; 8265 (dashboard) in use while "
              "this stack's spark-vllm-test-ray-head runs; 8000 (API) in use while this stack's "
              "spark-vllm-test-ray-head runs; 29511 (watchdog) free", "")


def test_ports_without_ss_could_not_be_checked(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark1"]["ports"] = {"unavailable": "`ss` is not installed"}
    assert one(d, facts, "spark1", "ports") == (
        "warn", "could not check: `ss` is not installed", "install iproute2 (ss) on the node")


# ---- guard ----

def test_the_guard_in_place_passes_and_a_missing_or_stale_one_is_replaced_by_up(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    assert chain_name("test", d.cluster) == "svl-test-0f042094"  # the chain of healthy()'s facts
    facts["spark2"]["guard"] = {"hooked": []}
    facts["spark3"]["guard"] = {"hooked": ["svl-test-0000aaaa"]}
    assert one(d, facts, "spark1", "guard") == (
        "ok", "Ray's ports are closed to all but enp1s0f1np1 and loopback (chain svl-test-0f042094)", "")
    assert one(d, facts, "spark2", "guard") == (
        "ok", "the rules that close Ray's ports to all but enp1s0f1np1 are not in place; `up` applies them", "")
    assert one(d, facts, "spark3", "guard") == (
        "ok", "chain svl-test-0000aaaa guards other ports; `up` puts svl-test-0f042094 in first, then removes it", "")
    assert [preflight.guard_found(d, typed(facts), d.cluster.node(n)) for n in ("spark1", "spark2", "spark3")] == [
        GuardState.IN_PLACE, GuardState.MISSING, GuardState.STALE]
    assert preflight.guard_found(d, {}, d.cluster.head) is None  # preflight off
    assert guard_state("test", d.cluster, None) is None


def test_a_guard_that_cannot_be_checked_fails_since_up_could_not_apply_it(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark3"]["guard"] = {"unavailable": "sudo: a password is required"}
    assert one(d, facts, "spark3", "guard") == (
        "fail", "could not check: sudo: a password is required; `up` could not apply the guard either",
        "let nvidia run iptables with `sudo -n` (or install iptables), or set ray.fabricGuard: false")


def test_without_the_guard_there_is_no_guard_row_and_no_probe_for_it(tmp_path):
    cfg = stack_config(write_catalog(tmp_path / "catalog", clusters=cluster_with(
        lambda c: c["ray"].update(fabricGuard=False))), preflight={"enabled": True})
    d = loader.load("test", cfg, set(), ROOT)
    facts = healthy()
    for f in facts.values():
        del f["guard"]
    assert not any(check == "guard" for _, check in judged(d, facts))
    assert preflight_probe.probe_spec(d, d.cluster.head)["guard"] is None


# ---- the table, and the program ----

def test_the_table_lists_every_finding_with_its_fix(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["model"]["files"] = [f for f in MODEL_FILES if f[0] != SHARDS[2]]
    lines = render(evaluate(d, typed(facts), liveness.judge(d, typed(facts)))).splitlines()
    assert lines[0].split() == ["node", "check", "result"]
    assert "spark2  weights       FAIL    spark2 lacks model-00003-of-00003.safetensors. Fix: " + RSYNC in lines
    assert ("spark1  ports         ok      6379 (Ray GCS) free; 8265 (dashboard) free; 8000 (API) free; "
            "29511 (watchdog) free") in lines
    assert len(lines) == 1 + 3 * 14 + 1  # 14 checks a node, nccl among them


def test_a_failure_stops_the_program_before_any_resource_with_the_whole_table(tmp_path, monkeypatch):
    facts = healthy()
    facts["spark2"]["model"]["files"] = [f for f in MODEL_FILES if f[0] != SHARDS[2]]
    facts["spark3"]["image"]["id"] = OTHER_ID
    probed = []
    monkeypatch.setattr(preflight, "probe", lambda d, node: probed.append(node.name) or parse(facts[node.name]))
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True})
    with pytest.raises(pulumi.RunError) as err:
        run_program(cfg)
    message = str(err.value)
    assert sorted(probed) == ["spark1", "spark2", "spark3"]
    assert message.startswith("preflight of 3 nodes took ") and ": 1 failed, 1 warnings; nothing was deployed or "\
        "changed.\n" in message
    assert "spark2 lacks model-00003-of-00003.safetensors" in message
    assert f"spark3 holds vllm:a as cd34cd34cd34; {COPIES}" in message
    assert "Traceback" not in message


def test_a_clean_preflight_lets_the_program_register_everything(tmp_path, monkeypatch):
    facts = healthy()
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    recording = run_program(stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True}))
    assert "serve-ready-gate" in recording.names()


def test_run_returns_every_nodes_facts_for_the_sync(tmp_path, monkeypatch):
    facts = healthy()
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    d = deployment(tmp_path, syncWeights=True)
    assert preflight.run(d).facts == typed(facts)
    assert preflight.run(deployment(tmp_path / "off", enabled=False)) == preflight.Checked()


def test_preflight_off_probes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "probe", lambda d, node: pytest.fail("probed with preflight off"))
    assert "serve-ready-gate" in run_program(stack_config(write_catalog(tmp_path / "catalog"))).names()


def test_the_probe_is_sent_with_the_docker_providers_ssh_options_on_connections_of_its_own(tmp_path, monkeypatch):
    d = deployment(tmp_path, timeoutSeconds=7)
    calls = []

    class Done:
        returncode, stderr = 0, ""
        stdout = preflight_probe.MARK + json.dumps({"docker": {"server": "28.0.1", "driver": "overlay2"}}) + "\n"

    monkeypatch.setattr(node_runner.subprocess, "run", lambda argv, **kw: calls.append((argv, kw)) or Done())
    assert preflight_probe.probe(d, d.cluster.node("spark2")).docker == Docker(server="28.0.1", driver="overlay2")
    argv, kw = calls[0]
    opts = provider_ssh_opts(d.cluster.ssh, d.cluster.node("spark1"), shared=False)
    assert "ControlPath=none" in argv and not any(o.startswith("ControlMaster") for o in argv)
    assert argv[:len(opts) + 3] == ["ssh", *opts, "-p", "22"]
    assert any(o.startswith("ProxyCommand=ssh ") and o.endswith(" -W %h:%p nvidia@10.10.10.11") for o in argv)
    assert argv[-3:-1] == ["nvidia@192.168.200.2", "--"]
    started, probe = argv[-1].split("; ", 1)
    assert started == "echo 'spark-vllm: command started' >&2" and probe.startswith("python3 - ")
    spec = json.loads(shlex.split(probe)[2])
    assert spec["peers"] == {"spark1": "192.168.200.1", "spark3": "192.168.200.3"} and spec["ports"] == []
    assert spec["syncWeights"] is False
    assert 6 < kw["timeout"] <= 7 and kw["input"].startswith('"""Collects one node')


# ---- the probe's own fact-gathering, on this machine ----

def load_probe():
    spec = importlib.util.spec_from_file_location("preflight_probe", ROOT / "components/remote/preflight_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_lists_the_weights_and_reads_the_text_config(tmp_path):
    probe = load_probe()
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / ".cache").mkdir()
    (root / ".cache" / "lock").write_text("x")
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                                                  "text_config": {"num_hidden_layers": 48, "head_dim": 256}}))
    (root / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 100)
    (root / "sub" / "extra.bin").write_bytes(b"\1" * 7)
    facts = probe.model({"modelPath": str(root), "hashWeights": True})
    assert facts["files"] == [["config.json", len((root / "config.json").read_text())],
                              ["model-00001-of-00001.safetensors", 100], ["sub/extra.bin", 7]]
    assert facts["config"] == {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "num_hidden_layers": 48,
                               "head_dim": 256}
    assert facts["sha256"] == {"model-00001-of-00001.safetensors": hashlib.sha256(b"\0" * 100).hexdigest(),
                               "sub/extra.bin": hashlib.sha256(b"\1" * 7).hexdigest()}
    assert probe.model({"modelPath": str(tmp_path / "none"), "hashWeights": False}) == {"exists": False,
                                                                                          "isFile": False}


def test_the_probe_says_whether_rsync_is_there_only_when_the_sync_is_on(monkeypatch):
    probe = load_probe()
    printed = []
    for gather in ("docker", "gpus", "fabric", "host_nccl", "model", "memory", "space"):
        monkeypatch.setattr(probe, gather, lambda *args: {})
    monkeypatch.setattr(probe, "print", lambda line: printed.append(line), raising=False)
    monkeypatch.setattr(probe.shutil, "which", lambda tool: "/usr/bin/rsync" if tool == "rsync" else None)
    for sync in (True, False):
        monkeypatch.setattr(probe.sys, "argv", ["probe", json.dumps({"ports": [], "guard": None, "syncWeights": sync})])
        probe.main()
        facts = json.loads(printed[-1][len(probe.MARK):])
        assert facts.get("rsync") is (True if sync else None)


def test_the_probe_reports_a_missing_tool_as_unavailable():
    probe = load_probe()
    assert probe.gather("x", probe.sh, ["no-such-tool-here", "-L"], 5) == {"unavailable": "`no-such-tool-here` is "
                                                                                          "not installed"}


def test_the_probe_names_the_stacks_running_where_ss_hides_a_ports_owner(monkeypatch):
    # What `ss -tlnp` and `docker ps` print to a user of the docker group who is not root.
    probe = load_probe()
    answers = {
        "ss": "LISTEN 0 2048 0.0.0.0:8000 0.0.0.0:*\nLISTEN 0 511 192.168.200.1:6379 0.0.0.0:*\n"
              'LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=7,fd=3))\n',
        "docker": "f00d\tspark-vllm-b-ray-head\tb\nbeef\tregistry\t\nc0de\tspark-vllm-a-ray-head\ta\n"}
    monkeypatch.setattr(probe, "sh", lambda argv, timeout: (0, answers[argv[0]], ""))
    assert probe.ports({"ports": [8000, 6379, 8265], "stepTimeout": 5}) == {
        "6379": {"free": False, "hidden": True, "running": [{"container": "spark-vllm-a-ray-head", "stack": "a"},
                                                             {"container": "spark-vllm-b-ray-head", "stack": "b"}]},
        "8000": {"free": False, "hidden": True, "running": [{"container": "spark-vllm-a-ray-head", "stack": "a"},
                                                             {"container": "spark-vllm-b-ray-head", "stack": "b"}]},
        "8265": {"free": True}}


@pytest.mark.parametrize("script, facts", [
    ("echo svl-x-1; echo svl-x-2", {"hooked": ["svl-x-1", "svl-x-2"]}),
    ("true", {"hooked": []}),
    ("echo 'iptables is not installed' >&2; exit 3", {"unavailable": "iptables is not installed"}),
])
def test_the_probe_reads_the_guards_list(script, facts, monkeypatch):
    probe = load_probe()
    monkeypatch.setattr(probe.os, "geteuid", lambda: 0)
    spec = {"guard": {"script": script, "prefix": "svl-x-", "label": "spark-vllm stack x"}, "stepTimeout": 5}
    assert probe.gather("guard", probe.guard, spec) == facts


def test_the_guard_script_lists_only_the_stacks_hooked_chains(tmp_path, monkeypatch):
    """Stack `a` beside stacks `a-b` (whose chain's name starts with a's prefix) and `a-long-name-2` (whose name
    shares a's first 10 characters... here its chain carries a's prefix but another label): only a's own."""
    rules = {"svl-a-11111111": "spark-vllm stack a", "svl-a-b-22222222": "spark-vllm stack a-b",
             "svl-a-33333333": "spark-vllm stack a-long-name-2", "svl-a-44444444": "spark-vllm stack a"}
    # A stand-in iptables: `-S INPUT` hooks every chain above (the last one only from another rule) and docker's;
    # `-S CHAIN` prints the chain's first rule with its label, as iptables quotes it.
    chains = "".join(f"  {name}) echo '-A {name} -i lo -m comment --comment \"{label}\" -j RETURN' ;;\n"
                     for name, label in rules.items())
    (tmp_path / "iptables").write_text(
        "#!/bin/sh\n[ \"$1\" = -w ] && shift\ncase \"$2\" in\n"
        "  INPUT) printf '%s\\n' '-P INPUT ACCEPT' '-A INPUT -j svl-a-11111111' '-A INPUT -j svl-a-b-22222222' "
        "'-A INPUT -j svl-a-33333333' '-A INPUT -j DOCKER-USER' '-A INPUT -i lo -j svl-a-44444444' ;;\n"
        + chains + "esac\n")
    (tmp_path / "iptables").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    script = (ROOT / "components/remote/fabric_guard.sh").read_text()

    def listed(*args):
        done = subprocess.run(["sh", "-c", script, "fabric-guard", "list", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert listed("svl-a-", "spark-vllm stack a") == ["svl-a-11111111"]
    assert listed("svl-a-", "spark-vllm stack a-long-name-2") == ["svl-a-33333333"]
    # Without a label (the keeper asks whether its one chain is hooked): every hooked chain named so.
    assert listed("svl-a-11111111") == ["svl-a-11111111"]


def test_the_probe_reads_inside_an_image_once_per_image_id(tmp_path, monkeypatch):
    bin_dir, runs = tmp_path / "bin", tmp_path / "runs"
    bin_dir.mkdir()
    # A stand-in docker: `image inspect` prints an id, `run` counts itself and prints what the image holds.
    (bin_dir / "docker").write_text(f"""#!/bin/sh
case "$1" in
  image) echo sha256:$(cat {tmp_path}/id) 1024 ;;
  run) echo run >> {runs}; echo '{preflight_probe.MARK}{{"ray": "2.60.0", "vllm": "0.11.0", "archs": ["A"]}}' ;;
esac
""")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    probe = load_probe()
    spec = {"image": "vllm:a", "stepTimeout": 5, "imageTimeout": 5}
    (tmp_path / "id").write_text("ab12")
    first, second = probe.image(spec), probe.image(spec)
    assert first == second == {"present": True, "id": "sha256:ab12", "size": 1024,
                               "inside": {"ray": "2.60.0", "vllm": "0.11.0", "archs": ["A"]}}
    assert runs.read_text().count("run") == 1
    # inside4-: the facts gained the image's huggingface_hub; a cache from before lacks it, and is not read.
    assert (tmp_path / "home/.cache/spark-vllm/preflight/inside5-ab12.json").exists()
    (tmp_path / "id").write_text("cd34")  # a new image under the same tag is read again
    assert probe.image(spec)["id"] == "sha256:cd34" and runs.read_text().count("run") == 2


def test_the_probe_runs_the_catalogs_gpu_stand_in():
    probe = load_probe()
    spec = {"gpuProbe": "echo 'GPU 0: NVIDIA GB10 (UUID: GPU-1234)'; echo 'GPU 1: NVIDIA GB10 (stand-in)'",
            "dockerGpus": None, "stepTimeout": 5}
    assert probe.gpus(spec, False) == {"source": "gpuProbe", "names": ["NVIDIA GB10", "NVIDIA GB10 (stand-in)"]}


@pytest.mark.parametrize("double,expected", [(True, True), (False, False)])
def test_the_probe_asks_the_images_vllm_serve_for_nnodes(tmp_path, monkeypatch, double, expected):
    """Against the vLLM double's real parser (which has --nnodes), and a `vllm` whose help lacks it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if double:
        shim = f'#!/bin/sh\nPYTHONPATH={ROOT}/lab/vllm_double exec {sys.executable} -m vllm "$@"\n'
    else:  # an old vLLM: grouped help it does not know, and no --nnodes
        shim = ('#!/bin/sh\ncase "$*" in *--help=all*) echo "unrecognized arguments: --help=all"; exit 2;; esac\n'
                'echo "usage: vllm serve [--tensor-parallel-size TP] [--distributed-executor-backend B]"\n')
    (bin_dir / "vllm").write_text(shim)
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    done = subprocess.run([sys.executable, "-c", load_probe().INSIDE_IMAGE], capture_output=True, text=True,
                          timeout=120, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    facts = json.loads(done.stdout.split(preflight_probe.MARK)[-1])
    assert facts["serveNnodes"] is expected, facts


@pytest.mark.parametrize("with_instanttensor", [True, False])
def test_the_probe_reads_the_load_formats_and_the_loaders_packages_from_the_vllm_double(tmp_path, with_instanttensor):
    """As in the lab's images: the Ray one has the stand-ins of fastsafetensors and instanttensor, the mp one only
    the first."""
    double = ROOT / "lab" / "vllm_double"
    for package in ("fastsafetensors", "instanttensor") if with_instanttensor else ("fastsafetensors",):
        shutil.copytree(double / "loader_packages" / package, tmp_path / package)
    done = subprocess.run([sys.executable, "-c", load_probe().INSIDE_IMAGE], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{double}:{tmp_path}"})
    facts = json.loads(done.stdout.split(preflight_probe.MARK)[-1])
    assert facts["loadFormats"] == list(LOAD_FORMATS), facts
    assert facts["loaderPackages"] == {
        "fastsafetensors": {"installed": True, "version": "0.0.0+lab"},
        "instanttensor": {"installed": True, "version": "0.0.0+lab"} if with_instanttensor else {"installed": False},
        "runai_model_streamer": {"installed": False}, "tensorizer": {"installed": False}}


# ---- the fabric's path: a ping of each peer bound to the interface, at the whole MTU, fragmentation off ----

def reach_of(facts, node, peer, **reach):
    facts[node]["fabric"]["routes"][peer]["reach"] = reach


def test_every_peer_answering_a_full_size_packet_is_said(tmp_path):
    facts = healthy()
    for peer in ("spark1", "spark3"):
        reach_of(facts, "spark2", peer, full=True)
    assert one(deployment(tmp_path), facts, "spark2", "fabric") == (
        "ok", "enp1s0f1np1 up, 192.168.200.2/24, MTU 9000; routes to spark1, spark3 leave through it; spark1, "
              "spark3 answer a 9000-byte packet unfragmented", "")


def test_a_peer_that_answers_only_small_packets_warns_and_one_that_answers_nothing_fails(tmp_path):
    facts = healthy()
    reach_of(facts, "spark2", "spark1", full=True)
    reach_of(facts, "spark2", "spark3", full=False, small=True, error="")
    assert one(deployment(tmp_path), facts, "spark2", "fabric") == (
        "warn", "enp1s0f1np1 up, 192.168.200.2/24, MTU 9000; routes to spark1, spark3 leave through it; spark1 "
                "answers a 9000-byte packet unfragmented; but a 9000-byte packet, fragmentation off, does not pass "
                "to spark3 where a small one does: the path's MTU is below enp1s0f1np1's",
        "set the same MTU (9000 on Sparks) on enp1s0f1np1 of every node, and on any switch between")
    reach_of(facts, "spark2", "spark3", full=False, small=False,
             error="1 packets transmitted, 0 received, 100% packet loss, time 0ms")
    assert one(deployment(tmp_path), facts, "spark2", "fabric") == (
        "fail", "spark3 (192.168.200.3) does not answer a ping over enp1s0f1np1 (1 packets transmitted, 0 received, "
                "100% packet loss, time 0ms)",
        "check the cable between spark2 and spark3, and that spark3's enp1s0f1np1 is up with 192.168.200.3")
    reach_of(facts, "spark2", "spark3", unavailable="`ping` is not installed")
    assert one(deployment(tmp_path), facts, "spark2", "fabric")[:2] == (
        "warn", "could not check: enp1s0f1np1 up, 192.168.200.2/24, MTU 9000; routes to spark1, spark3 leave through "
                "it; spark1 answers a 9000-byte packet unfragmented; whether spark3 answers: `ping` is not installed")


def test_the_probe_pings_bound_to_the_interface_at_the_mtu_with_fragmentation_off(tmp_path, monkeypatch):
    """A `ping` that records its arguments and answers only what the test allows: the probe's own command line."""
    probe = load_probe()
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "ping"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *"-M do"*) exit "$FULL";; *) exit "$SMALL";; '
                    'esac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    for full, small, found in (("0", "1", {"full": True}),
                               ("1", "0", {"full": False, "small": True, "error": ""}),
                               ("1", "1", {"full": False, "small": False, "error": ""})):
        monkeypatch.setenv("FULL", full)
        monkeypatch.setenv("SMALL", small)
        calls.write_text("")
        assert probe.reach("enp1s0f1np1", "192.168.200.3", 9000) == found
        tried = calls.read_text().splitlines()
        assert tried[0] == "-n -q -c 1 -W 1 -I enp1s0f1np1 -M do -s 8972 192.168.200.3"
        assert tried[1:] == ([] if full == "0" else ["-n -q -c 1 -W 1 -I enp1s0f1np1 192.168.200.3"])
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert probe.reach("enp1s0f1np1", "192.168.200.3", 9000) == {"unavailable": "`ping` is not installed"}
