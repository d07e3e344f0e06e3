"""End-to-end for `executor: mp`: the program through the real Pulumi engine on the two-node lab, with the lab's
image without Ray (as NGC vLLM images from 26.04 on). vLLM's GPU process is the double; its ranks really meet at
the master's address over the lab's fabric. The scenarios run in order on one stack, as an operator's day would.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time

import openai
import pytest

from conftest import LOAD_FLOOR, MP_TURNS, lab_stack, node_sh
from labstack import chat, planned, steps
from test_status import status

RANK0, RANK1 = "spark-vllm-mp-vllm-rank0", "spark-vllm-mp-vllm-rank1"
RANKS = {"vllm-rank-node1-container", "vllm-rank-node2-container"}
GATES = {"ranks-ready-node1-gate", "ranks-ready-node2-gate", "serve-ready-gate"}
ALL_RANKS = {**{name: "replace" for name in RANKS | GATES}, **LOAD_FLOOR, **MP_TURNS}
IMAGE, NEW_IMAGE = "spark-vllm-lab/vllm-mp:double1", "spark-vllm-lab/vllm-mp:e2e-new"
MODEL = "/models/mp-tiny"  # the weights-sync scenario's own copy of the lab's model


@pytest.fixture(scope="module")
def mp(lab2, tmp_path_factory):
    try:
        yield from lab_stack(tmp_path_factory, lab2, "mp", executor="mp")
    finally:
        for node in (1, 2):
            node_sh(node, f"rm -rf {MODEL}; docker rmi {NEW_IMAGE} >/dev/null 2>&1 || true", check=False)


def containers(node: int, stack: str = "mp") -> list[str]:
    return node_sh(node, f"docker ps -a --filter label=spark-vllm.stack={stack} "
                         "--format '{{.Names}} {{.State}}'").split()


def test_up_from_empty_serves_through_both_ranks(mp):
    started = time.monotonic()
    run = mp.up()
    print(f"mp up from empty: {time.monotonic() - started:.1f}s")
    assert "the rank on node2 reaches the master at 10.87.200.11:29501" in run.output, run.output
    assert "ready: lab-tiny served at" in run.output
    out = mp.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    assert containers(1) == [RANK0, "running"] and containers(2) == [RANK1, "running"]
    # The rank is the container's own process: its log is `docker logs`, and no Ray is anywhere.
    assert "Loading weights took" in node_sh(2, f"docker logs {RANK1} 2>&1")
    assert node_sh(1, f"docker exec {RANK0} sh -c 'command -v ray || echo none'").strip() == "none"
    argv = node_sh(2, f"docker inspect -f '{{{{json .Args}}}}' {RANK1}")
    assert '"--master-addr","10.87.200.11"' in argv and '"--headless"' in argv


def test_the_openai_client_streams(mp):
    out = mp.outputs()
    client = openai.OpenAI(base_url=out["baseUrl"], api_key="none", max_retries=0, timeout=20)
    chunks = list(client.chat.completions.create(model=out["servedModel"], stream=True,
                                                 messages=[{"role": "user", "content": "stream me"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "[lab-tiny] stream me"


def test_status_shows_every_rank_and_the_serve(mp):
    done = status(mp)
    assert done.returncode == 0, done.stdout + done.stderr
    for layer in ("ssh node1", "ssh node2 via node1", "fabric guard node1", "fabric guard node2", f"container {RANK0}",
                  f"container {RANK1}", "rank node1 reaches the master", "rank node2 reaches the master", "/health",
                  "/v1/models", "one chat completion"):
        assert re.search(rf"{re.escape(layer)}\s+ok ", done.stdout), done.stdout
    assert "ray nodes" not in done.stdout and "vllm serve process" not in done.stdout


def test_a_dead_rank_is_found_by_status_and_repaired_by_up(mp):
    """A rank that dies takes rank 0 with it (vLLM's head exits when a rank is lost); status names both, and a
    plain `up` recreates every rank."""
    node_sh(2, f"docker kill {RANK1}")
    deadline = time.monotonic() + 60
    while containers(1) != [RANK0, "exited"]:
        assert time.monotonic() < deadline, containers(1)
        time.sleep(1)
    done = status(mp)
    assert done.returncode == 1
    assert re.search(rf"container {RANK1}\s+FAIL  exited", done.stdout), done.stdout
    assert re.search(rf"container {RANK0}\s+FAIL  exited", done.stdout), done.stdout
    assert re.search(r"rank node2 reaches the master\s+FAIL  the rank on node2 .* exited", done.stdout), done.stdout
    assert "`pulumi up` recreates it and what depends on it" in done.stdout
    assert planned(mp.pulumi("preview", check=True)) == ALL_RANKS
    mp.up()
    done = status(mp)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_ranks_listen_only_where_the_guard_covers(mp):
    """Measured with `ss -ltnp`: rank 0 holds the master port on every address and the API; each rank one random
    port on its fabric address (the ephemeral range the guard closes off the fabric)."""
    low, high = map(int, node_sh(1, "cat /proc/sys/net/ipv4/ip_local_port_range").split())
    for node, ip in ((1, "10.87.200.11"), (2, "10.87.200.12")):
        lines = [line for line in node_sh(node, "ss -ltnpH").splitlines() if "python3" in line or "vllm" in line]
        local = sorted(line.split()[3] for line in lines)
        print(f"node{node} listens on {local}")
        rest = [a for a in local if a not in ("0.0.0.0:29501", "0.0.0.0:8000")]
        assert all(a.startswith(ip + ":") and low <= int(a.rsplit(":", 1)[1]) <= high for a in rest), local
        assert ("0.0.0.0:29501" in local) == (node == 1)
    chain = node_sh(2, "iptables -S | grep -- '-A svl-mp-' | head -5")
    assert "29501" in chain or "--dport 29501" in chain, chain


def test_no_op_up_and_preview_change_nothing(mp):
    mp.up("--expect-no-changes")
    assert planned(mp.pulumi("preview", "--expect-no-changes", check=True)) == {}
    mp.pulumi("preview", "--refresh", "--expect-no-changes", check=True)


def test_serve_only_change_restarts_every_rank_together(mp):
    before = mp.outputs()["containerIds"]
    mp.set_config("serve.maxModelLen", "2048")
    preview = mp.pulumi("preview", check=True)
    assert planned(preview) == ALL_RANKS
    mp.up()
    after = mp.outputs()["containerIds"]
    assert all(after[n] != before[n] for n in before)
    assert containers(1) == [RANK0, "running"] and containers(2) == [RANK1, "running"]
    out = mp.outputs()
    chat(out["baseUrl"], out["servedModel"])


def test_node2_is_reached_only_through_node1(mp):
    """This machine (the workstation) has no route to node2's fabric address: node2's rank was deployed, and its
    gate run, through node1 as jump host."""
    for port in (22, 29501):
        with pytest.raises(OSError):
            socket.create_connection(("10.87.200.12", port), timeout=3)
    resources = mp.export()["deployment"]["resources"]
    provider = next(r for r in resources if r["urn"].endswith("::node2-docker"))
    proxy = [o for o in json.loads(provider["inputs"]["sshOpts"]) if o.startswith("ProxyCommand=")]
    assert proxy and "root@172.29.87.11" in proxy[0] and provider["inputs"]["host"] == "ssh://root@10.87.200.12"
    rank = next(r for r in resources if r["urn"].endswith("::vllm-rank-node2-container"))
    assert rank["provider"].startswith(provider["urn"] + "::")
    gate = next(r for r in resources if r["urn"].endswith("::ranks-ready-node2-gate"))["inputs"]["connection"]
    gate = json.loads(gate["plaintext"]) if "plaintext" in gate else gate  # a secret: it holds the SSH key
    assert gate["host"] == "10.87.200.12" and gate["proxy"]["host"] == "172.29.87.11", gate


def test_worker_env_change_restarts_every_rank_together_and_nothing_else(mp):
    before = mp.outputs()["containerIds"]
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][1].update(env={"NCCL_DEBUG": "INFO"}))
    assert planned(mp.pulumi("preview", check=True)) == ALL_RANKS
    up = mp.up()
    assert {name for op, name in steps(up) if op not in ("same", "read")} == set(ALL_RANKS), steps(up)
    after = mp.outputs()["containerIds"]
    assert all(after[n] != before[n] for n in before)
    assert "NCCL_DEBUG=INFO" in node_sh(2, f"docker inspect -f '{{{{json .Config.Env}}}}' {RANK1}")
    assert "NCCL_DEBUG" not in node_sh(1, f"docker inspect -f '{{{{json .Config.Env}}}}' {RANK0}")
    chat(mp.outputs()["baseUrl"], "lab-tiny")


def test_image_change_restarts_every_rank_on_the_new_image(mp):
    """A new build under a new tag, the same on both nodes (preflight checks that), as an operator ships one."""
    node_sh(1, f"printf 'FROM {IMAGE}\\nLABEL spark-vllm.test=mp-image\\n' | docker build -q -t {NEW_IMAGE} -")
    subprocess.run(f"docker exec svl-lab-node1 docker save {NEW_IMAGE} | docker exec -i svl-lab-node2 docker load",
                   shell=True, check=True, capture_output=True, timeout=300)
    new_id = node_sh(1, f"docker image inspect -f '{{{{.Id}}}}' {NEW_IMAGE}").strip()
    before = mp.outputs()["containerIds"]
    mp.set_config("serve.image", NEW_IMAGE)
    assert planned(mp.pulumi("preview", check=True)) == {**ALL_RANKS, "node1-image": "replace",
                                                         "node2-image": "replace"}
    mp.up()
    after = mp.outputs()["containerIds"]
    assert all(after[n] != before[n] for n in before)
    for node, rank in ((1, RANK0), (2, RANK1)):
        assert node_sh(node, f"docker inspect -f '{{{{.Image}}}}' {rank}").strip() == new_id
    chat(mp.outputs()["baseUrl"], "lab-tiny")
    mp.up("--expect-no-changes")


def test_the_weights_sync_restarts_only_on_its_own_inputs(mp):
    """With preflight.syncWeights: node2's lost shard is copied again from node1, and no rank restarts."""
    for node in (1, 2):
        node_sh(node, f"rm -rf {MODEL} && cp -a /models/lab-tiny {MODEL}")
    mp.set_config("serve.path", MODEL)
    mp.pulumi("config", "set", "--path", "--type", "bool", "spark-vllm:preflight.syncWeights", "true", check=True)
    mp.up()
    before = mp.outputs()
    node_sh(2, f"rm {MODEL}/model-00003-of-00004.safetensors")
    assert planned(mp.pulumi("preview", check=True)) == {"weights-sync-node2": "replace"}
    up = mp.up()
    assert "spark-vllm: synced 1 file, 4.0 MiB, from node1 to node2" in up.output, up.output
    assert mp.outputs() == before
    assert node_sh(2, f"ls {MODEL}").split() == node_sh(1, f"ls {MODEL}").split()
    mp.up("--expect-no-changes")
    mp.pulumi("config", "rm", "--path", "spark-vllm:preflight.syncWeights", check=True)
    assert planned(mp.pulumi("preview", check=True)) == {"weights-sync": "delete", "weights-sync-node2": "delete"}
    mp.up()
    assert mp.outputs() == before
    chat(before["baseUrl"], "lab-tiny")


def test_master_on_the_management_ip_fails_bounded_and_named(mp):
    """The seed's c10d failure: the head's fabricIp set to its management address, preflight off. The head's gate
    names it before node2's gate starts, so the run ends well inside the gates' 60 s bound."""
    mp.set_config("preflight.enabled", "false")
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][0].update(fabricIp="172.29.87.11"))
    started = time.monotonic()
    run = mp.up(check=False, timeout=600)
    took = time.monotonic() - started
    print(f"master on the management IP: failed after {took:.1f}s")
    assert run.returncode != 0 and took < 60, run.output
    assert ("the master address 172.29.87.11 (the head node1's fabricIp) is not an address of enp1s0f1np1 on "
            "node1 (enp1s0f1np1 has 10.87.200.11)") in run.output, run.output
    assert "set node1's fabricIp to its address on enp1s0f1np1" in run.output
    assert "node2 cannot reach the master" not in run.output, run.output
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][0].update(fabricIp="10.87.200.11"))
    mp.set_config("preflight.enabled", "true")
    mp.up()
    out = mp.outputs()
    chat(out["baseUrl"], out["servedModel"])


