"""Day two, through the real engine on the two-node lab, for both executors, with the watchdog off: after every node
restarted, the head's container removed by hand, a worker's stopped by hand, a wedged engine, and the image pruned
from a node, a plain `preview` names what is dead and why, and a plain `up` (no --refresh) brings the endpoint
back. Each scenario ends with a completion answered and a second plain `preview` that plans nothing.

(The watchdog that gave up and is then fixed: tests/e2e/test_watchdog.py, both executors.)
"""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import LOAD_FLOOR, MP_TURNS, SERVE_CHAIN, lab_stack, node_sh
from labstack import LabStack, chat, planned
from test_faults import wait_for_ssh

RAY_ALL = {"ray-head-container": "replace", "ray-worker-node2-container": "replace",
           "cluster-ready-gate": "replace", **SERVE_CHAIN}
MP_ALL = {"vllm-rank-node1-container": "replace", "vllm-rank-node2-container": "replace",
          "ranks-ready-node1-gate": "replace", "ranks-ready-node2-gate": "replace", "serve-ready-gate": "replace",
          **LOAD_FLOOR, **MP_TURNS}
IMAGES = {"ray": "spark-vllm-lab/ray-vllm:2.60.0-double1", "mp": "spark-vllm-lab/vllm-mp:double1"}


@pytest.fixture(scope="module", params=["ray", "mp"])
def d2(request, lab2, tmp_path_factory):
    # A wedged engine's completion is given up after 6 s.
    yield from lab_stack(tmp_path_factory, lab2, f"d2{request.param}", executor=request.param,
                         config={"preflight.timeoutSeconds": "12"}, up=True)


def engine(s: LabStack, node: int) -> str:
    if s.executor == "mp":
        return f"spark-vllm-{s.stack}-vllm-rank{node - 1}"
    return f"spark-vllm-{s.stack}-ray-{'head' if node == 1 else 'worker'}"


def everything(s: LabStack) -> dict[str, str]:
    return MP_ALL if s.executor == "mp" else RAY_ALL


def answers(s: LabStack) -> None:
    out = s.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"]


def dead_preview(s: LabStack, *lines: str) -> dict[str, str]:
    """A plain preview: it must name each dead piece, and fail with --expect-no-changes; returns what it plans."""
    preview = s.pulumi("preview", "--expect-no-changes")
    assert preview.returncode != 0 and "no changes were expected" in preview.output, preview.output
    for line in lines:
        assert re.search(line, preview.output), (line, preview.output)
    return planned(preview)


def repaired(s: LabStack) -> None:
    """A plain `up`, a completion, then a plain preview that plans nothing."""
    s.up()
    answers(s)
    assert planned(s.pulumi("preview", "--expect-no-changes", check=True)) == {}


def test_a_healthy_deployment_previews_no_changes_and_says_it_answers(d2):
    preview = d2.pulumi("preview", "--expect-no-changes", check=True)
    assert re.search(r"node1\s+running\s+ok\s+" + re.escape(engine(d2, 1)) + r" running; .*answered a completion in "
                     r"\d+\.\d\d s", preview.output), preview.output
    assert re.search(r"node2\s+running\s+ok\s+" + re.escape(engine(d2, 2)) + " running", preview.output)


def test_every_node_restarted(d2):
    """The reboot of issue 21: every container exited (restart policy `no`), the guards flushed."""
    subprocess.run(["docker", "restart", "svl-lab-node1", "svl-lab-node2"], check=True, capture_output=True,
                   timeout=180)
    for node in (1, 2):
        wait_for_ssh(d2, node)
    plan = dead_preview(d2, rf"node1: {engine(d2, 1)} exited \d+ (s|min) ago \(code \d+\)",
                        rf"node2: {engine(d2, 2)} exited \d+ (s|min) ago \(code \d+\)")
    guards = {"fabric-guard-node1-rules": "replace", "fabric-guard-node2-rules": "replace"}
    assert plan == {**everything(d2), **guards}, plan
    repaired(d2)


def test_the_head_container_removed_by_hand(d2):
    node_sh(1, f"docker rm -f {engine(d2, 1)}")
    plan = dead_preview(d2, rf"node1: {engine(d2, 1)} is not on node1: ")
    assert plan == everything(d2), plan
    repaired(d2)


def test_a_worker_stopped_by_hand(d2):
    before = d2.outputs()["containerIds"]
    node_sh(2, f"docker stop {engine(d2, 2)}")
    plan = dead_preview(d2, rf"node2: {engine(d2, 2)} exited \d+ s ago \(code \d+\)")
    if d2.executor == "ray":
        # A Ray worker alone: the head and its GCS stay; the serve restarts, as its TP group lost a member.
        assert plan == {"ray-worker-node2-container": "replace", "cluster-ready-gate": "replace", **SERVE_CHAIN}, plan
    else:
        assert plan == MP_ALL, plan  # a torch.distributed group cannot take one rank back
    repaired(d2)
    assert (d2.outputs()["containerIds"]["node1"] == before["node1"]) == (d2.executor == "ray")


def test_a_wedged_engine(d2):
    """/health stays 200 on a wedged engine; preflight's one completion does not come back."""
    node_sh(1, "pkill -STOP -f 'VLLM::[E]ngineCore'")  # [E]: not this shell's own command line
    who = "vllm serve runs" if d2.executor == "ray" else "rank 0 runs"
    plan = dead_preview(d2, rf"node1: {who}, but the API gives no completion within 6 s \(a wedged engine\)")
    assert plan == (SERVE_CHAIN if d2.executor == "ray" else MP_ALL), plan
    repaired(d2)


def test_the_image_pruned_from_a_node(d2):
    """`docker system prune -a` after a reboot: the stopped container, then its image. A plain preview names both,
    and plans node1's image copied to node2 over the fabric before what the prune took is recreated; a plain `up`
    does it (docs/artifacts.md)."""
    image = IMAGES[d2.executor]
    held = node_sh(2, f"docker image inspect --format '{{{{.Id}}}}' {image}").strip()
    node_sh(2, f"docker rm -f {engine(d2, 2)} && docker rmi {image}")
    plan = dead_preview(d2, rf"node2\s+image\s+warn\s+node2 lacks {re.escape(image)}; up copies node1's "
                            rf"\({held[7:19]}, [\d.]+ MiB\) over the fabric before anything starts here",
                        rf"node2: {engine(d2, 2)} is not on node2: ")
    assert plan == {"image-transfer-node2": "replace", "node2-image": "replace",
                    **({"ray-worker-node2-container": "replace", "cluster-ready-gate": "replace", **SERVE_CHAIN}
                       if d2.executor == "ray" else MP_ALL)}, plan
    repaired(d2)
    assert node_sh(2, f"docker image inspect --format '{{{{.Id}}}}' {image}").strip() == held
