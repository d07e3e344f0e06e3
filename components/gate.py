"""A readiness gate: a Python script run inside the Ray head container, again whenever what it checks changes."""

from __future__ import annotations

import shlex
from typing import Optional

import pulumi
import pulumi_command as command

from .remote import bounded, docker_exec, script

# How long after its own deadline a gate is killed: the script's last report (ray status, the log tail) must fit.
REPORT_S = 90


def gate(name: str, parent: pulumi.Resource, connection: command.remote.ConnectionArgs, container: Optional[str],
         script_name: str, args: list[str], triggers: list, timeout_s: int) -> command.remote.Command:
    """The script bounds its own wait with `timeout_s`; `timeout` on the node bounds the rest (SSH, docker exec).
    It runs inside `container`, or on the node itself when that is None (it then sees the node's Docker)."""
    argv = ["python3", "-", *args, f"--timeout={timeout_s}"]
    return command.remote.Command(
        name,
        connection=connection,
        create=bounded(docker_exec(container, argv) if container else shlex.join(argv), timeout_s + REPORT_S),
        stdin=script(script_name),
        triggers=triggers,
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(parent=parent, replace_on_changes=["*"]))
