"""End-to-end for `executor: mp`: the program through the real Pulumi engine on the two-node lab, with the lab's
image without Ray (as NGC vLLM images from 26.04 on). vLLM's GPU process is the double; its ranks really meet at
the master's address over the lab's fabric. The scenarios run in order on one stack, as an operator's day would.
"""

from __future__ import annotations

import time

import openai
import pytest

from conftest import node_sh
from labstack import LabStack, chat, planned

RANK0, RANK1 = "spark-vllm-mp-vllm-rank0", "spark-vllm-mp-vllm-rank1"
RANKS = {"vllm-rank-node1-container", "vllm-rank-node2-container"}
GATES = {"ranks-ready-node1-gate", "ranks-ready-node2-gate", "serve-ready-gate"}


@pytest.fixture(scope="module")
def mp(lab2, tmp_path_factory):
    s = LabStack(tmp_path_factory.mktemp("e2e-mp"), "mp", "lab-mp", lab2)
    yield s
    s.pulumi("destroy", timeout=600)


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
    assert planned(preview) == {name: "replace" for name in RANKS | GATES}
    mp.up()
    after = mp.outputs()["containerIds"]
    assert all(after[n] != before[n] for n in before)
    assert containers(1) == [RANK0, "running"] and containers(2) == [RANK1, "running"]
    out = mp.outputs()
    chat(out["baseUrl"], out["servedModel"])


def test_master_on_the_management_ip_fails_bounded_and_named(mp):
    """The seed's c10d failure: the head's fabricIp set to its management address, preflight off."""
    mp.set_config("preflight.enabled", "false")
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][0].update(fabricIp="172.29.87.11"))
    started = time.monotonic()
    run = mp.up(check=False, timeout=600)
    took = time.monotonic() - started
    print(f"master on the management IP: failed after {took:.1f}s")
    assert run.returncode != 0 and took < 240, run.output
    assert ("the master address 172.29.87.11 (the head node1's fabricIp) is not an address of enp1s0f1np1 on "
            "node1 (enp1s0f1np1 has 10.87.200.11)") in run.output, run.output
    assert "set node1's fabricIp to its address on enp1s0f1np1" in run.output
    assert "node2 cannot reach the master at 172.29.87.11:29501" in run.output or \
        "the rank on node2" in run.output, run.output
    mp.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][0].update(fabricIp="10.87.200.11"))
    mp.set_config("preflight.enabled", "true")
    mp.up()
    out = mp.outputs()
    chat(out["baseUrl"], out["servedModel"])


def test_ray_with_the_rayless_image_is_refused_by_preflight(mp):
    mp.set_config("serve.executor", "ray")
    run = mp.pulumi("preview", check=False)
    assert run.returncode != 0
    assert "the image has no Ray" in run.output and "use `executor: mp`" in run.output, run.output
    mp.pulumi("config", "rm", "--path", "spark-vllm:serve.executor", check=True)


def test_destroy_leaves_nothing(mp):
    mp.pulumi("destroy", check=True, timeout=600)
    assert containers(1) == [] and containers(2) == []
    assert node_sh(1, "iptables -S | grep -c svl-mp- || true").strip() == "0"
