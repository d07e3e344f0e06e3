"""Preflight on the lab, through the real engine: every check it can fail, failed on purpose, with its exact message.

Each scenario breaks one thing with fixtures of its own (model folders /models/pf-*, the image tag
spark-vllm-lab/ray-vllm:pf-other), which are removed at the end; the shipped model and image stay untouched.
The scenarios run in order on one stack, `pf`: first on an empty stack, then on a deployed one, where a failed
check must leave every container as it was.
"""

from __future__ import annotations

import re

import pytest

from conftest import SERVE_CHAIN, lab_stack, node_sh
from labstack import planned, steps

IMAGE = "spark-vllm-lab/ray-vllm:2.60.0-double1"
OTHER_TAG = "spark-vllm-lab/ray-vllm:pf-other"
ROW = re.compile(r"^\s*(node\d+)\s+(\S+)\s+(ok|warn|FAIL)\s+(.*)$")


def rows(run) -> dict[tuple[str, str], tuple[str, str]]:
    """The preflight table in a run's output: (node, check) -> (result, reason and fix)."""
    found = {}
    for line in run.output.splitlines():
        match = ROW.match(line)
        if match:
            found[(match[1], match[2])] = (match[3], match[4])
    assert found, run.output
    return found


def not_ok(run) -> dict[tuple[str, str], tuple[str, str]]:
    return {key: value for key, value in rows(run).items() if value[0] != "ok"}


def summary_seconds(run) -> float:
    match = re.search(r"preflight of 2 nodes took ([\d.]+) s: (\d+) failed, (\d+) warnings", run.output)
    assert match, run.output
    return float(match[1])


def touched(run) -> list[tuple[str, str]]:
    """What a run did to resources, leaving out the stack's own root resource, which every first run creates."""
    return [(op, name) for op, name in steps(run) if op != "same" and name != "spark-vllm-pf"]


def containers(node: int) -> list[str]:
    return node_sh(node, "docker ps -a --filter label=spark-vllm.stack=pf --format '{{.Names}} {{.ID}}'").split()


def image_id(node: int, image: str) -> str:
    return node_sh(node, f"docker image inspect --format '{{{{.Id}}}}' {image}").strip()


@pytest.fixture(scope="module")
def pf(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "pf")


@pytest.fixture(scope="module", autouse=True)
def node_fixtures(lab2):
    """Removes what the scenarios put on the nodes, whatever happened."""
    yield
    for node in (1, 2):
        node_sh(node, f"rm -rf /models/pf-*; docker rmi {OTHER_TAG} >/dev/null 2>&1 || true")


def test_a_clean_preview_shows_the_table_and_passes(pf):
    run = pf.pulumi("preview", check=True)
    table = rows(run)
    assert not_ok(run) == {}, run.output
    assert len(table) == 2 * 14 + 1  # fourteen checks a node, and the head's ports
    assert table[("node2", "space")][0] == "ok" and table[("node2", "space")][1].endswith("; nothing is to arrive")
    assert table[("node2", "loader")] == ("ok", "auto is a load format of vLLM 0.0.0+double")
    assert re.fullmatch(r"reads [\d.]+ GB/s past the page cache \([\d.]+ MiB of model-0000\d-of-00004\.safetensors in "
                        r"[\d.]+ s\), so loading its 16\.0 MiB of weights takes at least [\d.]+ s",
                        table[("node2", "disk")][1]), table[("node2", "disk")]
    assert table[("node2", "ssh+docker")][1].startswith("ssh root@10.87.200.12 via node1; Docker ")
    assert table[("node2", "gpus")] == ("ok", "1 GPU (NVIDIA GB10 (lab stand-in)) from preflight.gpuProbe of the "
                                              "cluster catalog, a stand-in for nvidia-smi -L")
    assert table[("node2", "fabric")] == ("ok", "enp1s0f1np1 up, 10.87.200.12/24, MTU 9000; routes to node1 leave "
                                                "through it; node1 answers a 9000-byte packet unfragmented")
    assert table[("node2", "image")] == ("ok", f"{IMAGE} is {image_id(1, IMAGE)[7:19]}, the same on every node")
    assert table[("node2", "ray+vllm")] == ("ok", "ray 2.60.0, vllm 0.0.0+double")
    assert table[("node2", "weights")] == ("ok", "4 weight files, 16.0 MiB, the same names and sizes as node1 "
                                                 "(contents not hashed: spark-vllm:preflight.hashWeights is off)")
    # The lab's cluster runs no Ray dashboard (catalog/clusters.yaml): its port is not the head's to check.
    assert table[("node1", "ports")] == ("ok", "6379 (Ray GCS) free; 8000 (API) free")
    assert table[("node2", "guard")] == ("ok", "the rules that close Ray's ports to all but enp1s0f1np1 are not in "
                                               "place; `up` applies them")
    assert summary_seconds(run) < 30


