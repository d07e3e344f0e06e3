"""The pulumi-docker contract: what spark-vllm relies on, or must work around, in the provider's own behaviour.

Each check drives a plugin over gRPC as the engine does, against this host's dockerd behind a loopback sshd. By
default the plugin is the double (tests/docker_double); `SPARK_VLLM_DOCKER_PLUGIN=/path/to/pulumi-resource-docker`
runs the same checks against a real build (docs/real-plugins.md). The expected values were read from the real
plugin's sources (kreuzwerker/terraform-provider-docker v4.5.0 under pulumi-docker) and seen with its binary.
"""

import subprocess

import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2

import docker_cli
from command_client import FakeEngine
from double_client import CONTAINER, PLUGIN, REMOTE_IMAGE, DoublePlugin, values
from plugin_process import rpc_error

SOME, NONE = provider_pb2.DiffResponse.DIFF_SOME, provider_pb2.DiffResponse.DIFF_NONE


@pytest.fixture(scope="module")
def engine():
    fake = FakeEngine()
    yield fake
    fake.server.stop(grace=None)


@pytest.fixture(scope="module")
def plugin(engine, node, tmp_path_factory):
    p = DoublePlugin(tmp_path_factory.mktemp("contract") / "plugin.log", PLUGIN, engine.address)
    p.configure(node.host, node.ssh_opts)
    yield p
    p.close()


def created(plugin, news: dict) -> tuple[str, dict, dict]:
    inputs = plugin.checked(CONTAINER, news)
    cid, outputs = plugin.create(CONTAINER, inputs)
    return cid, outputs, inputs


def sleeper(name: str, image: str, **extra) -> dict:
    return {"name": name, "image": image, "command": ["sleep", "600"], **extra}


def replaces(plugin, cid: str, olds: dict, news: dict) -> tuple[int, list[str]]:
    response = plugin.diff(CONTAINER, cid, olds, plugin.checked(CONTAINER, news))
    return response.changes, sorted(response.replaces)


def test_create_does_not_wait_for_the_container_to_keep_running(plugin, busybox, container_name):
    cid, _, _ = created(plugin, {"name": container_name, "image": busybox[1], "command": ["sh", "-c", "exit 3"]})
    assert cid and docker_cli.inspect("container", cid) is not None  # a success, and the container stays


def test_refresh_keeps_a_stopped_container_and_update_starts_the_same_one(plugin, busybox, container_name):
    """After a reboot: refresh reads mustRun false, and the planned update starts the old container in place."""
    news = sleeper(container_name, busybox[1])
    cid, outputs, inputs = created(plugin, news)
    subprocess.run(["docker", "kill", container_name], check=True, capture_output=True)
    rid, state, read_inputs = plugin.read(CONTAINER, cid, outputs, inputs)
    assert rid == cid and state["mustRun"] is False and state["exitCode"] == 137
    changes, replaced = replaces(plugin, cid, state, news)
    assert changes == SOME and replaced == [], "an in-place update, which leaves the gates and the serve alone"
    plugin.update(CONTAINER, cid, state, plugin.checked(CONTAINER, news))
    assert docker_cli.inspect("container", cid)["State"]["Running"]


