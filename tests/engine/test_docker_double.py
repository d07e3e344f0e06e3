"""The docker provider double, driven over gRPC as the engine drives it, against this host's dockerd reached
through a loopback sshd (ssh + `docker system dial-stdio`, as pulumi-docker connects)."""

import subprocess

import pytest
from pulumi.runtime.proto import provider_pb2

import docker_cli
from double_client import CONTAINER, PROVIDER, REMOTE_IMAGE, DoublePlugin, urn, values
from loopback_node import free_port, keygen
from plugin_process import rpc_error

@pytest.fixture
def plugin(tmp_path):
    p = DoublePlugin(tmp_path / "double.log")
    yield p
    p.close()


@pytest.fixture
def configured(plugin, node):
    plugin.configure(node.host, node.ssh_opts)
    return plugin


def sleeper(name: str, image: str, **extra) -> dict:
    return {"name": name, "image": image, "command": ["sleep", "600"], **extra}


def create_container(plugin, news: dict) -> tuple[str, dict, dict]:
    inputs = plugin.checked(CONTAINER, news)
    cid, outputs = plugin.create(CONTAINER, inputs)
    return cid, outputs, inputs


def test_identifies_as_pulumi_docker_5_2_0_and_speaks_the_handshake(plugin, node):
    assert plugin.info().version == "5.2.0"
    shake = plugin.stub.Handshake(provider_pb2.ProviderHandshakeRequest(engine_address="127.0.0.1:1"))
    assert shake.accept_secrets and shake.accept_resources
    configured = plugin.configure(node.host, node.ssh_opts)
    assert configured.acceptSecrets and configured.supportsPreview


def test_unreachable_node_error_names_host_and_ssh_stderr(plugin, node):
    closed = f"ssh://root@127.0.0.1:{free_port()}"  # nothing listens there
    details = rpc_error(lambda: plugin.configure(closed, node.ssh_opts))
    assert closed in details and "Connection refused" in details, details


