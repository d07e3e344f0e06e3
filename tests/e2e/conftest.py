"""Fixtures for the end-to-end scenarios: the lab, and the real Pulumi CLI with the provider doubles on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterator, Mapping

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


def remove_leftovers(stack: str | None = None) -> None:
    """What a crashed or killed run left on the lab's nodes (its stacks' containers hold the ports every scenario
    needs) is removed once, before the first scenario, and what one stack's failed destroy left, after its module:
    no test depends on what another run or test left there."""
    nodes = subprocess.run(["docker", "ps", "--filter", "name=^svl-lab-node", "--format", "{{.Names}}"],
                           capture_output=True, text=True, check=True).stdout.split()
    # The stacks' containers and load turns, then their memory claims (labelled volumes) that other stacks'
    # preflight adds up.
    label = "--filter label=spark-vllm.%s --format '{{.%s}} {{.Label \"spark-vllm.%s\"}}'"
    which = f'$2 == "{stack}"' if stack else f'$2 != "{TRY_LAB_STACK}"'
    others = f"awk '{which} {{print $1}}'"
    script = "; ".join([f"docker ps -a {label % ('stack', 'ID', 'stack')} | {others} | xargs -r docker rm -f",
                        f"docker ps -a {label % ('load-turn-stack', 'ID', 'load-turn-stack')} | {others} | "
                        "xargs -r docker rm -f",
                        f"docker volume ls {label % ('stack', 'Name', 'stack')} | {others} | "
                        "xargs -r docker volume rm -f"])
    for node in nodes:
        subprocess.run(["docker", "exec", node, "sh", "-c", script],
                       capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def lab2(engine_env):
    """The two-node lab, made right again for each module (what an earlier one left is put back)."""
    lab("up", "--nodes", "2", "--no-status")
    return engine_env


# Each node's load turn, taken again before every new serve or rank group (docs/placement.md).
RAY_TURNS = {f"vllm-serve-load-turn-{node}": "replace" for node in ("node1", "node2")}
MP_TURNS = {f"mp-serve-load-turn-{node}": "replace" for node in ("node1", "node2")}
# A new serve gate is a new load, whose floor is kept with it (the `load` output, components/stacks/model.py).
LOAD_FLOOR = {"load-floor": "replace"}
SERVE_CHAIN = {"vllm-serve-process": "replace", "serve-ready-gate": "replace", **LOAD_FLOOR, **RAY_TURNS}


# The shipped stack file of each lab cluster and executor, and the preset that picks the executor on the others.
SOURCES = {("lab", "ray"): "lab", ("lab", "mp"): "lab-mp", ("lab3", "ray"): "lab3", ("lab3", "mp"): "lab3"}
MP_PRESET = "lab-tiny-mp"


def lab_stack(tmp_path_factory, env: dict[str, str], name: str, *, executor: str = "ray", cluster: str = "lab",
              config: Mapping[str, str] | None = None, catalog: Mapping[str, Callable] | None = None,
              up: bool = False, source: str | None = None, state: Path | None = None) -> Iterator[LabStack]:
    """Every e2e stack's one shape, for a module fixture to `yield from`: stack `name` of a private copy of the
    project, from the shipped Pulumi.<cluster>.yaml of its executor (or Pulumi.<source>.yaml), on a backend of its
    own (or `state`), with `config` set on it (key path -> value) and `catalog` edited (file -> change), deployed
    first when `up`; destroyed after the module, whatever happened (the session's remove_leftovers covers a
    crash)."""
    s = LabStack(tmp_path_factory.mktemp(name), name, source or SOURCES[cluster, executor], env, state)
    s.executor = executor
    preset = {"model": MP_PRESET} if executor == "mp" and SOURCES[cluster, executor] != "lab-mp" else {}
    s.set_configs({**preset, **(config or {})})
    for file, change in (catalog or {}).items():
        s.edit_catalog(file, change)
    try:
        if up:
            s.up()
        yield s
    finally:
        destroyed = False
        try:
            destroyed = s.pulumi("destroy", timeout=600).returncode == 0
        finally:
            if not destroyed:
                remove_leftovers(name)


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory) -> Iterator[LabStack]:
    yield from lab_stack(tmp_path_factory, lab2, "e2e")


def pytest_collection_modifyitems(items):
    """The bench's smoke test runs after the other e2e tests: it times whole commands, and its baseline (the seed's
    script, whose `sleep 5` is all its waiting) fails more often when the machine is loaded, as it is while
    scripts/test's other session (unit, engine, vLLM double) runs beside the lab's first minutes. The README's
    commands (test_first_use.py) run last of all, since `scripts/try-lab --down` takes the lab down: the lab's own
    tests, which follow, start it from nothing anyway, where another e2e module would have to wait for it."""
    last = ("test_bench_smoke.py", "test_first_use.py")
    moved = sorted((item for item in items if item.path.name in last), key=lambda item: last.index(item.path.name))
    others = [item for item in items if item not in moved]
    e2e = [i for i, item in enumerate(others) if "e2e" in item.path.parts]
    if moved and e2e:
        items[:] = others[:e2e[-1] + 1] + moved + others[e2e[-1] + 1:]