def test_a_mount_change_is_planned_in_place(plugin, busybox, container_name, tmp_path):
    """Why the program replaces on any diff: Docker cannot change a running container's mounts."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    mount = lambda source: [{"type": "bind", "source": str(source), "target": "/w", "readOnly": True}]  # noqa: E731
    cid, outputs, _ = created(plugin, sleeper(container_name, busybox[1], mounts=mount(old)))
    changes, replaced = replaces(plugin, cid, outputs, sleeper(container_name, busybox[1], mounts=mount(new)))
    assert changes == SOME and replaced == []


@pytest.mark.parametrize("change", [
    {"envs": ["A=2"]}, {"labels": [{"label": "l", "value": "2"}]},
    {"labels": [{"label": "l", "value": "1"}, {"label": "spark-vllm.life", "value": "20261204T120000Z"}]},
    {"command": ["sleep", "601"]}, {"ulimits": [{"name": "nofile", "soft": 1024, "hard": 2048}]}],
    ids=["envs", "labels", "a label added", "command", "ulimits"])
def test_other_changes_replace(plugin, busybox, container_name, change):
    base = sleeper(container_name, busybox[1], envs=["A=1"], labels=[{"label": "l", "value": "1"}],
                   ulimits=[{"name": "nofile", "soft": 1024, "hard": 1024}])
    cid, outputs, _ = created(plugin, base)
    changes, replaced = replaces(plugin, cid, outputs, {**base, **change})
    assert changes == SOME and replaced == list(change)


@pytest.mark.parametrize("by_hand", ["docker rm -f", "docker kill"])
def test_a_container_removed_or_stopped_by_hand_is_deleted_without_error(plugin, busybox, container_name, by_hand):
    """Day two replaces a dead container without a refresh (components/preflight/liveness.py): the delete of the one
    in the state must succeed when it is gone or stopped, or the repair would fail on what it repairs."""
    cid, outputs, _ = created(plugin, sleeper(container_name, busybox[1]))
    subprocess.run([*by_hand.split(), container_name], check=True, capture_output=True)
    plugin.delete(CONTAINER, cid, outputs)
    assert docker_cli.inspect("container", cid) is None


def test_capabilities_are_read_back_with_the_cap_prefix(plugin, busybox, container_name):
    """`IPC_LOCK` in the program would be a diff on every refresh; spark-vllm writes `CAP_IPC_LOCK`."""
    for spelled, drift in (("IPC_LOCK", True), ("CAP_IPC_LOCK", False)):
        news = sleeper(container_name, busybox[1], capabilities={"adds": [spelled]})
        cid, outputs, inputs = created(plugin, news)
        _, state, _ = plugin.read(CONTAINER, cid, outputs, inputs)
        assert state["capabilities"]["adds"] == ["CAP_IPC_LOCK"]
        assert (replaces(plugin, cid, state, news)[0] == SOME) is drift, spelled
        plugin.delete(CONTAINER, cid, state)


def test_refresh_does_not_read_envs_or_labels_back(plugin, busybox, container_name):
    """Image env and labels never show in the state, so no refresh turns them into a diff."""
    news = sleeper(container_name, busybox[1], envs=["A=1"], labels=[{"label": "l", "value": "1"}])
    cid, outputs, inputs = created(plugin, news)
    _, state, _ = plugin.read(CONTAINER, cid, outputs, inputs)
    assert [e for e in state["envs"]] == ["A=1"] and state["labels"] == [{"label": "l", "value": "1"}]
    assert replaces(plugin, cid, state, news)[0] == NONE


def test_a_missing_image_is_pulled(plugin, node):
    """With preflight off, a missing image is a pull over SSH (here from a registry on a closed loopback port)."""
    absent = plugin.checked(REMOTE_IMAGE, {"name": "127.0.0.1:9/svl-contract/absent:1"})
    details = rpc_error(lambda: plugin.create(REMOTE_IMAGE, absent))
    assert "pull" in details.lower() and "127.0.0.1:9/svl-contract/absent:1" in details, details


@pytest.mark.parametrize("prop,replace", [("labels", None), ("envs", None), ("image", "image"),
                                          ("command", "command"), ("mounts", "mounts")])
def test_a_property_made_unknown_by_a_replaced_dependency(plugin, busybox, container_name, tmp_path, prop, replace):
    """What the engine asks when a resource is replaced delete-first: each dependent's inputs that came from it,
    whole, unknown. For labels and envs the answer is "no diff", so the engine would not delete a worker before
    its head (it learns of the new head id only later); spark-vllm's replace_on_changes=["*"] makes it a replace
    (the engine applies those options to this answer) and the worker goes first."""
    news = sleeper(container_name, busybox[1], envs=["A=1"], labels=[{"label": "head-id", "value": "abc"}],
                   mounts=[{"type": "bind", "source": str(tmp_path), "target": "/w"}])
    cid, outputs, _ = created(plugin, news)
    response = plugin.diff(CONTAINER, cid, outputs, {**plugin.checked(CONTAINER, news), prop: values.UNKNOWN})
    if replace is None:
        assert response.changes == NONE
    else:
        assert response.changes == SOME and list(response.replaces) == [replace]


def test_cancel_is_answered(plugin):
    """The engine calls Cancel at the end of every run; an error there reads as a crashed plugin."""
    plugin.stub.Cancel(empty_pb2.Empty())
