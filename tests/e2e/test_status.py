"""A vLLM that dies after it was ready: remote.Command has no Read, so `--refresh` cannot see it; scripts/status and
a plain `preview` do (preflight's probe), and a plain `up` repairs it."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time

import pytest

from conftest import SERVE_CHAIN, lab_stack, node_sh
from labstack import ROOT, LabStack, chat, planned

HEAD = "spark-vllm-sts-ray-head"


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "sts", up=True)


def status(stack: LabStack) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "status"), "--stack", stack.stack], cwd=stack.dir, env=stack.env,
                          capture_output=True, text=True, timeout=180)


def test_status_reports_every_layer_healthy(stack):
    done = status(stack)
    assert done.returncode == 0, done.stdout + done.stderr
    for layer in ("ssh node1", "ssh node2 via node1", "fabric guard node1", "fabric guard node2", f"container {HEAD}",
                  "ray nodes by fabric IP", "vllm serve process", "/health", "/v1/models", "one chat completion"):
        assert re.search(rf"{re.escape(layer)}\s+ok ", done.stdout), done.stdout
    # The last load against its floor, as the stack's `load` output has it (the double's 4 shards, 0.1 s each).
    load = stack.outputs()["load"]
    assert set(load) == {"seconds", "gbPerSecond", "floorSeconds", "ratioToFloor"} and load["seconds"] >= 0.4, load
    assert re.search(rf"last load\s+ok\s+{load['seconds']:.1f} s, {load['gbPerSecond']:.2f} GB/s: "
                     rf"{load['ratioToFloor']:g}x its floor of {load['floorSeconds']:g} s", done.stdout), done.stdout


def test_a_dead_vllm_is_found_by_status_and_preview_and_repaired_by_up(stack):
    node_sh(1, f"docker exec {HEAD} sh -c 'kill -KILL -$(cat /run/spark-vllm/serve.pid)'")
    done = status(stack)
    assert done.returncode == 1
    assert re.search(r"vllm serve process\s+FAIL", done.stdout), done.stdout
    assert re.search(r"ray nodes by fabric IP\s+ok ", done.stdout), done.stdout
    assert "`pulumi up` recreates it" in done.stdout
    # The engine cannot see it (commands have no Read); preflight can, and says so.
    preview = stack.pulumi("preview", check=True)
    assert planned(preview) == SERVE_CHAIN
    assert "node1: vllm serve is not running: the serve will be restarted" in preview.output, preview.output
    stack.up()
    assert status(stack).returncode == 0
    out = stack.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"]


def test_a_lost_guard_is_found_by_status_and_put_back_by_up_alone(stack):
    # What a reboot does to the rules, without the reboot: node2's chain is gone, Ray keeps running.
    node_sh(2, "c=$(iptables -S INPUT | grep -o 'svl-sts-[0-9a-f]*'); iptables -D INPUT -j $c; iptables -F $c; "
               "iptables -X $c")
    done = status(stack)
    assert done.returncode == 1
    assert re.search(r"fabric guard node2\s+FAIL  missing or stale: `pulumi up` puts it back", done.stdout), done.stdout
    assert re.search(r"fabric guard node1\s+ok ", done.stdout)
    assert "Ray's ports are open beyond the fabric: `pulumi up` puts the guard back" in done.stdout
    up = stack.up()
    assert planned(up) == {"fabric-guard-node2-rules": "replace"}
    assert status(stack).returncode == 0


def test_logs_shows_the_serve_log_and_follows_it(stack):
    command = [str(ROOT / "scripts" / "logs"), "--stack", stack.stack]
    done = subprocess.run([*command, "-n", "200"], cwd=stack.dir, env=stack.env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Loading weights took" in done.stdout, done.stdout
    follow = subprocess.Popen([*command, "-n", "0", "-f"], cwd=stack.dir, env=stack.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follow.stdout or []], daemon=True).start()
    base_url, seen = stack.outputs()["baseUrl"], []
    try:
        # A request a second until the follower shows one: it prints nothing before its first new line.
        deadline = time.monotonic() + 60
        while not any("chat/completions" in line for line in seen):
            assert time.monotonic() < deadline and follow.poll() is None, (seen, follow.poll())
            chat(base_url, "lab-tiny")  # the serve logs the request
            try:
                while True:
                    seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
        assert follow.poll() is None
    finally:
        follow.terminate()
        follow.wait(timeout=30)
