"""The real Pulumi CLI and engine run a tiny program against this host's dockerd through a loopback sshd:
pulumi-docker replaced by its test double (an ambient plugin on PATH), pulumi-command real or its double.

Walks the life of a deployment: preview, up, a config change that previews and performs a replacement,
a no-op up with --expect-no-changes, drift repaired by `up --refresh`, and destroy leaving nothing behind.
"""

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import docker_cli
from double_client import DOUBLE_DIR

REPO = Path(__file__).resolve().parents[2]
INSTALL_PULUMI = REPO / "scripts" / "install-pulumi"
PROGRAM_HOST = REPO / "scripts" / "pulumi"  # hosts the Python program when pulumi-language-python is absent
COMMAND_DOUBLE_DIR = REPO / "tests" / "command_double"
PROGRAM = Path(__file__).resolve().parent / "first_run_program" / "__main__.py"
INSTALL_TIMEOUT_S = 45 * 60  # a first build of the CLI from Go modules takes a while on 2 cores
STEP_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def engine() -> tuple[list[str], str]:
    """(the command that runs the CLI, the PATH to run it with)."""
    if not INSTALL_PULUMI.exists():
        pytest.skip("scripts/install-pulumi does not exist")
    try:
        out = subprocess.run([str(INSTALL_PULUMI)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"scripts/install-pulumi did not finish within {INSTALL_TIMEOUT_S}s")
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip(f"scripts/install-pulumi failed (exit {out.returncode}): {out.stderr.strip()[-800:]}")
    bin_dir = out.stdout.strip().splitlines()[-1]
    # The docker double first: the engine takes it as the ambient docker plugin. The command plugin may be the
    # real one (from the engine's bin dir or PATH) or the project's command double.
    path = os.pathsep.join([str(DOUBLE_DIR), bin_dir, os.environ.get("PATH", ""), str(COMMAND_DOUBLE_DIR)])
    if shutil.which("pulumi", path=path) is None:
        pytest.skip(f"scripts/install-pulumi printed {bin_dir}, which has no pulumi")
    if shutil.which("pulumi-resource-command", path=path) is None:
        pytest.skip("no pulumi-resource-command (real or tests/command_double) to run pulumi_command.remote.Command")
    if shutil.which("pulumi-language-python", path=path) is not None:
        return ["pulumi"], path
    if PROGRAM_HOST.exists():
        return [str(PROGRAM_HOST)], path
    pytest.skip("neither pulumi-language-python nor scripts/pulumi can run a Python program")


class Project:
    """A stack of the tiny program on a local file backend; every CLI call is logged with its timing."""

    def __init__(self, root: Path, cli: list[str], path: str):
        self.cli = cli
        self.dir = root / "program"
        self.dir.mkdir()
        shutil.copy(PROGRAM, self.dir / "__main__.py")
        (self.dir / ".venv").symlink_to(REPO / ".venv")  # where scripts/pulumi looks for the program's venv
        (self.dir / "Pulumi.yaml").write_text(
            "name: docker-double-first-run\n"
            "runtime:\n  name: python\n  options:\n    toolchain: pip\n"
            f"    virtualenv: {REPO / '.venv'}\n")
        (root / "state").mkdir()
        self.double_log = root / "double.log"
        self.env = dict(
            os.environ,
            PATH=path,
            PULUMI_HOME=str(root / "pulumi-home"),
            PULUMI_BACKEND_URL=f"file://{root / 'state'}",
            PULUMI_CONFIG_PASSPHRASE="docker-double-first-run",
            PULUMI_SKIP_UPDATE_CHECK="1",
            PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true",
            SPARK_VLLM_DOCKER_DOUBLE_LOG=str(self.double_log),
        )
        self.env.pop("VIRTUAL_ENV", None)
        self.timings: list[tuple[str, float]] = []

    def run(self, *args: str) -> subprocess.CompletedProcess:
        started = time.monotonic()
        out = subprocess.run([*self.cli, *args, "--non-interactive"], cwd=self.dir, env=self.env, capture_output=True,
                             text=True, timeout=STEP_TIMEOUT_S)
        self.timings.append((" ".join(args), time.monotonic() - started))
        print(f"$ pulumi {' '.join(args)}  [{self.timings[-1][1]:.1f}s, exit {out.returncode}]")
        print(out.stdout + out.stderr)
        assert out.returncode == 0, f"pulumi {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out

    def outputs(self) -> dict:
        return json.loads(self.run("stack", "output", "--json", "--show-secrets").stdout)


def running_container(name: str) -> dict:
    live = docker_cli.inspect("container", name)
    assert live is not None, f"container {name} does not exist"
    assert live["State"]["Running"], f"container {name} is not running: {live['State']}"
    return live


def test_first_real_run(engine, node, busybox, tmp_path):
    image, image_id = busybox
    name = f"{docker_cli.TEST_PREFIX}{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "marker"
    project = Project(tmp_path, *engine)
    project.run("stack", "init", "first-run")
    for key, value in {"sshPort": str(node.port), "keyPath": str(node.key), "image": image,
                       "containerName": name, "mode": "one", "markerPath": str(marker)}.items():
        project.run("config", "set", key, value)

    try:
        preview = project.run("preview")
        assert "docker:index:Container" in preview.stdout and "create" in preview.stdout
        assert docker_cli.inspect("container", name) is None, "a preview must not create anything"

        project.run("up", "--yes", "--skip-preview")
        first = project.outputs()
        live = running_container(name)
        assert live["Id"] == first["containerId"] and first["imageId"] == image_id
        assert "MODE=one" in live["Config"]["Env"]
        assert marker.read_text().strip() == "ran-on-node" == first["markerStdout"].strip()
        state = project.run("stack", "export").stdout
        assert "OPENSSH PRIVATE KEY" not in state, "the remote command's private key must be a secret in the state"
        assert "Create urn:pulumi:first-run::docker-double-first-run::docker:index/container:Container::sleeper" \
            in project.double_log.read_text(), "the engine must have used the docker double"

        project.run("config", "set", "mode", "two")
        diff = project.run("preview", "--diff")
        replace_lines = [line for line in diff.stdout.splitlines() if "docker:index/container:Container" in line]
        assert any("+-" in line and "replace" in line for line in replace_lines), diff.stdout
        assert "envs" in diff.stdout, diff.stdout
        steps = json.loads(project.run("preview", "--json").stdout)["steps"]
        container_steps = {s["op"]: s for s in steps if s["urn"].endswith("::sleeper")}
        assert "replace" in container_steps, container_steps.keys()
        assert "envs" in container_steps["replace"].get("replaceReasons", []), container_steps["replace"]

        project.run("up", "--yes", "--skip-preview")
        second = project.outputs()
        live = running_container(name)
        assert second["containerId"] != first["containerId"]
        assert live["Id"] == second["containerId"] and "MODE=two" in live["Config"]["Env"]
        assert docker_cli.inspect("container", first["containerId"]) is None

        project.run("up", "--yes", "--skip-preview", "--expect-no-changes")
        assert project.outputs()["containerId"] == second["containerId"]

        # As pulumi-docker does: the refresh reads the stopped container as mustRun false, and `up` starts the
        # same one again (spark-vllm's own containers replace instead: replace_on_changes).
        subprocess.run(["docker", "kill", name], check=True, capture_output=True)
        project.run("up", "--yes", "--skip-preview", "--refresh")
        third = project.outputs()
        assert third["containerId"] == second["containerId"]
        assert running_container(name)["Id"] == third["containerId"]

        project.run("destroy", "--yes", "--skip-preview")
        assert docker_cli.inspect("container", name) is None
        assert not marker.exists(), "destroy runs the remote command's delete"
        assert docker_cli.inspect("image", image) is not None, "keepLocally leaves the image"
        assert json.loads(project.run("stack", "export").stdout)["deployment"].get("resources") in (None, [])
    finally:
        print("timings:", ", ".join(f"{step}: {secs:.1f}s" for step, secs in project.timings))
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
