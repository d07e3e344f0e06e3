"""Placement in the lab: stacks on some of the cluster's nodes, two of them sharing node1 in slots of their own.

- `pl-ray` (Ray) on node1 alone, slot 0, and `pl-mp` (mp) on node1 alone, slot 1: `pl-mp` is refused at preflight
  while the two memory fractions add up past the GB10's limit (the lab's GPUs are GB10 stand-ins), and creates
  nothing; at a fraction that fits, both are brought up at once (`pl-ray` with a new serve), take node1's load turn
  one after the other (their loads, as the vLLM double stamps them, do not overlap), and serve, each on its own
  API port. Destroying `pl-mp` leaves every container of `pl-ray` running as it was (same id, same start time),
  its fabric guard and memory claim in place, and its preview clean.
- `pl-n2` on node2 alone, reached through node1 with nothing of it deployed there, in the cluster's own ports: a
  stack on other nodes needs no slot. Its API is on node2, which this machine has no route to: it is called from
  node1, over the fabric, as a router there would.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import lab_stack, node_sh
from labstack import chat
from test_preflight import rows

ONE_GPU = {"serve.tensorParallel": "1"}


def containers(node: int, stack: str) -> dict[str, str]:
    """name -> "id started-at" of the stack's containers on the node."""
    out = node_sh(node, f"docker ps -aq --filter label=spark-vllm.stack={stack} | xargs -r docker inspect "
                        "-f '{{.Name}} {{.Id}} {{.State.StartedAt}} {{.State.Status}}'")
    return {line.split()[0].lstrip("/"): " ".join(line.split()[1:]) for line in out.splitlines()}


def guard_chains(node: int) -> set[str]:
    return {line.split()[1] for line in node_sh(node, "iptables -S").splitlines()
            if line.startswith("-N svl-")}


@pytest.fixture(scope="module")
def pl_ray(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "pl-ray", up=True, config={
        "nodes[0]": "node1", "portSlot": "0", "serve.gpuMemoryUtilization": "0.4", **ONE_GPU})


@pytest.fixture(scope="module")
def pl_mp(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "pl-mp", executor="mp",
                         config={"nodes[0]": "node1", "portSlot": "1", "serve.gpuMemoryUtilization": "0.5", **ONE_GPU})


def test_a_second_stack_past_the_nodes_memory_is_refused_and_creates_nothing(pl_ray, pl_mp):
    run = pl_mp.up(check=False)
    assert run.returncode != 0
    assert rows(run)[("node1", "memory")] == (
        "FAIL", "0.40 (pl-ray, deployed) + 0.50 (this stack) = 0.90 > 0.86, the unified-memory limit. Fix: lower "
                "spark-vllm:serve.gpuMemoryUtilization to at most 0.46, or destroy stack pl-ray first, or put this "
                "stack on other nodes (spark-vllm:nodes)"), run.output
    assert containers(1, "pl-mp") == {}


def load_window(log: str) -> tuple[str, str]:
    """The last load in a vLLM double's log: when it started and when it ended, as its lines stamp them."""
    stamped = re.findall(r"^INFO \d\d-\d\d (\d\d:\d\d:\d\d) \[[^]]+\] (Starting to load model|Loading weights took)",
                         log, re.M)
    starts = [time for time, what in stamped if what.startswith("Starting")]
    ends = [time for time, what in stamped if what.startswith("Loading")]
    assert starts and ends, log
    return starts[-1], ends[-1]


def test_two_stacks_share_node1_each_in_its_slot_and_both_serve(pl_ray, pl_mp):
    before = containers(1, "pl-ray")
    assert sorted(before) == ["spark-vllm-pl-ray-ray-head"]
    pl_mp.set_config("serve.gpuMemoryUtilization", "0.4")
    pl_ray.set_config("serve.maxModelLen", "2048")  # a new serve: both stacks want to load on node1 at once
    with ThreadPoolExecutor(2) as pool:
        ray_run, mp_run = pool.map(lambda s: s.up(), (pl_ray, pl_mp))
    assert "0.40 (pl-ray, deployed) + 0.40 (this stack) = 0.80, within 0.86" in rows(mp_run)[("node1", "memory")][1]
    # One turn at a time on node1: the second load starts once the first has ended (the double stamps seconds).
    ray_load = load_window(node_sh(1, "docker exec spark-vllm-pl-ray-ray-head cat /var/log/spark-vllm/serve.log"))
    mp_load = load_window(node_sh(1, "docker logs spark-vllm-pl-mp-vllm-rank0 2>&1"))
    first, second = sorted([ray_load, mp_load])
    waited = [line for run in (ray_run, mp_run) for line in run.output.splitlines() if "to load first" in line]
    print(f"loads on node1: pl-ray {ray_load}, pl-mp {mp_load}; waits: {waited}")
    assert second[0] >= first[1], (ray_load, mp_load)
    ray_out, mp_out = pl_ray.outputs(), pl_mp.outputs()
    assert (ray_out["nodes"], mp_out["nodes"]) == (["node1"], ["node1"])
    assert ray_out["ports"] == {"api.port": 8000, "ray.port": 6379}  # the lab's cluster runs no dashboard
    assert mp_out["ports"] == {"api.port": 8100, "mp.masterPort": 29601}
    assert mp_out["baseUrl"] == "http://172.29.87.11:8100/v1"
    for out in (ray_out, mp_out):
        assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    assert sorted(containers(1, "pl-mp")) == ["spark-vllm-pl-mp-vllm-rank0"]
    assert containers(2, "pl-ray") == {} and containers(2, "pl-mp") == {}
    assert containers(1, "pl-ray") == before  # a new serve inside it, but the container itself untouched


def test_destroying_one_stack_leaves_the_other_serving_untouched(pl_ray, pl_mp):
    before, chains = containers(1, "pl-ray"), guard_chains(1)
    ours = {c for c in chains if c.startswith("svl-pl-ray-")}
    assert len(ours) == 1 and any(c.startswith("svl-pl-mp-") for c in chains), chains
    claims = "docker volume ls -q --filter label=spark-vllm.gpu-memory-utilization"
    assert node_sh(1, claims).split() == ["spark-vllm-pl-mp-memory", "spark-vllm-pl-ray-memory"]
    pl_mp.pulumi("destroy", check=True)
    assert containers(1, "pl-mp") == {}
    assert node_sh(1, claims).split() == ["spark-vllm-pl-ray-memory"]
    assert containers(1, "pl-ray") == before
    after = guard_chains(1)
    assert ours <= after and not any(c.startswith("svl-pl-mp-") for c in after), after
    out = pl_ray.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    preview = pl_ray.pulumi("preview", "--expect-no-changes")
    assert preview.returncode == 0, preview.output


@pytest.fixture(scope="module")
def pl_n2(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "pl-n2", config={"nodes[0]": "node2", **ONE_GPU})


def test_a_stack_on_node2_alone_is_reached_through_node1_with_nothing_on_node1(pl_ray, pl_n2):
    pl_n2.up()
    out = pl_n2.outputs()
    assert out["nodes"] == ["node2"] and out["baseUrl"] == "http://10.87.200.12:8000/v1"
    assert containers(1, "pl-n2") == {} and sorted(containers(2, "pl-n2")) == ["spark-vllm-pl-n2-ray-head"]
    models = node_sh(1, "curl -sf http://10.87.200.12:8000/v1/models")
    assert '"id":"lab-tiny"' in models.replace(" ", ""), models
