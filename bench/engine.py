"""spark-vllm through the real Pulumi CLI (tests/e2e's LabStack), timed, and the engine's floor: an empty
program on the same backend. Per-step times come from the engine's event log, stamped on arrival."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import timing
from labkit.config import INNER_IMAGE
from labstack import ENGINE_PATH, LabStack

ROOT = Path(__file__).resolve().parents[1]



def engine_env() -> dict[str, str]:
    """The provider plugins (the doubles, or the real builds the e2e variables name) and the Pulumi CLI on PATH."""
    cli = subprocess.run([str(ROOT / "scripts" / "install-pulumi")], check=True, text=True,
                         stdout=subprocess.PIPE).stdout.strip()
    return {"PATH": os.pathsep.join([*ENGINE_PATH, cli, os.environ["PATH"]])}


SKIPPED_TYPES = ("pulumi:pulumi:Stack", "spark-vllm:index:")  # the stack and components: no work of their own


class Timer:
    """Runs `pulumi <verb>` for a LabStack with an event log, as LabStack.pulumi does, but timed here."""

    def __init__(self, stack: LabStack):
        self.stack, self.runs = stack, 0

    def __call__(self, *args: str, check: bool = True) -> timing.Timed:
        self.runs += 1
        events = self.stack.events_dir / f"bench-{self.runs:03d}.jsonl"
        cmd = self.stack.command(*args, events=events)
        if args[0] in ("up", "destroy"):
            cmd.append("--yes")
        done = timing.run(cmd, self.stack.dir, self.stack.env, events)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.output[-4000:]}")
        return done


class Program:
    """A small Python program, hosted as spark-vllm's is (scripts/pulumi, the same venv), on the same kind of
    backend: the floors spark-vllm's own figures are measured against."""

    def __init__(self, workdir: Path, name: str, source: str, env: dict[str, str]):
        self.dir = workdir / name
        self.dir.mkdir()
        (self.dir / "Pulumi.yaml").write_text(
            f"name: bench-{name}\nruntime:\n  name: python\n  options:\n    toolchain: pip\n    virtualenv: .venv\n")
        (self.dir / "__main__.py").write_text(source)
        (self.dir / ".venv").symlink_to(ROOT / ".venv")
        self.name, self.env, self.runs, self.deployed = name, env, 0, False
        self._pulumi("stack", "init")

    def _pulumi(self, *args: str) -> timing.Timed:
        self.runs += 1
        events = self.dir / f"events-{self.runs:03d}.jsonl"
        extra = ["--event-log", str(events)] if args[0] == "preview" else []
        extra += ["--yes", "--skip-preview"] if args[0] in ("up", "destroy") else []
        done = timing.run([str(ROOT / "scripts" / "pulumi"), *args, *extra, "--non-interactive", "--stack", "bench"],
                          self.dir, self.env, events if args[0] == "preview" else None)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} program: pulumi {' '.join(args)} failed:\n{done.output[-4000:]}")
        return done

    def preview(self) -> timing.Timed:
        """Deployed, a no-op preview (it fails on any change); never deployed, the plan of its stack alone."""
        return self._pulumi("preview", *(["--expect-no-changes"] if self.deployed else []))

    def up(self) -> timing.Timed:
        done = self._pulumi("up")
        self.deployed = True
        return done

    def destroy(self) -> timing.Timed:
        done = self._pulumi("destroy")
        self.deployed = False
        return done


EMPTY = "import pulumi  # noqa: F401  (the SDK's start-up, nothing else)\n"

# The lab's head node over SSH, as spark-vllm reaches it: a Docker provider and a remote command's connection.
_NODE1 = """import os
import pulumi
import pulumi_command as command
import pulumi_docker as docker

lab = os.path.expanduser("~/.cache/spark-vllm/lab")
ssh = ["-o", "IdentitiesOnly=yes", "-i", f"{lab}/id_ed25519", "-o", f"UserKnownHostsFile={lab}/known_hosts"]
connection = command.remote.ConnectionArgs(host="172.29.87.11", user="root",
                                           private_key=pulumi.Output.secret(open(f"{lab}/id_ed25519").read()))
"""

# Both provider plugins, each with one resource on the head node: the lab's image, kept on the node, and a remote
# command. A no-op preview of it, deployed, is what the plugins themselves cost.
PROVIDERS = _NODE1 + f"""
node = docker.Provider("node1", host="ssh://root@172.29.87.11", ssh_opts=ssh)
docker.RemoteImage("floor", name="{INNER_IMAGE}", keep_locally=True, opts=pulumi.ResourceOptions(provider=node))
command.remote.Command("floor", create="true", connection=connection)
"""


def resources(count: int) -> str:
    """A program of `count` remote commands that do nothing: the engine's own cost a resource, with the plugin's
    check and diff that every custom resource has."""
    return _NODE1 + (f"for i in range({count}):\n"
                     "    command.remote.Command(f'r{i}', create='true', connection=connection)\n")


def steps(done: timing.Timed) -> list[dict]:
    """One row per resource step: name, type, op, start and end in seconds since the command started."""
    open_steps: dict[tuple[str, str], float] = {}
    rows = []
    for at, event in done.events:
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            meta = event.get(kind, {}).get("metadata")
            if not meta or meta["type"].startswith(SKIPPED_TYPES) or meta["op"] == "same":
                continue
            key = (meta["urn"], meta["op"])
            if kind == "resourcePreEvent":
                open_steps[key] = at
            elif key in open_steps:
                rows.append({"name": meta["urn"].rsplit("::", 1)[1], "type": meta["type"], "op": meta["op"],
                             "start_s": round(open_steps.pop(key), 3), "end_s": round(at, 3)})
    return sorted(rows, key=lambda r: r["start_s"])


def first_step_s(done: timing.Timed) -> float | None:
    """When the engine began its first resource step: CLI, language host, program and preflight before it."""
    return next((at for at, e in done.events if "resourcePreEvent" in e
                 and not e["resourcePreEvent"]["metadata"]["type"].startswith(SKIPPED_TYPES)), None)