def test_a_master_port_change_moves_the_guard_then_every_rank(mp):
    """The guard restarts only on its own inputs: the master port is one (Ray's ports are not, for mp)."""
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"].update(mp={"masterPort": 29502}))
    guards = {"fabric-guard-node1-rules": "replace", "fabric-guard-node2-rules": "replace"}
    assert planned(mp.pulumi("preview", check=True)) == {**ALL_RANKS, **guards}
    up = mp.up()
    assert "the rank on node2 reaches the master at 10.87.200.11:29502" in up.output, up.output
    order = [name for op, name in steps(up) if op in ("create-replacement", "create")]
    assert order.index("fabric-guard-node1-rules") < order.index("vllm-rank-node1-container"), order
    assert "0.0.0.0:29502" in node_sh(1, "ss -ltnH")
    rules = node_sh(1, "iptables -S | grep -- '-A svl-mp-'")
    assert "--dport 29502" in rules and "--dport 29501" not in rules, rules
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"]["mp"].update(masterPort=29501))
    assert planned(mp.pulumi("preview", check=True)) == {**ALL_RANKS, **guards}
    mp.up()
    chat(mp.outputs()["baseUrl"], "lab-tiny")
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"].update(ray={"port": 6390}))
    assert planned(mp.pulumi("preview", check=True)) == {}


