"""End-to-end: the unchanged program, through the real Pulumi engine, on the two-node lab.

The scenarios run in order on one stack, each starting from the state the previous one left, as an
operator's day would. Ray is real; vLLM is the test double (lab/vllm_double); node2 is reached only
through node1 as SSH jump host in every scenario.
"""

from __future__ import annotations

import json
import re
import socket

import pytest

from conftest import SERVE_CHAIN, node_sh
from labstack import chat, planned, steps

HEAD = "spark-vllm-e2e-ray-head"
WORKER = "spark-vllm-e2e-ray-worker"


def containers(node: int) -> list[str]:
    return node_sh(node, "docker ps -a --filter label=spark-vllm.stack=e2e --format '{{.Names}} {{.State}}'").split()


def assert_serving(stack) -> dict:
    out = stack.outputs()
    answer = chat(out["baseUrl"], out["servedModel"])
    assert answer["choices"][0]["message"]["content"]
    return out


def test_up_from_empty_serves_and_shows_progress(stack):
    run = stack.up()
    assert "cluster ready: 2 nodes, 2 GPUs" in run.output
    assert "Ray nodes alive: 10.87.200.11, 10.87.200.12" in run.output
    for k in range(1, 5):
        assert f"loading weights {k}/4 shards" in run.output, run.output
    assert "ready: lab-tiny served at" in run.output
    out = assert_serving(stack)
    assert out["fabricIps"] == {"node1": "10.87.200.11", "node2": "10.87.200.12"}
    assert out["baseUrl"] == "http://172.29.87.11:8000/v1"
    assert containers(1) == [HEAD, "running"] and containers(2) == [WORKER, "running"]


def test_node2_is_reached_only_through_node1(stack):
    with pytest.raises(OSError):
        socket.create_connection(("10.87.200.12", 22), timeout=3)
    state = stack.export()
    provider = next(r for r in state["deployment"]["resources"] if r["urn"].endswith("::node2-docker"))
    opts = json.loads(provider["inputs"]["sshOpts"])  # provider config travels as JSON text
    proxy = [o for o in opts if o.startswith("ProxyCommand=")]
    assert proxy and "root@172.29.87.11" in proxy[0] and provider["inputs"]["host"] == "ssh://root@10.87.200.12"


def test_no_op_up_and_preview_change_nothing(stack):
    stack.up("--expect-no-changes")
    preview = stack.pulumi("preview", "--expect-no-changes", check=True)
    assert planned(preview) == {}
    # What Docker reports back must equal what the program wrote, or every `up --refresh` restarts.
    stack.pulumi("preview", "--refresh", "--expect-no-changes", check=True)


def test_rdma_on_and_off_deploys_and_refreshes_clean(stack):
    """The reference cluster's setting: the verbs device and IPC_LOCK (each lab node has a stand-in device)."""
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["docker"].update(rdma=True))
    stack.up()
    assert "/dev/infiniband" in node_sh(1, f"docker inspect -f '{{{{json .HostConfig.Devices}}}}' {HEAD}")
    stack.pulumi("preview", "--refresh", "--expect-no-changes", check=True)
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["docker"].update(rdma=False))
    stack.up()
    stack.pulumi("preview", "--refresh", "--expect-no-changes", check=True)
    assert_serving(stack)


def test_serve_only_change_replaces_only_the_serve_chain(stack):
    """Two serve settings at once, one of them the loader: the gate shows fastsafetensors' own bar."""
    before = stack.outputs()["containerIds"]
    stack.set_config("serve.maxModelLen", "2048")
    stack.set_config("serve.loadFormat", "fastsafetensors")
    preview = stack.pulumi("preview", "--diff", check=True)
    assert planned(preview) == SERVE_CHAIN
    assert "--max-model-len 2048" in preview.output and "--load-format fastsafetensors" in preview.output
    run = stack.up()
    for k in range(1, 5):
        assert f"loading weights {k}/4 shard batches" in run.output, run.output
    assert stack.outputs()["containerIds"] == before
    assert_serving(stack)


