"""The pulumi-command double, driven over gRPC as the engine drives it, against sshds this test starts on
127.0.0.1 (a target and a jump host, each accepting only its own throwaway key), with a fake engine that receives
the Log calls through which command output streams to the user; and once under the real Pulumi engine."""

import json
import os
import shutil
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2

from command_client import DOUBLE, INFO, KIND, WARNING, CommandPlugin, FakeEngine, conn, urn
from loopback_node import free_port, loopback_node
from plugin_process import TESTS, rpc_error, values

@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """(target, jump): two loopback sshds with different keys."""
    with ExitStack() as stack:
        yield tuple(stack.enter_context(loopback_node(tmp_path_factory.mktemp(role))) for role in ("target", "jump"))


@pytest.fixture
def engine():
    fake = FakeEngine()
    yield fake
    fake.server.stop(grace=None)


@pytest.fixture
def plugin(engine, tmp_path):
    p = CommandPlugin(engine.address, tmp_path / "double.log")
    yield p
    stderr = p.close()
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr


def test_identifies_as_pulumi_command_1_2_1_and_has_no_provider_config(plugin):
    assert plugin.stub.GetPluginInfo(empty_pb2.Empty()).version == "1.2.1"
    shake = plugin.stub.Handshake(provider_pb2.ProviderHandshakeRequest(engine_address="127.0.0.1:1"))
    assert shake.accept_secrets and shake.accept_resources
    config = plugin.stub.CheckConfig(provider_pb2.CheckRequest(
        urn=urn("default", "pulumi:providers:command"), news=values.encode({"version": "1.2.1", "shell": "x"})))
    assert [f.property for f in config.failures] == ["shell"]  # `version` is the engine's own key
    configured = plugin.stub.Configure(provider_pb2.ConfigureRequest(args=values.encode({"version": "1.2.1"})))
    assert configured.acceptSecrets and configured.supportsPreview


def test_check_fills_upstream_defaults_and_keeps_connection_secret(plugin, hosts):
    target, _ = hosts
    checked = plugin.checked({"connection": conn(target, proxy={"host": "127.0.0.1"}), "create": "true"})
    assert values.is_secret(checked["connection"])
    c = checked["connection"]["value"]
    assert (c["user"], c["port"], c["dialErrorLimit"], c["perDialTimeout"]) == ("root", target.port, 10, 15)
    assert {k: c["proxy"][k] for k in ("user", "port", "dialErrorLimit", "perDialTimeout")} == \
        {"user": "root", "port": 22, "dialErrorLimit": 10, "perDialTimeout": 15}
    assert checked["addPreviousOutputInEnv"] is True


def test_check_refuses_what_the_double_does_not_implement_naming_it(plugin, hosts):
    target, _ = hosts
    failures = plugin.check({"connection": conn(target, hostKey="ssh-ed25519 AAAA", password="pw"),
                             "create": "true", "dir": "/tmp", "environment": {"A": "1"}}).failures
    reasons = {f.property: f.reason for f in failures}
    assert set(reasons) == {"dir", "environment", "connection.hostKey", "connection.password"}, reasons
    assert reasons["dir"] == "the command test double does not implement Command property 'dir'"
    assert "pw" not in " ".join(reasons.values())  # never echoes (secret) values
    assert [f.property for f in plugin.check({"connection": conn(target), "logging": "all"}).failures] == ["logging"]
    assert [f.property for f in plugin.check({"create": "true"}).failures] == ["connection"]


def test_other_resource_types_are_refused(plugin):
    details = rpc_error(lambda: plugin.check({"create": "true"}, token="command:local:Command"))
    assert "implements only command:remote:Command" in details and "command:local:Command" in details


