"""Fixtures for the end-to-end scenarios: the lab, and the real Pulumi CLI with the provider doubles on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from labstack import ENGINE_PATH, ROOT, LabStack

def lab(*args: str, timeout: float = 1800) -> str:
    done = subprocess.run([str(ROOT / "lab" / "lab"), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"lab {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def node_sh(node: int, script: str, check: bool = True) -> str:
    """Runs a shell script on a lab node (the test's own access, not the program's)."""
    done = subprocess.run(["docker", "exec", f"svl-lab-node{node}", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120)
    assert not check or done.returncode == 0, f"node{node}: {script}\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def engine_env():
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("no Docker engine (scripts/test starts one)")
    if shutil.which("pulumi") is None:
        pytest.skip("no pulumi CLI on PATH (scripts/test builds one)")
    remove_leftovers()
    return {"PATH": os.pathsep.join([*ENGINE_PATH, os.environ["PATH"]])}


# The stack of scripts/try-lab, a user's own: scripts/test takes it down for the lab tests and brings it back.
TRY_LAB_STACK = "lab"


def remove_leftovers() -> None:
    """What a crashed or killed run left on the lab's nodes (its stacks' containers hold the ports every scenario
    needs) is removed once, before the first scenario: no test depends on what another run left there."""
    nodes = subprocess.run(["docker", "ps", "--filter", "name=^svl-lab-node", "--format", "{{.Names}}"],
                           capture_output=True, text=True, check=True).stdout.split()
    listed = "docker ps -a --filter label=spark-vllm.stack --format '{{.ID}} {{.Label \"spark-vllm.stack\"}}'"
    for node in nodes:
        subprocess.run(["docker", "exec", node, "sh", "-c",
                        f"{listed} | awk '$2 != \"{TRY_LAB_STACK}\" {{print $1}}' | xargs -r docker rm -f"],
                       capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def lab2(engine_env):
    lab("up", "--nodes", "2")
    return engine_env


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory) -> LabStack:
    s = LabStack(tmp_path_factory.mktemp("e2e"), "e2e", "lab", lab2)
    yield s
    s.pulumi("destroy", timeout=600)