def test_instanttensor_passes_preflight_on_an_image_with_it_and_shows_the_bytes_it_loads(stack):
    """The lab's Ray image has the stand-in of `instanttensor` (vllm[instanttensor]); its bar counts bytes."""
    before = stack.outputs()["containerIds"]
    stack.set_config("serve.loadFormat", "instanttensor")
    run = stack.up()
    for node in ("node1", "node2"):
        assert re.search(rf"{node}\s+loader\s+ok\s+instanttensor: `instanttensor` 0\.0\.0\+lab imports", run.output), \
            run.output
    loaded = re.findall(r"loading weights (\d+\.\d)/16\.0 MiB", run.output)  # 4 shards of 4 MiB
    assert loaded and loaded[-1] == "16.0", run.output
    assert stack.outputs()["containerIds"] == before
    assert_serving(stack)


def test_worker_env_change_replaces_that_worker_and_the_serve_chain(stack):
    before = stack.outputs()["containerIds"]
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][1].update(env={"NCCL_DEBUG": "INFO"}))
    preview = stack.pulumi("preview", check=True)
    assert planned(preview) == {"ray-worker-node2-container": "replace", "cluster-ready-gate": "replace",
                                **SERVE_CHAIN}
    stack.up()
    after = stack.outputs()["containerIds"]
    assert after["node1"] == before["node1"] and after["node2"] != before["node2"]
    assert_serving(stack)


def test_ray_change_replaces_everything_in_order(stack):
    before = stack.outputs()["containerIds"]
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"].setdefault("ray", {}).update(metricsExportPort=6383))
    run = stack.up()
    replaced = [(op, name) for op, name in steps(run) if op in ("delete-replaced", "create-replacement")]
    # Other ports mean new guard rules: they go in under a new chain before Ray restarts, the old chain after.
    for node in ("node1", "node2"):
        new, old = (replaced.index((op, f"fabric-guard-{node}-rules")) for op in ("create-replacement",
                                                                                   "delete-replaced"))
        assert new < replaced.index(("create-replacement", "ray-head-container")) and new < old, replaced
    # Each node's load turn is taken again (created before its old one goes) before the new serve starts.
    for node in ("node1", "node2"):
        assert replaced.index(("create-replacement", f"vllm-serve-load-turn-{node}")) < replaced.index(
            ("create-replacement", "vllm-serve-process")), replaced
    order = [(op, name) for op, name in replaced if not name.startswith(("fabric-guard", "vllm-serve-load-turn"))]
    # Fixed names and ports: everything is deleted before anything is created. The worker goes before the head
    # (replace_with), the serve chain top down; then everything is created in dependency order.
    first_create = next(i for i, (op, _) in enumerate(order) if op == "create-replacement")
    deleted = [name for _, name in order[:first_create]]
    assert sorted(deleted) == sorted(["serve-ready-gate", "vllm-serve-process", "cluster-ready-gate",
                                      "ray-worker-node2-container", "ray-head-container"]), order
    assert deleted[-1] == "ray-head-container", order
    assert deleted.index("serve-ready-gate") < deleted.index("vllm-serve-process") \
        < deleted.index("cluster-ready-gate"), order
    creates = [name for op, name in order if op == "create-replacement"]
    assert creates == ["ray-head-container", "ray-worker-node2-container", "cluster-ready-gate",
                       "vllm-serve-process", "serve-ready-gate", "load-floor"], order
    assert "already in use" not in run.output and "address already in use" not in run.output.lower()
    after = stack.outputs()["containerIds"]
    assert after["node1"] != before["node1"] and after["node2"] != before["node2"]
    assert_serving(stack)


def preflight_off(stack):
    """The gates below are the second line, behind preflight (tests/e2e/test_preflight.py): reach them without it."""
    stack.set_config("preflight.enabled", "false")


def preflight_on(stack):
    stack.pulumi("config", "rm", "--path", "spark-vllm:preflight", check=True)