def test_create_feeds_stdin_streams_output_live_and_returns_it(plugin, engine, hosts):
    target, _ = hosts
    create = "cat; for i in 1 2 3; do echo shard $i/3; sleep 0.6; done; echo warn >&2"
    inputs = plugin.checked({"connection": conn(target), "create": create, "stdin": "from stdin\n"})
    rid, outputs = plugin.create(inputs)
    returned = time.monotonic()

    assert rid.startswith("gate") and len(rid) == len("gate") + 8
    assert plugin.create(inputs)[0] != rid  # random, not derived from the inputs
    assert outputs["stdout"] == "from stdin\nshard 1/3\nshard 2/3\nshard 3/3"  # one trailing newline trimmed
    assert outputs["stderr"] == "warn"
    assert outputs["create"] == create and values.is_secret(outputs["connection"])

    first_run = [(t, r) for t, r in engine.logs if r.urn == urn("gate")][:5]
    assert [r.message for _, r in first_run] == ["from stdin", "shard 1/3", "shard 2/3", "shard 3/3", "warn"]
    assert all(r.ephemeral and r.severity == INFO for _, r in first_run)
    # Live: the first shard line reached the engine while the command still had 1.8 s to run.
    assert first_run[1][0] < returned - 1.2


def test_logging_selects_the_streams_sent_to_the_engine(plugin, engine, hosts):
    target, _ = hosts
    both = "echo out; echo err >&2"
    for name, mode in (("only-err", "stderr"), ("quiet", "none")):
        _, outputs = plugin.create(plugin.checked({"connection": conn(target), "create": both, "logging": mode},
                                                  name), name)
        assert (outputs["stdout"], outputs["stderr"]) == ("out", "err")  # captured whatever is logged
    assert engine.messages("only-err") == ["err"]
    assert engine.messages("quiet") == []


def test_failing_command_error_has_status_command_and_output(plugin, hosts):
    target, _ = hosts
    create = 'echo to-out; echo "to-err" >&2; exit 3'
    inputs = plugin.checked({"connection": conn(target), "create": create})
    details = rpc_error(lambda: plugin.create(inputs))
    head = 'Process exited with status 3: running "echo to-out; echo \\"to-err\\" >&2; exit 3":\n'
    assert details.startswith(head), details
    assert sorted(details[len(head):].splitlines()) == ["to-err", "to-out"]


def test_preview_runs_nothing_and_leaves_outputs_unknown(plugin, hosts, tmp_path):
    target, _ = hosts
    marker = tmp_path / "ran"
    inputs = plugin.checked({"connection": conn(target), "create": f"touch {marker}"})
    _, outputs = plugin.create(inputs, preview=True)
    assert outputs["stdout"] == values.UNKNOWN and outputs["stderr"] == values.UNKNOWN
    assert plugin.update({**inputs, "stdout": "", "stderr": ""}, inputs, preview=True)["stdout"] == values.UNKNOWN
    assert not marker.exists()


def test_diff_replaces_only_for_triggers_and_updates_the_rest(plugin, hosts):
    target, _ = hosts
    base = plugin.checked({"connection": conn(target), "create": "run", "triggers": ["a", 1]})
    state = {**base, "stdout": "out", "stderr": ""}

    def detailed(news: dict) -> dict:
        response = plugin.diff(state, plugin.checked(news))
        assert response.hasDetailedDiff and not response.deleteBeforeReplace
        if response.changes == provider_pb2.DiffResponse.DIFF_NONE:
            return {}
        return {k: v.kind for k, v in response.detailedDiff.items()}

    same = dict(base)
    assert detailed(same) == {}  # stdout/stderr in the state are no inputs
    # An element change: an update the engine turns into a replacement (the SDK's replaceOnChanges triggers[*]).
    assert detailed({**same, "triggers": ["b", 1]}) == {"triggers[0]": KIND.UPDATE}
    assert detailed({**same, "triggers": ["a", 1, "c"]}) == {"triggers[2]": KIND.ADD}
    assert detailed({**same, "triggers": [values.UNKNOWN, 1]}) == {"triggers[0]": KIND.UPDATE}  # preview
    # triggers added or dropped as a whole: the provider itself asks for a replacement.
    no_triggers = {k: v for k, v in same.items() if k != "triggers"}
    response = plugin.diff({k: v for k, v in state.items() if k != "triggers"}, plugin.checked(same))
    assert {k: v.kind for k, v in response.detailedDiff.items()} == {"triggers": KIND.ADD_REPLACE}
    assert list(response.replaces) == ["triggers"]
    assert detailed(no_triggers) == {"triggers": KIND.DELETE_REPLACE}
    # Everything else updates in place.
    assert detailed({**same, "create": "run2"}) == {"create": KIND.UPDATE}
    assert detailed({**same, "create": values.UNKNOWN}) == {"create": KIND.UPDATE}
    assert detailed({**same, "stdin": "x"}) == {"stdin": KIND.ADD}
    assert detailed({**same, "connection": conn(target, port=2222)}) == {"connection": KIND.UPDATE}
    assert list(plugin.diff(state, plugin.checked({**same, "create": "run2"})).replaces) == []