def test_ray_with_the_rayless_image_is_refused_by_preflight(mp):
    mp.set_config("serve.executor", "ray")
    run = mp.pulumi("preview", check=False)
    assert run.returncode != 0
    assert "the image has no Ray" in run.output and "use `executor: mp`" in run.output, run.output
    mp.pulumi("config", "rm", "--path", "spark-vllm:serve.executor", check=True)


def test_instanttensor_on_an_image_without_it_is_refused_by_preflight_before_any_restart(mp):
    """The lab's mp image has no `instanttensor` package (its Ray image has one)."""
    before = {node: containers(node) for node in (1, 2)}
    ids = mp.outputs()["containerIds"]
    mp.set_config("serve.loadFormat", "instanttensor")
    run = mp.up(check=False)
    assert run.returncode != 0
    for node in ("node1", "node2"):  # the image is the mp image or the build an earlier scenario left
        assert re.search(rf"{node}\s+loader\s+FAIL\s+spark-vllm-lab/vllm-mp:\S+ has no `instanttensor` package, which "
                         r"load format instanttensor needs\. Fix: pip install vllm\[instanttensor\] into the image, or "
                         r"use loadFormat fastsafetensors", run.output), run.output
    assert [op for op, name in steps(run) if op != "same"] == [], steps(run)
    assert {node: containers(node) for node in (1, 2)} == before and mp.outputs()["containerIds"] == ids
    mp.pulumi("config", "rm", "--path", "spark-vllm:serve.loadFormat", check=True)
    assert planned(mp.pulumi("preview", check=True)) == {}


def test_destroy_leaves_nothing(mp):
    mp.pulumi("destroy", check=True, timeout=600)
    assert containers(1) == [] and containers(2) == []
    assert node_sh(1, "iptables -S | grep -c svl-mp- || true").strip() == "0"
