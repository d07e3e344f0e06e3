"""A readiness gate: a Python script run inside the Ray head container, again whenever what it checks changes."""

from __future__ import annotations

import pulumi
import pulumi_command as command

from .remote import docker_exec, script


def gate(name: str, parent: pulumi.Resource, connection: command.remote.ConnectionArgs, container: str,
         script_name: str, args: list[str], triggers: list, timeout_s: int) -> command.remote.Command:
    """The script bounds its own wait with `timeout_s`; the resource timeout is a backstop for a lost SSH session."""
    return command.remote.Command(
        name,
        connection=connection,
        create=docker_exec(container, ["python3", "-", *args, f"--timeout={timeout_s}"]),
        stdin=script(script_name),
        triggers=triggers,
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(parent=parent, replace_on_changes=["*"],
                                    custom_timeouts=pulumi.CustomTimeouts(create=f"{timeout_s + 120}s")))
