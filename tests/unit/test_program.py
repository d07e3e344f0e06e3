"""The program under Pulumi's mocks: its graph, the inputs it pins, the options it sets, and its secrets."""

from __future__ import annotations

import base64
import json
import re
import subprocess

import pytest

from components.nodes.node_facts import parse
from components.config import loader, validate
from components import preflight
from components.resources.fabric_guard import chain_name
from components.resources.ray_node import pinned_env
from fixtures import KEY, cluster_with, stack_config, write_catalog
from test_preflight_checks import healthy
from harness import ROOT, plain_strings, run_program

API_KEY = "sk-unit-test-api-key-123"
HF_TOKEN = "hf_unit_test_token_456"
CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"


@pytest.fixture
def rec(tmp_path):
    catalog = write_catalog(tmp_path / "catalog")
    return run_program(stack_config(catalog, apiKey=API_KEY, hfToken=HF_TOKEN),
                       secret_keys=("spark-vllm:apiKey", "spark-vllm:hfToken"))


def env_of(reg) -> dict[str, str]:
    return dict(e.split("=", 1) for e in reg.inputs["envs"])


def test_one_provider_image_and_container_per_node(rec):
    assert rec.names("pulumi:providers:docker") == {"spark1-docker", "spark2-docker", "spark3-docker"}
    assert rec.names(CONTAINER) == {"ray-head-container", "ray-worker-spark2-container", "ray-worker-spark3-container",
                                    *(f"watchdog-keeper-{n}" for n in ("spark1", "spark2", "spark3"))}
    assert rec.names(COMMAND) == {"cluster-ready-gate", "vllm-serve-process", "serve-ready-gate", "watchdog-arm",
                                  *(f"fabric-guard-{n}-rules" for n in ("spark1", "spark2", "spark3")),
                                  *(f"memory-claim-{n}-volume" for n in ("spark1", "spark2", "spark3")),
                                  *(f"vllm-serve-load-turn-{n}" for n in ("spark1", "spark2", "spark3"))}
    for node in ("spark1", "spark2", "spark3"):
        provider = rec.by_name(f"{node}-docker")
        assert rec.by_name(f"{node}-image").provider.startswith(provider.urn)
    assert rec.by_name("ray-worker-spark2-container").provider.startswith(rec.by_name("spark2-docker").urn)


def test_children_are_parented_to_their_components(rec):
    assert rec.by_name("spark2-docker").parent == rec.by_name("spark2").urn
    assert rec.by_name("ray-head-container").parent == rec.by_name("ray-head").urn
    assert rec.by_name("vllm-serve-process").parent == rec.by_name("vllm-serve").urn
    assert rec.by_name("serve-ready-gate").parent == rec.by_name("serve-ready").urn


def test_graph_orders_head_workers_gate_serve_ready(rec):
    head = rec.by_name("ray-head-container")
    gate = rec.by_name("cluster-ready-gate")
    serve = rec.by_name("vllm-serve-process")
    ready = rec.by_name("serve-ready-gate")
    for worker in ("ray-worker-spark2-container", "ray-worker-spark3-container"):
        w = rec.by_name(worker)
        assert head.urn in w.dependencies
        # The head's identity is a replace-triggering input of the worker, not only a dependency.
        assert {"label": "spark-vllm.head-id", "value": head.id} in w.inputs["labels"]
        assert w.urn in gate.dependencies
    assert head.urn in gate.dependencies
    assert gate.inputs["triggers"] == [head.id, rec.by_name("ray-worker-spark2-container").id,
                                       rec.by_name("ray-worker-spark3-container").id]
    assert gate.urn in serve.dependencies and serve.inputs["triggers"] == [gate.id]
    assert serve.urn in ready.dependencies and ready.inputs["triggers"] == [serve.id]


def test_each_nodes_guard_goes_in_before_its_ray_container(rec, tmp_path):
    cluster = loader.load("test", stack_config(write_catalog(tmp_path / "catalog")), set(), ROOT).cluster
    chain = chain_name("test", cluster)
    assert re.fullmatch(r"svl-test-[0-9a-f]{8}", chain)
    for node, host, container in (("spark1", "10.10.10.11", "ray-head-container"),
                                  ("spark2", "192.168.200.2", "ray-worker-spark2-container"),
                                  ("spark3", "10.10.10.13", "ray-worker-spark3-container")):
        guard = rec.by_name(f"fabric-guard-{node}-rules")
        assert guard.parent == rec.by_name(f"fabric-guard-{node}").urn
        assert guard.urn in rec.by_name(container).dependencies
        assert guard.inputs["connection"]["value"]["host"] == host
        create = guard.inputs["create"]
        ports = "6379 8265 6380 6381 6382 52365 10001 44217 44227 29511 10002:19999 ephemeral"
        assert create.startswith(f"if ! sudo -n true 2>/dev/null; then printf '%s\\n' 'fabric guard on {node}: nvidia "
                                 "cannot")
        assert create.endswith(f"fabric-guard apply {chain} enp1s0f1np1 'spark-vllm stack test' {ports}")
        assert guard.inputs["delete"].endswith(f"fabric-guard remove {chain}")
        # Unknown state (preflight off here): nothing forces a re-apply, so a no-op stays a no-op.
        assert guard.inputs["triggers"] == ["applied"] and guard.ignore_changes == ["triggers"]
        # New rules get a new chain, created before the old one is removed: Ray is never left open.
        assert not guard.delete_before_replace and "*" in guard.replace_on_changes


