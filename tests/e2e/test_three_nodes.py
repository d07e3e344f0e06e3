"""A three-node lab (TP=3): the same program deploys and serves with one more worker behind the jump host."""

from __future__ import annotations

import pytest

from conftest import lab
from labstack import LabStack, chat


@pytest.fixture(scope="module")
def stack3(engine_env, tmp_path_factory):
    lab("up", "--nodes", "3")
    s = LabStack(tmp_path_factory.mktemp("e2e3"), "e2e3", "lab3", engine_env)
    yield s
    s.pulumi("destroy", timeout=600)


def test_three_nodes_deploy_and_serve(stack3):
    run = stack3.up()
    assert "cluster ready: 3 nodes, 3 GPUs" in run.output
    assert "Ray nodes alive: 10.87.200.11, 10.87.200.12, 10.87.200.13" in run.output
    out = stack3.outputs()
    assert set(out["containerIds"]) == {"node1", "node2", "node3"}
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"]
    stack3.pulumi("destroy", check=True)
