"""Fixtures for engine-level tests: this host's dockerd behind a loopback sshd, and a registry-free image."""

import subprocess
import uuid

import pytest

import busybox_image
import docker_cli
from loopback_node import loopback_node


def _docker_ok() -> str | None:
    try:
        out = subprocess.run(["docker", "info", "-f", "{{.ServerVersion}}"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"docker CLI unusable: {err}"
    return None if out.returncode == 0 else f"dockerd not reachable: {out.stderr.strip()}"


@pytest.fixture(scope="session")
def docker_available():
    reason = _docker_ok()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def node(docker_available, tmp_path_factory):
    with loopback_node(tmp_path_factory.mktemp("node")) as n:
        yield n


@pytest.fixture(scope="session")
def busybox(docker_available):
    """(image name, image id)"""
    if not busybox_image.is_static_busybox():
        pytest.skip("needs a static /bin/busybox (apt-get install busybox-static)")
    image_id = busybox_image.build()
    yield busybox_image.IMAGE, image_id
    docker_cli.remove_test_containers()
    busybox_image.remove()


@pytest.fixture
def container_name():
    """A fresh container name; whatever is left under it is removed after the test."""
    name = f"{docker_cli.TEST_PREFIX}{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)

