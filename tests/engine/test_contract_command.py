"""The pulumi-command contract: what spark-vllm relies on, or must work around, in remote.Command itself.

Each check drives a plugin over gRPC as the engine does, against sshds on 127.0.0.1. By default the plugin is
the double (tests/command_double); `SPARK_VLLM_COMMAND_PLUGIN=/path/to/pulumi-resource-command` runs the same
checks against a real build (docs/real-plugins.md). The expected values were read from pulumi-command 1.2.1's
sources and seen with its binary.
"""

import threading
import time
from contextlib import ExitStack

import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2

from command_client import PLUGIN, CommandPlugin, FakeEngine, conn
from loopback_node import loopback_node
from plugin_process import values


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """(target, other): two loopback sshds with different keys."""
    with ExitStack() as stack:
        yield tuple(stack.enter_context(loopback_node(tmp_path_factory.mktemp(role))) for role in ("target", "other"))


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    engine = FakeEngine()
    p = CommandPlugin(engine.address, tmp_path_factory.mktemp("contract") / "plugin.log", PLUGIN)
    yield p
    p.close()
    engine.server.stop(grace=None)


def replaced(plugin, state: dict, news: dict) -> tuple[bool, list[str]]:
    """(any change, the properties the provider itself replaces on) for `news` against `state`."""
    response = plugin.diff(state, plugin.checked(news))
    return response.changes == provider_pb2.DiffResponse.DIFF_SOME, sorted(response.replaces)


def test_what_the_provider_itself_replaces_on(plugin, hosts):
    target, other = hosts
    spec = {"connection": conn(target), "create": "true", "triggers": ["a"], "addPreviousOutputInEnv": False}
    _, state = plugin.create(plugin.checked(spec))
    assert replaced(plugin, state, spec) == (False, [])
    # triggers as a whole; an element change is an update that the SDK's replaceOnChanges turns into a replace.
    assert replaced(plugin, state, {k: v for k, v in spec.items() if k != "triggers"}) == (True, ["triggers"])
    # The rest is an update: spark-vllm sets replace_on_changes=["*"] on every command that must run again.
    assert replaced(plugin, state, {**spec, "create": "false"}) == (True, [])
    assert replaced(plugin, state, {**spec, "connection": conn(other)}) == (True, [])


def test_an_update_without_update_runs_create_again(plugin, hosts, tmp_path):
    """Changing only `delete` re-runs `create`: why the serve, whose delete stops it, is replaced instead."""
    target, _ = hosts
    ran = tmp_path / "ran"
    spec = plugin.checked({"connection": conn(target), "create": f"echo x >> {ran}", "delete": "true",
                           "addPreviousOutputInEnv": False})
    _, state = plugin.create(spec)
    plugin.update(state, {**spec, "delete": "echo other"})
    assert ran.read_text() == "x\nx\n"


def test_delete_runs_with_the_connection_in_the_state(plugin, hosts, tmp_path):
    target, other = hosts
    gone = tmp_path / "deleted"
    _, state = plugin.create(plugin.checked({"connection": conn(target), "create": "true",
                                             "delete": f"echo $SSH_CONNECTION > {gone}",
                                             "addPreviousOutputInEnv": False}))
    plugin.delete(state)
    assert f" {target.port}" in gone.read_text()


def test_read_returns_the_state_unchanged(plugin, hosts):
    target, _ = hosts
    _, state = plugin.create(plugin.checked({"connection": conn(target), "create": "echo o",
                                             "addPreviousOutputInEnv": False}))
    response = plugin.stub.Read(provider_pb2.ReadRequest(
        urn="urn:pulumi:test::spark-vllm::command:remote:Command::gate", id="gate0123abcd",
        properties=values.encode(state), inputs=values.encode({"create": "echo o"})))
    assert response.id == "gate0123abcd" and values.decode(response.properties)["stdout"] == "o"


def test_neither_a_timeout_nor_cancel_ends_a_running_command(plugin, hosts):
    """customTimeouts bound nothing and Ctrl-C waits: a gate must bound itself on the node. (Last: a real
    plugin may take no more requests after Cancel.)"""
    target, _ = hosts
    inputs = plugin.checked({"connection": conn(target), "create": "sleep 3; echo finished",
                             "addPreviousOutputInEnv": False})
    result = {}

    def create():
        response = plugin.stub.Create(provider_pb2.CreateRequest(
            urn="urn:pulumi:test::spark-vllm::command:remote:Command::gate", properties=values.encode(inputs),
            timeout=1))
        result["stdout"] = values.decode(response.properties)["stdout"]

    worker = threading.Thread(target=create)
    started = time.monotonic()
    worker.start()
    time.sleep(1.5)
    plugin.stub.Cancel(empty_pb2.Empty())
    worker.join(timeout=30)
    assert result.get("stdout") == "finished" and time.monotonic() - started >= 3