def test_a_guard_preflight_found_missing_gets_a_fresh_trigger(tmp_path, monkeypatch):
    facts = healthy()
    facts["spark2"]["guard"] = {"hooked": []}
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True})
    first, second = run_program(cfg), run_program(cfg)
    for rec in (first, second):
        assert rec.by_name("fabric-guard-spark1-rules").inputs["triggers"] == ["applied"]
        again = rec.by_name("fabric-guard-spark2-rules")
        # The same chain name again: the old resource's (empty) delete goes first.
        assert again.ignore_changes == [] and again.delete_before_replace
    missing = [rec.by_name("fabric-guard-spark2-rules").inputs["triggers"][0] for rec in (first, second)]
    assert missing[0] != missing[1] and "applied" not in missing


def test_without_the_guard_ray_ports_are_still_pinned(tmp_path):
    catalog = write_catalog(tmp_path / "catalog", clusters=cluster_with(lambda c: c["ray"].update(fabricGuard=False)))
    rec = run_program(stack_config(catalog))
    assert not any(name.startswith("fabric-guard") for name in rec.names())
    assert "--runtime-env-agent-port=6380" in rec.by_name("ray-worker-spark2-container").inputs["command"]


def test_without_the_dashboard_the_head_starts_none_and_nothing_guards_or_checks_its_port(tmp_path):
    catalog = write_catalog(tmp_path / "catalog", clusters=cluster_with(lambda c: c["ray"].update(dashboard=False)))
    d = loader.load("test", stack_config(catalog), set(), ROOT)
    assert 8265 not in d.cluster.head_ports and "8265" not in d.cluster.guarded_ports
    head = run_program(stack_config(catalog)).by_name("ray-head-container").inputs["command"]
    assert "--include-dashboard=false" in head and not any(arg.startswith("--dashboard-") and "agent" not in arg
                                                           for arg in head)
    assert "--dashboard-agent-grpc-port=6381" in head  # the agent still runs on every node


def test_containers_are_pinned_to_the_fabric(rec):
    for name, ip in (("ray-head-container", "192.168.200.1"), ("ray-worker-spark2-container", "192.168.200.2"),
                     ("ray-worker-spark3-container", "192.168.200.3")):
        reg = rec.by_name(name)
        env = env_of(reg)
        assert env["VLLM_HOST_IP"] == ip
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME",
                    "OMPI_MCA_btl_tcp_if_include"):
            assert env[var] == "enp1s0f1np1"
        assert env["MASTER_ADDR"] == "192.168.200.1"
        assert env["RAY_memory_monitor_refresh_ms"] == "0"
        assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
        assert env["RAY_prestart_worker_first_driver"] == "0"
        assert env["AUTOSCALER_METRIC_PORT"] == "44217" and env["DASHBOARD_METRIC_PORT"] == "44227"
        assert env["NCCL_IB_HCA"] == "rocep1s0f1"  # the cluster's extras
        assert f"--node-ip-address={ip}" in reg.inputs["command"]
        assert reg.inputs["entrypoints"] == ["ray"] and reg.inputs["command"][0] == "start"
        assert "--block" in reg.inputs["command"]


def test_the_pinned_variables_are_the_ones_config_refuses_to_override(tmp_path):
    # validate.PINNED_ENV guards the user's extras; it must name exactly what ray_node pins.
    d = loader.load("t", stack_config(write_catalog(tmp_path / "catalog")), set(), ROOT)
    pinned = set(pinned_env(d.cluster, d.cluster.head)) | set(pinned_env(d.cluster, d.cluster.workers[0]))
    assert pinned == set(validate.PINNED_ENV)
    # A worker keeps trying its head's GCS for as long as the head takes to come up beside it.
    assert pinned_env(d.cluster, d.cluster.workers[0])["RAY_gcs_server_port_wait_time_s"] == "120"
    assert "RAY_gcs_server_port_wait_time_s" not in pinned_env(d.cluster, d.cluster.head)


