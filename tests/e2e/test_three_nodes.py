"""A three-node lab (TP=3): the same program deploys and serves with one more worker behind the jump host, with
Ray and with vLLM's own executor (`mp`), one stack after the other; then a TP=2 stack on two of the three nodes."""

from __future__ import annotations

import pytest

from conftest import lab, lab_stack, node_sh
from labstack import chat


@pytest.fixture(scope="module")
def lab3(engine_env):
    lab("up", "--nodes", "3", "--no-status")
    return engine_env


@pytest.fixture(scope="module")
def stack3(lab3, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab3, "e2e3", cluster="lab3")


@pytest.fixture(scope="module")
def mp3(lab3, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab3, "mp3", cluster="lab3", executor="mp")


def test_three_nodes_deploy_and_serve(stack3):
    run = stack3.up()
    assert "cluster ready: 3 nodes, 3 GPUs" in run.output
    assert "Ray nodes alive: 10.87.200.11, 10.87.200.12, 10.87.200.13" in run.output
    out = stack3.outputs()
    assert set(out["containerIds"]) == {"node1", "node2", "node3"}
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"]
    stack3.pulumi("destroy", check=True)


def test_three_nodes_deploy_and_serve_with_mp(mp3):
    run = mp3.up()
    for node in ("node2", "node3"):
        assert f"the rank on {node} reaches the master at 10.87.200.11:29501" in run.output, run.output
    out = mp3.outputs()
    assert set(out["containerIds"]) == {"node1", "node2", "node3"}
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    for node in (1, 2, 3):
        rank = f"spark-vllm-mp3-vllm-rank{node - 1}"
        argv = node_sh(node, f"docker inspect -f '{{{{json .Args}}}}' {rank}")
        assert '"--tensor-parallel-size","3"' in argv and '"--nnodes","3"' in argv, argv
        assert f'"--node-rank","{node - 1}"' in argv and ('"--headless"' in argv) == (node > 1), argv
        assert node_sh(node, f"docker inspect -f '{{{{.State.Status}}}}' {rank}").strip() == "running"
    # Each rank loaded its own share of the shards (the double splits them by rank), and rank 2 is node3's.
    assert "Loading weights took" in node_sh(3, "docker logs spark-vllm-mp3-vllm-rank2 2>&1")
    mp3.pulumi("destroy", check=True)
    assert node_sh(3, "docker ps -aq --filter label=spark-vllm.stack=mp3").strip() == ""


@pytest.fixture(scope="module")
def sub3(lab3, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab3, "sub3", cluster="lab3", executor="mp", config={
        "nodes[0]": "node3", "nodes[1]": "node2", "serve.tensorParallel": "2"})


def test_a_stack_on_two_of_three_nodes_serves_from_its_own_head(sub3):
    """`spark-vllm:nodes: [node3, node2]`: node3 is the head (rank 0, the master), node2 its one worker, node1
    only the jump host. The API is on node3, which this machine cannot reach: it is called from node1."""
    run = sub3.up()
    assert "the rank on node2 reaches the master at 10.87.200.13:29501" in run.output, run.output
    out = sub3.outputs()
    assert out["nodes"] == ["node3", "node2"] and set(out["containerIds"]) == {"node3", "node2"}
    assert out["baseUrl"] == "http://10.87.200.13:8000/v1"
    assert node_sh(1, "docker ps -aq --filter label=spark-vllm.stack=sub3").strip() == ""
    assert '"id":"lab-tiny"' in node_sh(1, "curl -sf http://10.87.200.13:8000/v1/models").replace(" ", "")
    argv = node_sh(3, "docker inspect -f '{{json .Args}}' spark-vllm-sub3-vllm-rank0")
    assert '"--nnodes","2"' in argv and '"--node-rank","0"' in argv and '"--headless"' not in argv, argv
    sub3.pulumi("destroy", check=True)