def test_a_missing_shard_on_node2_stops_preview_and_up_before_anything_is_created(pf):
    for node in (1, 2):
        node_sh(node, "cp -a /models/lab-tiny /models/pf-tiny")
    node_sh(2, "rm /models/pf-tiny/model-00003-of-00004.safetensors")
    pf.set_config("serve.path", "/models/pf-tiny")
    preview = pf.pulumi("preview")
    assert preview.returncode != 0
    assert not_ok(preview) == {("node2", "weights"): (
        "FAIL", "node2 lacks model-00003-of-00004.safetensors. Fix: copy them from node1 over the fabric: on node1, "
                "rsync -a --copy-links --progress /models/pf-tiny/ root@10.87.200.12:/models/pf-tiny/")}
    assert "1 failed, 0 warnings; nothing was deployed or changed." in preview.output
    assert "Traceback" not in preview.output
    up = pf.up(check=False)
    assert up.returncode != 0 and "node2 lacks model-00003-of-00004.safetensors" in up.output
    assert touched(up) == [], steps(up)
    assert containers(1) == [] and containers(2) == []
    pf.pulumi("config", "rm", "--path", "spark-vllm:serve.path", check=True)


def test_up_then_a_no_op_preview_still_has_no_changes(pf):
    up = pf.up()
    assert "8000 (API) free" in up.output
    preview = pf.pulumi("preview", "--expect-no-changes", check=True)
    assert planned(preview) == {} and not_ok(preview) == {}
    assert rows(preview)[("node1", "ports")] == (
        "ok", "6379 (Ray GCS) held by this stack's spark-vllm-pf-ray-head; 8000 (API) held by this stack's "
              "spark-vllm-pf-ray-head")


def test_a_different_image_id_on_node2_is_planned_as_a_copy_of_node1s(pf):
    """Another build under the same tag on node2 (eugr's launcher refuses to start then): preview names it and plans
    node1's copied over the fabric before anything runs the new tag (docs/artifacts.md)."""
    node_sh(1, f"docker tag {IMAGE} {OTHER_TAG}")
    node_sh(2, f"printf 'FROM {IMAGE}\\nLABEL spark-vllm.test=preflight\\n' | docker build -q -t {OTHER_TAG} -")
    short1, short2 = image_id(1, OTHER_TAG)[7:19], image_id(2, OTHER_TAG)[7:19]
    assert short1 != short2
    size = int(node_sh(1, f"docker image inspect --format '{{{{.Size}}}}' {OTHER_TAG}")) / (1 << 20)
    pf.set_config("serve.image", OTHER_TAG)
    try:
        preview = pf.pulumi("preview", check=True)
        assert not_ok(preview) == {("node2", "image"): (
            "warn", f"node2 holds {OTHER_TAG} as {short2}; up copies node1's ({short1}, {size:.1f} MiB) over the "
                    "fabric before anything starts here")}
        plan = planned(preview)
        # node1's new tag names the build that runs: once node2 holds it too, no container has anything new to run.
        assert plan["image-transfer-node2"] == "replace" and not any(name.endswith("-container") for name in plan)
    finally:
        pf.pulumi("config", "rm", "--path", "spark-vllm:serve.image", check=True)
    assert planned(pf.pulumi("preview", "--expect-no-changes", check=True)) == {}