def test_missing_model_path_fails_fast_naming_node_and_path_then_converges(stack):
    preflight_off(stack)
    stack.set_config("serve.path", "/models/nope")
    run = stack.up(check=False)
    assert run.returncode != 0 and run.seconds < 120
    # The weights are mounted into the Ray containers, so Docker refuses first, on the head's container.
    assert "docker:index:Container (ray-head-container)" in run.output, run.output
    assert "bind source path does not exist: /models/nope" in run.output
    stack.pulumi("config", "rm", "--path", "spark-vllm:serve.path", check=True)
    preflight_on(stack)
    stack.up()
    assert_serving(stack)


def test_unsupported_architecture_fails_fast_with_the_log_tail_then_converges(stack):
    # The seed's "image lacks the model's architecture": vLLM dies at start-up, and the gate says so at once.
    preflight_off(stack)
    stack.set_config("serve.path", "/models/lab-tiny-bad-arch")
    run = stack.up(check=False)
    assert run.returncode != 0 and run.seconds < 120
    assert "vllm serve on node1 exited while starting" in run.output, run.output
    assert "are not supported for now" in run.output
    stack.pulumi("config", "rm", "--path", "spark-vllm:serve.path", check=True)
    preflight_on(stack)
    stack.up()
    assert_serving(stack)


def test_drift_head_removed_by_hand_is_rebuilt_by_refresh(stack):
    before = stack.outputs()["containerIds"]
    node_sh(1, f"docker rm -f {HEAD}")
    stack.up("--refresh")
    after = stack.outputs()["containerIds"]
    assert after["node1"] != before["node1"] and after["node2"] != before["node2"]
    assert containers(1) == [HEAD, "running"]
    assert_serving(stack)


def test_wrong_fabric_ip_fails_the_cluster_gate_quickly_and_names_it(stack):
    preflight_off(stack)
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][1].update(fabricIp="10.87.200.19"))
    run = stack.up(check=False)
    # node2's raylet registers with the address it was given, where nothing answers: the gate says so within
    # seconds, long before its bound (60 s in the lab), or Ray's own heartbeat timeout.
    assert run.returncode != 0 and run.seconds < 45, run.output
    assert "nothing at 10.87.200.19 has answered in the 5s since a raylet registered there" in run.output
    assert "node2 registered with 10.87.200.19, but the head cannot reach its raylet there" in run.output, run.output
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][1].update(fabricIp="10.87.200.12"))
    preflight_on(stack)
    stack.up()
    assert_serving(stack)


def test_head_on_its_management_ip_fails_the_cluster_gate_at_once_naming_the_head(stack):
    """The seed's failure for Ray: the head's fabricIp is its management address, which node2 cannot reach. The
    cause is the head, named before the gate's bound (60 s in the lab) is spent waiting for node2."""
    preflight_off(stack)
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][0].update(fabricIp="172.29.87.11"))
    run = stack.up(check=False)
    print(f"head on its management IP: failed after {run.seconds:.1f}s")
    assert run.returncode != 0 and run.seconds < 60, run.output
    assert ("the head node1's fabricIp 172.29.87.11 is not an address of enp1s0f1np1 on node1 (enp1s0f1np1 has "
            "10.87.200.11): Ray's GCS is advertised there, so the workers cannot join over the fabric; set node1's "
            "fabricIp to its address on enp1s0f1np1") in run.output, run.output
    assert "node2 (10.87.200.12) has not joined" not in run.output
    stack.edit_catalog("clusters.yaml", lambda c: c["lab"]["nodes"][0].update(fabricIp="10.87.200.11"))
    preflight_on(stack)
    stack.up()
    assert_serving(stack)


def test_destroy_leaves_nothing_on_any_node(stack):
    stack.pulumi("destroy", check=True)
    for node in (1, 2):
        assert containers(node) == []
        assert "vllm" not in node_sh(node, "ps -eo args")
        assert "svl-" not in node_sh(node, "iptables -S")  # the fabric guard's chain is gone too
