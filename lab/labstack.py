"""Drives the real Pulumi CLI on a copy of this project, against the lab, and reads what the engine did.

Shared by the end-to-end tests (tests/e2e) and the benchmark (bench/run), which put lab/ on their import path.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("Pulumi.yaml", "__main__.py", "requirements.txt", "components", "catalog")
# The provider plugins the engine finds first on PATH: the doubles, or real builds named by the same variables
# as the contract suite's (a check by hand, docs/real-plugins.md).
ENGINE_PATH = [str(Path(os.environ.get(var) or ROOT / "tests" / double / f"pulumi-resource-{name}").parent)
               for var, double, name in (("SPARK_VLLM_DOCKER_PLUGIN", "docker_double", "docker"),
                                         ("SPARK_VLLM_COMMAND_PLUGIN", "command_double", "command"))]


@dataclass
class Run:
    args: list[str]
    returncode: int
    output: str
    seconds: float
    events: list[dict]


class LabStack:
    """One stack of a private copy of the project (catalogs may be edited) on a private file backend."""

    def __init__(self, workdir: Path, stack: str, source: str, env: dict[str, str], state: Path | None = None):
        """A stack named `stack` whose config starts as a copy of the shipped Pulumi.<source>.yaml; its backend is
        `state`, shared by stacks that read each other's outputs (a gateway's), or else a folder of its own."""
        self.dir = workdir / "project"
        self.stack = stack
        shutil.copytree(ROOT, self.dir, ignore=lambda d, names: [n for n in names if Path(d) == ROOT and
                                                                  n not in PROJECT_FILES] + ["__pycache__"])
        # Only the settings: a salt that a `pulumi stack init` in the checkout left there is of another passphrase.
        settings = (yaml.safe_load((ROOT / f"Pulumi.{source}.yaml").read_text()) or {}).get("config", {})
        (self.dir / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": settings}))
        (self.dir / ".venv").symlink_to(ROOT / ".venv")
        state = state or workdir / "state"
        self.env = {**os.environ, **env, "PULUMI_BACKEND_URL": f"file://{state}",
                    "PULUMI_CONFIG_PASSPHRASE": "e2e-passphrase", "PULUMI_SKIP_UPDATE_CHECK": "1",
                    "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
                    "PULUMI_DEBUG_COMMANDS": "true"}  # enables --event-log, as the Automation API does
        state.mkdir(exist_ok=True)
        self.events_dir = workdir / "events"
        self.events_dir.mkdir(exist_ok=True)
        self.runs = 0
        self._outputs: tuple[int, dict] | None = None  # (self.runs when read, the outputs)
        self.pulumi("stack", "init", check=True)

    def command(self, *args: str, events: Path | None = None) -> list[str]:
        """The command line for `pulumi <args>` on this stack, through scripts/pulumi (which hosts the program)."""
        extra = ["--event-log", str(events)] if events and args[0] in ("up", "preview", "destroy", "refresh") else []
        return [str(ROOT / "scripts" / "pulumi"), *args, *extra, "--non-interactive", "--stack", self.stack]

    def pulumi(self, *args: str, check: bool = False, timeout: float = 900) -> Run:
        self.runs += 1
        events = self.events_dir / f"{self.runs:03d}.jsonl"
        cmd = self.command(*args, events=events)
        if args[0] in ("up", "destroy", "refresh", "cancel"):
            cmd.append("--yes")
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=timeout)
        run = Run(cmd, done.returncode, done.stdout + done.stderr, time.monotonic() - start, _read_events(events))
        if check and run.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.output}")
        return run

    def up(self, *args: str, check: bool = True, timeout: float = 900) -> Run:
        return self.pulumi("up", "--skip-preview", *args, check=check, timeout=timeout)

    def outputs(self) -> dict:
        """The stack's outputs, read again only once another Pulumi command has run on it: the waits poll the
        endpoint they name, and each `stack output` costs a CLI start and the passphrase's key derivation."""
        if self._outputs is None or self._outputs[0] != self.runs:
            run = self.pulumi("stack", "output", "--json", "--show-secrets", check=True)
            self._outputs = (self.runs, json.loads(run.output[run.output.index("{"):]))
        return copy.deepcopy(self._outputs[1])

    def export(self) -> dict:
        run = self.pulumi("stack", "export", "--show-secrets", check=True)
        return json.loads(run.output[run.output.index("{"):])

    def set_config(self, path: str, value: str, secret: bool = False) -> None:
        self.pulumi("config", "set", "--path", *(["--secret"] if secret else []), f"spark-vllm:{path}", value,
                    check=True)

    def set_configs(self, values: dict[str, str]) -> None:
        """Plain settings (key path -> value), all in one CLI run."""
        pairs = [arg for path, value in values.items() for arg in ("--plaintext", f"spark-vllm:{path}={value}")]
        if pairs:
            self.pulumi("config", "set-all", "--path", *pairs, check=True)

    def edit_catalog(self, name: str, change) -> None:
        file = self.dir / "catalog" / name
        data = yaml.safe_load(file.read_text())
        change(data)
        file.write_text(yaml.safe_dump(data))


def _read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps(run: Run) -> list[tuple[str, str]]:
    """(op, resource name) of every step the engine finished, in order, from its event log."""
    out = []
    for event in run.events:
        step = event.get("resOutputsEvent", {}).get("metadata")
        if step:
            out.append((step["op"], step["urn"].rsplit("::", 1)[1]))
    return out


REPLACE_OPS = {"replace", "create-replacement", "delete-replaced"}


def planned(run: Run) -> dict[str, str]:
    """Resource name -> create, update, delete or replace, for every resource a run changes."""
    ops: dict[str, set[str]] = {}
    for event in run.events:
        step = event.get("resourcePreEvent", {}).get("metadata")
        if step and step["op"] not in ("same", "read", "refresh"):
            ops.setdefault(step["urn"].rsplit("::", 1)[1], set()).add(step["op"])
    return {name: "replace" if found & REPLACE_OPS else found.pop() for name, found in ops.items()}


def chat(base_url: str, model: str, api_key: str | None = None, timeout: float = 30) -> dict:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "ping"}]}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    req = urllib.request.Request(f"{base_url}/chat/completions", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