def test_a_wrong_fabric_ip_is_named_with_the_address_the_interface_holds(pf):
    pf.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][1].update(fabricIp="10.87.200.19"))
    preview = pf.pulumi("preview")
    assert preview.returncode != 0
    assert not_ok(preview) == {("node2", "fabric"): (
        "FAIL", "enp1s0f1np1 holds 10.87.200.12/24, not fabricIp 10.87.200.19. Fix: set node2's fabricIp to "
                "10.87.200.12 in the cluster catalog, or add 10.87.200.19 to enp1s0f1np1"), ("node1", "fabric"): (
        "FAIL", "node2 (10.87.200.19) does not answer a ping over enp1s0f1np1. Fix: check the cable between node1 and "
                "node2, and that node2's enp1s0f1np1 is up with 10.87.200.19")}
    pf.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][1].update(fabricIp="10.87.200.12"))


def test_a_path_that_drops_full_size_packets_is_named_and_changes_nothing(pf):
    """node2's fabric port at MTU 1500 while node1's is at 9000: node1's full-size ping, fragmentation off, is
    dropped where a small one passes (issue 36: every link checked at MTU - 28, bound to its interface)."""
    before = containers(1) + containers(2)
    node_sh(2, "ip link set enp1s0f1np1 mtu 1500")
    try:
        preview = pf.pulumi("preview", "--expect-no-changes", check=True)
    finally:
        node_sh(2, "ip link set enp1s0f1np1 mtu 9000")
    assert not_ok(preview) == {
        ("node1", "fabric"): ("warn", "enp1s0f1np1 up, 10.87.200.11/24, MTU 9000; routes to node2 leave through it; "
                                      "but a 9000-byte packet, fragmentation off, does not pass to node2 where a "
                                      "small one does: the path's MTU is below enp1s0f1np1's. Fix: set the same MTU "
                                      "(9000 on Sparks) on enp1s0f1np1 of every node, and on any switch between"),
        ("node2", "fabric"): ("warn", "enp1s0f1np1 up, 10.87.200.12/24, MTU 1500; routes to node1 leave through it; "
                                      "node1 answers a 1500-byte packet unfragmented; but node1's MTU is 9000. Fix: "
                                      "set the same MTU (9000 on Sparks) on enp1s0f1np1 of every node")}, preview.output
    assert containers(1) + containers(2) == before


def test_a_model_architecture_not_in_the_images_vllm_is_named_on_every_node(pf):
    pf.set_config("serve.path", "/models/lab-tiny-bad-arch")
    preview = pf.pulumi("preview")
    assert preview.returncode != 0
    message = ("FAIL", "LabTinyUnsupportedForCausalLM (from config.json) is not in the registry of the image's vLLM "
                       "0.0.0+double. Fix: use an image whose vLLM supports LabTinyUnsupportedForCausalLM, or another "
                       "model")
    assert not_ok(preview) == {("node1", "architecture"): message, ("node2", "architecture"): message}
    pf.pulumi("config", "rm", "--path", "spark-vllm:serve.path", check=True)


def test_utilization_above_the_gb10_limit_warns_and_does_not_stop(pf):
    pf.pulumi("config", "set", "--path", "--type", "float", "spark-vllm:serve.gpuMemoryUtilization", "0.9",
              check=True)
    preview = pf.pulumi("preview", check=True)
    # The memory claims carry the fraction for other stacks' preflight: replaced too, restarting nothing.
    assert planned(preview) == {**SERVE_CHAIN, "memory-claim-node1-volume": "replace",
                                "memory-claim-node2-volume": "replace"}
    warned = not_ok(preview)
    assert set(warned) == {("node1", "memory"), ("node2", "memory")}
    for status, text in warned.values():
        assert status == "warn" and text.startswith("needs about 4.1 GiB (weights 8.0 MiB, KV for one 4096-token "
                                                    "sequence 64.0 MiB, overhead 4.0 GiB) of ")
        assert text.endswith("; gpuMemoryUtilization 0.9 is above 0.86 on a unified-memory GB10: only about 101-102 "
                             "GiB of 121.69 GiB is free at boot, so vLLM's start-up check fails. Fix: set "
                             "spark-vllm:serve.gpuMemoryUtilization to 0.85"), text
    assert "0 failed, 2 warnings" in preview.output
    pf.pulumi("config", "rm", "--path", "spark-vllm:serve.gpuMemoryUtilization", check=True)
    pf.pulumi("preview", "--expect-no-changes", check=True)