def test_head_and_worker_ray_flags(rec):
    head = rec.by_name("ray-head-container").inputs["command"]
    assert "--head" in head and "--port=6379" in head and "--num-gpus=1" in head
    # The dashboard listens on the fabric address only, never 0.0.0.0.
    assert "--dashboard-host=192.168.200.1" in head
    assert not any("0.0.0.0" in arg for arg in head)
    worker = rec.by_name("ray-worker-spark2-container").inputs["command"]
    assert "--address=192.168.200.1:6379" in worker and "--head" not in worker
    # Every port Ray opens is pinned, so the fabric guard can close exactly those; the client server runs on the head.
    pinned = ["--runtime-env-agent-port=6380", "--dashboard-agent-grpc-port=6381", "--metrics-export-port=6382",
              "--dashboard-agent-listen-port=52365", "--min-worker-port=10002", "--max-worker-port=19999"]
    assert set(pinned) <= set(head) and set(pinned) <= set(worker)
    assert "--ray-client-server-port=10001" in head and not any("client" in arg for arg in worker)


def test_container_runtime_settings(rec):
    c = rec.by_name("ray-head-container").inputs
    assert c["networkMode"] == "host" and c["ipcMode"] == "host"
    assert c["shmSize"] == 10240 and c["gpus"] == "all"
    assert c["devices"] == [{"hostPath": "/dev/infiniband", "containerPath": "/dev/infiniband", "permissions": "rwm"}]
    assert c["capabilities"] == {"adds": ["CAP_IPC_LOCK"]}
    assert {(u["name"], u["soft"], u["hard"]) for u in c["ulimits"]} == {
        ("memlock", -1, -1), ("stack", 67108864, 67108864), ("nofile", 1048576, 1048576)}
    assert {"target": "/models/big", "source": "/models/big", "type": "bind", "readOnly": True} in c["mounts"]
    assert {"target": "/root/.cache/huggingface", "source": "/home/nvidia/.cache/huggingface",
            "type": "bind"} in c["mounts"]
    assert c["name"] == "spark-vllm-test-ray-head"
    assert c["image"] == rec.by_name("spark1-image").inputs.get("imageId", c["image"])


def test_every_ray_container_replaces_on_any_change_and_deletes_first(rec):
    for name in ("ray-head-container", "ray-worker-spark2-container", "ray-worker-spark3-container"):
        r = rec.by_name(name)
        assert r.replace_on_changes == ["*"] and r.delete_before_replace, name


def test_a_replaced_head_takes_every_worker_down_first(rec):
    """replace_with: the engine deletes the workers before the head, whatever pulumi-docker's diff says."""
    head = rec.by_name("ray-head-container").urn
    assert rec.by_name("ray-head-container").replace_with == []
    for name in ("ray-worker-spark2-container", "ray-worker-spark3-container"):
        assert rec.by_name(name).replace_with == [head], name


def test_nodes_behind_a_jump_host_use_it_for_docker_and_commands(rec):
    direct = rec.by_name("spark1-docker").inputs
    assert direct["host"] == "ssh://nvidia@10.10.10.11"
    jumped = rec.by_name("spark2-docker").inputs
    assert jumped["host"] == "ssh://nvidia@192.168.200.2"
    opts = json.loads(jumped["sshOpts"]) if isinstance(jumped["sshOpts"], str) else jumped["sshOpts"]
    proxy = [o for o in opts if o.startswith("ProxyCommand=")]
    assert proxy and "-W %h:%p" in proxy[0] and "nvidia@10.10.10.11" in proxy[0]
    assert "IdentitiesOnly=yes" in proxy[0]  # the jump hop gets the same options
    # One shared SSH connection a node and hop, not one a Docker API call.
    for shared in ("ControlMaster=auto", "ControlPersist=60"):
        assert shared in opts and shared in proxy[0]
    # The hop's %C is escaped, or ssh would expand it in the ProxyCommand (and fail: "percent_expand").
    assert "ControlPath=~/.cache/spark-vllm/ssh/%C" in opts and "ControlPath=~/.cache/spark-vllm/ssh/%%C" in proxy[0]


def test_ssh_sharing_can_be_turned_off(tmp_path):
    catalog = write_catalog(tmp_path / "catalog", clusters=cluster_with(
        lambda c: c["ssh"].update(controlPersistSeconds=0)))
    rec_opts = run_program(stack_config(catalog)).by_name("spark2-docker").inputs["sshOpts"]
    opts = json.loads(rec_opts) if isinstance(rec_opts, str) else rec_opts
    assert not any(o.startswith("Control") for o in opts) and not any("ControlMaster" in o for o in opts)