def test_update_runs_update_else_create(plugin, engine, hosts, tmp_path):
    target, _ = hosts
    ran = tmp_path / "ran.log"
    spec = {"connection": conn(target), "create": f"echo create >> {ran}; echo created-$(wc -l < {ran})"}
    _, state = plugin.create(plugin.checked(spec))
    news = plugin.checked({**spec, "triggers": ["new"]})
    state = plugin.update(state, news)
    assert ran.read_text() == "create\ncreate\n" and state["stdout"] == "created-2"
    assert state["triggers"] == ["new"]
    # addPreviousOutputInEnv (default true) with a previous stdout: upstream would try SSH setenv.
    assert any(r.severity == WARNING and "PULUMI_COMMAND_STDOUT" in r.message
               for _, r in engine.logs if not r.ephemeral)

    with_update = plugin.checked({**spec, "update": f"echo update >> {ran}", "addPreviousOutputInEnv": False})
    before = len(engine.messages("gate", ephemeral=False))
    state = plugin.update(state, with_update)
    assert ran.read_text() == "create\ncreate\nupdate\n" and state["stdout"] == ""
    assert len(engine.messages("gate", ephemeral=False)) == before  # no warning when switched off


def test_delete_runs_delete_with_the_stored_stdin(plugin, hosts, tmp_path):
    target, _ = hosts
    out = tmp_path / "deleted"
    spec = plugin.checked({"connection": conn(target), "create": "true", "delete": f"cat > {out}",
                           "stdin": values.secret("s3cret"), "addPreviousOutputInEnv": False})
    _, state = plugin.create(spec)
    plugin.delete(state)
    assert out.read_text() == "s3cret"


def test_delete_without_delete_command_does_not_connect(plugin, hosts):
    target, _ = hosts
    unreachable = values.secret({**conn(target)["value"], "port": free_port(), "dialErrorLimit": 0})
    spec = plugin.checked({"connection": unreachable})
    _, state = plugin.create(spec)  # no create command either: nothing to run
    assert (state["stdout"], state["stderr"]) == ("", "")
    plugin.delete(state)


def test_proxy_goes_through_the_jump_host_with_its_own_key(plugin, hosts):
    target, jump = hosts
    jump_log = jump.key.parent / "sshd.log"
    accepted_before = jump_log.read_text().count("Accepted publickey")
    # As the program sends it: the key from a secret config value, nested inside the secret connection.
    proxy = {"host": "127.0.0.1", "port": jump.port, "privateKey": values.secret(jump.key.read_text())}
    _, outputs = plugin.create(plugin.checked({"connection": conn(target, proxy=proxy), "create": "echo via-jump"}))
    assert outputs["stdout"] == "via-jump"
    assert jump_log.read_text().count("Accepted publickey") == accepted_before + 1

    closed = {**proxy, "port": free_port()}
    details = rpc_error(lambda: plugin.create(plugin.checked(
        {"connection": conn(target, proxy=closed, dialErrorLimit=0), "create": "true"})))
    assert details.startswith("proxy: after 0 failed attempts:") and "Connection refused" in details, details


def test_dial_failures_are_retried_up_to_dial_error_limit(plugin, engine, hosts):
    target, _ = hosts
    port = free_port()
    inputs = plugin.checked({"connection": conn(target, port=port, dialErrorLimit=2), "create": "true"})
    started = time.monotonic()
    details = rpc_error(lambda: plugin.create(inputs))
    assert time.monotonic() - started >= 0.25  # 0.1 s, then 0.15 s between the three dials
    assert details.startswith("after 2 failed attempts:") and f"port {port}" in details, details
    assert engine.messages("gate") == ["Dial 1/2 failed: retrying", "Dial 2/2 failed: retrying"]