def test_ssh_auth_failure_error_names_host(plugin, node, tmp_path):
    stranger = keygen(tmp_path / "stranger")
    opts = ["-i", str(stranger), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    details = rpc_error(lambda: plugin.configure(node.host, opts))
    assert node.host in details and "Permission denied" in details, details


def test_check_refuses_what_the_double_does_not_implement(plugin):
    failures = plugin.check(CONTAINER, {"name": "x", "image": "i", "privileged": True}).failures
    assert [(f.property, f.reason) for f in failures] == [
        ("privileged", "the docker test double does not implement Container property 'privileged'")]
    nested = plugin.check(CONTAINER, {"name": "x", "image": "i", "mounts": [
        {"target": "/a", "type": "bind", "source": "/b", "bindOptions": {"propagation": "shared"}}]}).failures
    assert [f.property for f in nested] == ["mounts[0].bindOptions"]
    assert [f.property for f in plugin.check(REMOTE_IMAGE, {"name": "i", "build": {"context": "."}}).failures] \
        == ["build"]
    config = plugin.stub.CheckConfig(provider_pb2.CheckRequest(urn=urn(PROVIDER, "p"), news=values.encode(
        {"host": "ssh://a@b", "version": "5.2.0", "caMaterial": "x"}))).failures
    assert [f.property for f in config] == ["caMaterial"]  # `version` is the engine's own key: tolerated
    bad_restart = plugin.check(CONTAINER, {"name": "x", "image": "i", "restart": "sometimes"}).failures
    assert [f.property for f in bad_restart] == ["restart"]


def test_container_lifecycle_create_read_diff_update_delete(configured, busybox, container_name):
    image, image_id = busybox
    news = sleeper(container_name, image_id,
                   envs=["MODE=test", values.secret("API_KEY=s3cret")],
                   labels=[{"label": "svl.role", "value": "head"}],
                   shmSize=128,
                   ulimits=[{"name": "nofile", "soft": 1024, "hard": 2048}],
                   capabilities={"adds": ["NET_ADMIN"], "drops": ["MKNOD"]},
                   mounts=[{"target": "/scratch", "type": "tmpfs"}],
                   ipcMode="shareable")
    cid, outputs, inputs = create_container(configured, news)

    live = docker_cli.inspect("container", container_name)
    assert live["Id"] == cid and live["State"]["Running"]
    assert {"MODE=test", "API_KEY=s3cret"} <= set(live["Config"]["Env"])
    assert live["Config"]["Labels"] == {"svl.role": "head"}
    assert live["Config"]["Cmd"] == ["sleep", "600"]
    assert live["HostConfig"]["ShmSize"] == 128 * 1024 * 1024
    assert live["HostConfig"]["IpcMode"] == "shareable"
    assert live["HostConfig"]["Ulimits"] == [{"Name": "nofile", "Soft": 1024, "Hard": 2048}]
    assert live["HostConfig"]["CapAdd"] == ["CAP_NET_ADMIN"] and live["HostConfig"]["CapDrop"] == ["CAP_MKNOD"]
    assert live["HostConfig"]["Mounts"][0]["Type"] == "tmpfs"
    assert live["HostConfig"]["RestartPolicy"]["Name"] == "no"

    assert outputs["id"] == cid and outputs["name"] == container_name and outputs["image"] == image_id
    assert values.is_secret(outputs["envs"][1]), "a secret input must stay secret in the outputs"
    assert outputs["mustRun"] is True and outputs["restart"] == "no"  # pulumi-docker's defaults

    rid, read_out, _ = configured.read(CONTAINER, cid, outputs, inputs)
    assert rid == cid and read_out["name"] == container_name

    same = configured.diff(CONTAINER, cid, outputs, inputs)
    assert same.changes == provider_pb2.DiffResponse.DIFF_NONE
    reordered = configured.diff(CONTAINER, cid, outputs, dict(inputs, envs=list(reversed(inputs["envs"]))))
    assert reordered.changes == provider_pb2.DiffResponse.DIFF_NONE, "envs is a set in pulumi-docker"

    env_change = configured.diff(CONTAINER, cid, outputs, dict(inputs, envs=["MODE=prod"]))
    assert env_change.changes == provider_pb2.DiffResponse.DIFF_SOME
    assert list(env_change.replaces) == ["envs"] and env_change.deleteBeforeReplace
    assert env_change.detailedDiff["envs"].kind == provider_pb2.PropertyDiff.UPDATE_REPLACE

    unknown_image = configured.diff(CONTAINER, cid, outputs, dict(inputs, image=values.UNKNOWN))
    assert list(unknown_image.replaces) == ["image"]

    restart_change = configured.diff(CONTAINER, cid, outputs, dict(inputs, restart="unless-stopped"))
    assert restart_change.changes == provider_pb2.DiffResponse.DIFF_SOME
    assert list(restart_change.diffs) == ["restart"] and not restart_change.replaces
    assert restart_change.detailedDiff["restart"].kind == provider_pb2.PropertyDiff.UPDATE

    updated = configured.update(CONTAINER, cid, outputs, dict(inputs, restart="unless-stopped"))
    assert updated["restart"] == "unless-stopped" and updated["id"] == cid
    assert docker_cli.inspect("container", cid)["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"

    configured.delete(CONTAINER, cid, updated)
    assert docker_cli.inspect("container", cid) is None
    configured.delete(CONTAINER, cid, updated)  # already gone: tolerated


def test_read_reports_a_container_removed_by_hand_as_gone(configured, busybox, container_name):
    cid, outputs, inputs = create_container(configured, sleeper(container_name, busybox[0]))
    subprocess.run(["docker", "rm", "-f", container_name], check=True, capture_output=True)
    assert configured.read(CONTAINER, cid, outputs, inputs)[0] == ""


def test_read_of_a_stopped_container_without_must_run_reports_exit_code(configured, busybox, container_name):
    cid, outputs, inputs = create_container(configured, sleeper(container_name, busybox[0], mustRun=False))
    subprocess.run(["docker", "kill", container_name], check=True, capture_output=True)
    rid, read_out, _ = configured.read(CONTAINER, cid, outputs, inputs)
    assert rid == cid and read_out["exitCode"] == 137  # SIGKILL
    configured.delete(CONTAINER, cid, read_out)


def test_create_never_pulls_a_missing_image(configured, node, container_name):
    inputs = configured.checked(CONTAINER, sleeper(container_name, "svl-dd-test/absent:1"))
    details = rpc_error(lambda: configured.create(CONTAINER, inputs))
    assert "svl-dd-test/absent:1" in details and node.host in details, details


def test_preview_create_touches_nothing(configured, busybox, container_name):
    inputs = configured.checked(CONTAINER, sleeper(container_name, values.UNKNOWN))
    rid, outputs = configured.create(CONTAINER, inputs, preview=True)
    assert rid == "" and outputs["id"] == values.UNKNOWN
    assert docker_cli.inspect("container", container_name) is None


def test_remote_image_present_absent_and_keep_locally(configured, busybox, node):
    image, image_id = busybox
    inputs = configured.checked(REMOTE_IMAGE, {"name": image, "keepLocally": True})
    rid, outputs = configured.create(REMOTE_IMAGE, inputs)
    assert outputs["imageId"] == image_id and rid == image_id + image
    assert outputs["repoDigest"] == ""  # imported, never pushed: docker reports no repo digest
    assert configured.read(REMOTE_IMAGE, rid, outputs, inputs)[0] == rid
    configured.delete(REMOTE_IMAGE, rid, outputs)
    assert docker_cli.inspect("image", image) is not None, "keepLocally leaves the image on the node"

    absent = configured.checked(REMOTE_IMAGE, {"name": "svl-dd-test/absent:1"})
    details = rpc_error(lambda: configured.create(REMOTE_IMAGE, absent))
    assert "svl-dd-test/absent:1" in details and node.host in details and "never pulls" in details, details


def test_remote_image_delete_without_keep_locally_removes_it(configured, busybox):
    image, _ = busybox
    extra = "svl-dd-test/busybox:extra-tag"
    subprocess.run(["docker", "tag", image, extra], check=True)
    rid, outputs = configured.create(REMOTE_IMAGE, configured.checked(REMOTE_IMAGE, {"name": extra}))
    configured.delete(REMOTE_IMAGE, rid, outputs)
    assert docker_cli.inspect("image", extra) is None
    assert docker_cli.inspect("image", image) is not None, "only the named tag goes"