def test_serve_flags(rec):
    create = rec.by_name("vllm-serve-process").inputs["create"]
    for flag in ("vllm serve /models/big", "--served-model-name big", "--tensor-parallel-size 3",
                 "--pipeline-parallel-size 1", "--distributed-executor-backend ray",
                 "--gpu-memory-utilization 0.85", "--max-model-len 8192", "--enforce-eager", "--port 8000"):
        assert flag in create
    assert create.startswith("docker exec -i spark-vllm-test-ray-head sh -s -- ")


def test_options_that_make_replacement_safe(rec):
    for name in ("ray-head-container", "ray-worker-spark2-container", "vllm-serve-process"):
        assert rec.by_name(name).delete_before_replace, name  # fixed names and ports
    for name in ("cluster-ready-gate", "vllm-serve-process", "serve-ready-gate"):
        assert "*" in rec.by_name(name).replace_on_changes, name


def test_serve_delete_stops_only_its_process_group(rec):
    delete = rec.by_name("vllm-serve-process").inputs["delete"]
    assert "/run/spark-vllm/serve.pid" in delete and 'kill -TERM "-$p"' in delete


@pytest.mark.parametrize("state,execs", [("true", True), ("false", False), ("", False)],
                         ids=["running", "stopped by a reboot", "gone"])
def test_serve_delete_execs_only_into_a_running_head(rec, tmp_path, state, execs):
    """Run with a stand-in `docker` that answers inspect with `state` and logs every call."""
    calls = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\necho "$1" >> {calls}\n'
                    f'[ "$1" = inspect ] && {{ [ -n "{state}" ] && echo "{state}" || exit 1; }}\nexit 0\n')
    fake.chmod(0o755)
    delete = rec.by_name("vllm-serve-process").inputs["delete"]
    done = subprocess.run(["sh", "-c", delete], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().split() == (["inspect", "exec"] if execs else ["inspect"])


def test_gates_are_bounded_on_the_node(rec):
    """pulumi-command enforces no timeout, so each gate carries its own `timeout` past the script's deadline."""
    for name in ("cluster-ready-gate", "serve-ready-gate"):
        create = rec.by_name(name).inputs["create"]
        script_s = int(create.split("--timeout=")[1].split()[0])
        assert create.startswith(f"timeout -k 10 {script_s + 90} docker exec -i "), create


def test_secrets_never_appear_in_plain_inputs(rec):
    for reg in rec.resources.values():
        for text in plain_strings(reg.inputs):
            for secret in (API_KEY, HF_TOKEN, "unit-test-key-material"):
                assert secret not in text, f"{secret!r} in plain input of {reg.name}"
    serve = rec.by_name("vllm-serve-process").inputs
    assert serve["stdin"].get("value") is not None and plain_strings(serve["stdin"]) == []
    # Delivered inside the secret, base64-encoded for the launcher (tests/unit/test_shell_injection.py runs it).
    assert base64.b64encode(API_KEY.encode()).decode() in serve["stdin"]["value"]
    connection = rec.by_name("vllm-serve-process").inputs["connection"]
    assert plain_strings(connection) == [] and connection["value"]["privateKey"] == KEY


def test_gates_are_bounded(rec):
    gate = rec.by_name("cluster-ready-gate").inputs["create"]
    assert "--timeout=180" in gate and "--expect=spark2=192.168.200.2" in gate
    assert "--management=spark1=10.10.10.11" in gate and "--gpus=3" in gate
    ready = rec.by_name("serve-ready-gate").inputs["create"]
    assert "--timeout=2400" in ready and "--model=big" in ready and "--url=http://127.0.0.1:8000" in ready


@pytest.mark.parametrize("executor, head_name, worker", [("ray", "ray-head-container", "ray-worker-spark2-container"),
                                                         ("mp", "vllm-rank-spark1-container",
                                                          "vllm-rank-spark2-container")])
def test_with_preflight_a_worker_starts_beside_its_head(tmp_path, monkeypatch, executor, head_name, worker):
    """The head's life token follows it to its workers (liveness.py), so a worker waits for no head container: Ray's
    worker and vLLM's ranks keep trying to reach the head. A replaced head still takes its workers down first."""
    from components import preflight
    from components.nodes.node_facts import parse
    from test_preflight_checks import healthy

    facts = healthy()
    if executor == "mp":
        facts["spark1"]["ports"] = {"29501": {"free": True}, "8000": {"free": True}, "29511": {"free": True}}
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    rec = run_program(stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True},
                                   serve={"executor": executor}))
    head, w = rec.by_name(head_name), rec.by_name(worker)
    assert head.urn not in w.dependencies and w.replace_with == [head.urn]
    assert not any("spark-vllm.head-id" in json.dumps(label) for label in w.inputs["labels"])