def test_wrong_key_and_unusable_key_fail_with_clear_errors(plugin, hosts):
    target, jump = hosts
    wrong = plugin.checked({"connection": conn(target, privateKey=jump.key.read_text(), dialErrorLimit=0),
                            "create": "true"})
    assert "Permission denied" in rpc_error(lambda: plugin.create(wrong))
    garbage = plugin.checked({"connection": conn(target, privateKey="not a key"), "create": "true"})
    started = time.monotonic()
    details = rpc_error(lambda: plugin.create(garbage))
    assert "ssh cannot use the private key" in details and time.monotonic() - started < 5  # no dial retries


def _processes() -> dict[int, tuple[int, str, bytes]]:
    """pid -> (parent pid, argv joined by spaces, environment) of every process we can read."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found[int(entry.name)] = (ppid, argv, (entry / "environ").read_bytes())
            except (OSError, IndexError, ValueError):
                continue
    return found


def _descendants(root: int, processes: dict) -> list[str]:
    """argv of the processes below `root` (other runs of the double on this machine are not ours to judge)."""
    below, frontier = [], {root}
    while frontier:
        children = {pid for pid, (ppid, _, _) in processes.items() if ppid in frontier}
        below += [processes[pid][1] for pid in children]
        frontier = children
    return below


def test_private_keys_are_never_on_a_command_line_and_gone_once_connected(plugin, hosts):
    target, jump = hosts
    proxy = {"host": "127.0.0.1", "port": jump.port, "privateKey": jump.key.read_text()}
    secrets_ = [line for node in hosts for line in node.key.read_text().splitlines() if "PRIVATE KEY" not in line]
    inputs = plugin.checked({"connection": conn(target, proxy=proxy), "create": "sleep 2; echo done",
                             "stdin": values.secret("stdin-secret-value")})
    result = {}
    worker = threading.Thread(target=lambda: result.update(zip(("id", "outputs"), plugin.create(inputs))))
    worker.start()
    seen, key_paths = set(), set()
    while worker.is_alive():
        processes = _processes()
        for pid, (_, argv, environ) in processes.items():  # every process on the machine
            for secret in [*secrets_, "stdin-secret-value"]:
                assert secret not in argv and secret.encode() not in environ, f"secret visible in pid {pid}: {argv}"
        for argv in _descendants(plugin.proc.pid, processes):
            if argv.startswith("ssh "):
                seen.add(argv)
                key_paths.update(a.split("=", 1)[1] for a in argv.split() if a.startswith("IdentityFile=/"))
        if key_paths and any("sleep 2" in a for a in seen):
            assert not any(os.path.exists(p) for p in key_paths), "key files kept after authentication"
        time.sleep(0.05)
    worker.join()
    assert any("ControlMaster=yes" in a for a in seen) and any("sleep 2" in a for a in seen), seen
    assert len(key_paths) == 2  # the target's and the jump host's
    outputs = result["outputs"]
    assert outputs["stdout"] == "done"
    assert values.is_secret(outputs["connection"]) and values.is_secret(outputs["stdin"])
    assert not values.is_secret(outputs["stdout"])  # upstream: secretness flows only to same-named outputs


# --- the real engine with the double as its ambient command plugin ---------------------------------------------

REPO = TESTS.parent
ENGINE_PROGRAM = '''
import pulumi
import pulumi_command as command

cfg = pulumi.Config()
connection = command.remote.ConnectionArgs(host="127.0.0.1", port=cfg.require_int("port"), user="root",
                                           private_key=cfg.require_secret("key"))
gate = command.remote.Command("gate", connection=connection, create=cfg.require("create"),
                              delete=cfg.require("delete"), triggers=[cfg.require("trigger")],
                              add_previous_output_in_env=False)
pulumi.export("id", gate.id)
pulumi.export("stdout", gate.stdout)
'''


@pytest.fixture(scope="module")
def cli() -> tuple[list[str], str]:
    """(the command that runs the Pulumi CLI on a Python program, the PATH that makes the double ambient)."""
    out = subprocess.run([str(REPO / "scripts" / "install-pulumi")], capture_output=True, text=True, timeout=3600)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip(f"scripts/install-pulumi failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
    path = os.pathsep.join([str(DOUBLE.parent), out.stdout.strip().splitlines()[-1], os.environ.get("PATH", "")])
    if shutil.which("pulumi-language-python", path=path):
        return ["pulumi"], path
    return [str(REPO / "scripts" / "pulumi")], path  # hosts the program where the language plugin is absent


def test_the_real_engine_streams_replaces_updates_and_destroys_with_the_double(cli, hosts, tmp_path):
    target, _ = hosts
    command_line, path = cli
    program = tmp_path / "program"
    program.mkdir()
    (program / "__main__.py").write_text(ENGINE_PROGRAM)
    (program / "Pulumi.yaml").write_text("name: command-double-engine\nruntime:\n  name: python\n")
    (program / ".venv").symlink_to(REPO / ".venv")
    deleted = tmp_path / "deleted"
    env = dict(os.environ, PATH=path, PULUMI_HOME=str(tmp_path / "home"), PULUMI_BACKEND_URL=f"file://{tmp_path}",
               PULUMI_CONFIG_PASSPHRASE="command-double", PULUMI_SKIP_UPDATE_CHECK="1",
               PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true")
    env.pop("VIRTUAL_ENV", None)

    def pulumi(*args: str, stdin: str | None = None) -> str:
        started = time.monotonic()
        out = subprocess.run([*command_line, *args, "--non-interactive"], cwd=program, env=env, input=stdin,
                             capture_output=True, text=True, timeout=300)
        print(f"$ pulumi {' '.join(args)}  [{time.monotonic() - started:.1f}s, exit {out.returncode}]")
        assert out.returncode == 0, f"pulumi {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def gate_step(preview_json: str) -> dict:
        return next(s for s in json.loads(preview_json)["steps"] if s["urn"].endswith("::gate"))

    pulumi("stack", "init", "engine")
    pulumi("config", "set", "port", str(target.port))
    pulumi("config", "set", "--secret", "key", stdin=target.key.read_text())
    pulumi("config", "set", "create", "for i in 1 2 3; do echo shard $i/3; sleep 0.7; done")
    pulumi("config", "set", "delete", f"echo deleted >> {deleted}")
    pulumi("config", "set", "trigger", "a")

    up = pulumi("up", "--yes", "--skip-preview")
    assert "using pulumi-resource-command from $PATH at " + str(DOUBLE) in up
    # The user sees the progress while the command runs, on the resource's row.
    assert any("gate creating" in line and line.rstrip().endswith("shard 1/3") for line in up.splitlines()), up
    first = json.loads(pulumi("stack", "output", "--json", "--show-secrets"))
    assert first["stdout"] == "shard 1/3\nshard 2/3\nshard 3/3" and first["id"].startswith("gate")
    key_body = target.key.read_text().splitlines()[1]
    assert key_body not in pulumi("stack", "export"), "the private key must be a secret in the state"

    pulumi("config", "set", "trigger", "b")
    step = gate_step(pulumi("preview", "--json"))
    # The double says "triggers[0]: update"; the engine makes it a replacement from the SDK's triggers[*].
    assert step["op"] == "replace" and step["detailedDiff"] == {"triggers[0]": {"kind": "update-replace",
                                                                               "inputDiff": False}}, step
    pulumi("up", "--yes", "--skip-preview")
    second = json.loads(pulumi("stack", "output", "--json", "--show-secrets"))
    assert second["id"] != first["id"] and deleted.read_text() == "deleted\n"  # the old one's delete ran

    pulumi("config", "set", "create", "echo changed")
    step = gate_step(pulumi("preview", "--json"))
    assert step["op"] == "update" and step["detailedDiff"] == {"create": {"kind": "update", "inputDiff": False}}, step
    pulumi("up", "--yes", "--skip-preview")
    third = json.loads(pulumi("stack", "output", "--json", "--show-secrets"))
    assert third == {"id": second["id"], "stdout": "changed"}
    pulumi("up", "--yes", "--skip-preview", "--expect-no-changes")
    pulumi("refresh", "--yes", "--skip-preview", "--expect-no-changes")  # Read keeps the state as it is

    pulumi("destroy", "--yes", "--skip-preview")
    assert deleted.read_text() == "deleted\ndeleted\n"
