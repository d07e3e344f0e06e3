"""Faults an operator meets: a second `up` at once, and an `up` interrupted while it waits for vLLM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import lab_stack, node_sh
from labstack import LabStack, chat


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory):
    # A slower load (4 shards x 1 s) leaves time to act while serve-ready waits: each act starts once the first
    # shard is shown, and the `up` it acts on still has the other three and the resources after the gate to go.
    yield from lab_stack(tmp_path_factory, lab2, "flt", up=True, catalog={
        "clusters.yaml": lambda c: c["lab"]["env"].update(VLLM_DOUBLE_SHARD_DELAY_S="1")})


def start_up(stack: LabStack) -> subprocess.Popen:
    """`up` in the background, in its own process group, output to a file; returns once serve-ready waits."""
    log = stack.dir / "background-up.log"
    proc = subprocess.Popen(stack.command("up", "--skip-preview", "--yes"), cwd=stack.dir, env=stack.env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "loading weights" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    proc.log = log
    return proc


def assert_serving(stack: LabStack) -> None:
    out = stack.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"]


def test_a_second_up_is_refused_by_the_lock_and_changes_nothing(stack):
    stack.set_config("serve.maxModelLen", "2048")
    first = start_up(stack)
    second = stack.up(check=False)
    assert second.returncode != 0
    assert "the stack is currently locked by 1 lock(s)" in second.output
    assert first.wait(timeout=300) == 0, first.log.read_text()
    stack.up("--expect-no-changes")
    assert_serving(stack)


def test_an_interrupted_up_converges_on_the_next_up(stack):
    stack.set_config("serve.maxModelLen", "1024")
    proc = start_up(stack)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the engine cancels, letting running steps finish
    assert proc.wait(timeout=300) != 0
    assert "cancel" in proc.log.read_text().lower()
    stack.up()
    stack.up("--expect-no-changes")
    assert_serving(stack)


def session_pids(sid: int) -> list[int]:
    """The processes of session sid, from /proc: the engine puts each plugin in a process group of its own, which
    `killpg` misses, but in the session of the `up` that started it."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == sid:
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return pids


def test_a_killed_up_is_recovered_by_the_documented_commands(stack):
    stack.set_config("serve.maxModelLen", "2048")
    proc = start_up(stack)
    os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up: the lock and a pending step stay behind
    # The plugins and their ssh go with it, or they outlive the run, orphaned: a killed engine cannot stop them.
    for pid in session_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    refused = stack.up(check=False)
    assert "the stack is currently locked" in refused.output
    # README, "An interrupted or killed `pulumi up`": cancel the lock, refresh (clearing pending creates), up.
    stack.pulumi("cancel", check=True)
    stack.pulumi("refresh", "--clear-pending-creates", check=True)
    stack.up()
    stack.up("--expect-no-changes")
    assert_serving(stack)


@pytest.mark.parametrize("node", [2, 1], ids=["worker node", "head node"])
def test_a_rebooted_node_is_repaired_by_up_refresh(stack, node):
    """The refresh reads the stopped container (mustRun false); `up` replaces it, then the gate and the serve.
    (A plain `up` does the same: tests/e2e/test_day_two.py.)"""
    before = stack.outputs()["containerIds"]
    subprocess.run(["docker", "restart", f"svl-lab-node{node}"], check=True, capture_output=True, timeout=120)
    wait_for_ssh(stack, node)
    stack.up("--refresh")
    after = stack.outputs()["containerIds"]
    # A new head takes new workers with it; a new worker leaves the head alone.
    assert after["node2"] != before["node2"] and (after["node1"] != before["node1"]) == (node == 1)
    assert_serving(stack)
    # The reboot flushed the node's firewall; preflight found the guard gone and `up` put it back.
    assert "-A INPUT -j svl-flt-" in node_sh(node, "iptables -S INPUT")
    stack.pulumi("preview", "--refresh", "--expect-no-changes", check=True)


def test_ssh_cut_to_node2_fails_bounded_naming_the_node_then_converges(stack):
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][1].update(env={"NCCL_DEBUG": "WARN"}))
    # Cut the hop: node1, the jump host, can no longer reach node2.
    node_sh(1, "ip route add unreachable 10.87.200.12/32")
    try:
        run = stack.up(check=False)
    finally:
        node_sh(1, "ip route del unreachable 10.87.200.12/32")
    # Preflight reaches every node before anything is touched, on connections of its own: the shared ones would
    # answer only when ServerAlive gives up on the cut link (45 s). It names the node and its jump host.
    assert run.returncode != 0 and run.seconds < 40, run.output
    assert re.search(r"node2\s+ssh\+docker\s+FAIL\s+ssh root@10\.87\.200\.12 via node1 failed", run.output), run.output
    stack.up()
    stack.up("--expect-no-changes")
    assert_serving(stack)


def test_an_image_on_no_node_is_named(stack):
    """Gone from every node, with no registry to pull from (images.pull is none), the image cannot be copied back:
    preflight names it and what would bring it, and nothing changes."""
    image = "spark-vllm-lab/ray-vllm:2.60.0-double1"
    for node in (1, 2):
        node_sh(node, f"docker tag {image} svl-flt-keep:1 && docker rmi {image}")
    try:
        run = stack.up("--refresh", check=False)
    finally:
        for node in (1, 2):
            node_sh(node, f"docker tag svl-flt-keep:1 {image} && docker rmi svl-flt-keep:1")
    assert run.returncode != 0 and "nothing was deployed or changed" in run.output
    assert re.search(rf"node1\s+image\s+FAIL\s+{re.escape(image)} is on no node of the stack, and none pulls it\. "
                     r"Fix: set spark-vllm:images\.pull to head", run.output), run.output
    stack.up("--refresh")
    assert_serving(stack)


def wait_for_ssh(stack: LabStack, node: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    # The node's own ready marker (lab/node/svl-node-init): dockerd answers and sshd listens.
    while node_sh(node, "test -e /run/svl-lab/ready && docker info >/dev/null && echo up", check=False).strip() != "up":
        assert time.monotonic() < deadline, f"node{node} did not come back"
        time.sleep(1)
