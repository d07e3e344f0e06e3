"""A readiness gate: a Python script run inside a container on a node, again whenever its triggers change.

Every gate of a deployment is this component with other arguments (components/resources/gate_args.py). With Ray: the
cluster-ready gate between the Ray containers and `vllm serve`, and the serve-ready gate after it. With mp: a
rank-ready gate a node (its rank reaches the master), then the serve-ready gate on rank 0.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_command as command

from ..remote import bounded, docker_exec, script

# How long after its own deadline a gate is killed: the script's last report (ray status, the log tail) must fit.
REPORT_S = 90


@dataclass
class GateArgs:
    connection: command.remote.ConnectionArgs  # of the node whose container runs the script
    container: Optional[str]  # where the script runs, with `docker exec`; None: on the node itself (it sees Docker)
    script: str  # a file in components/remote, sent on stdin
    args: Sequence[pulumi.Input[str]]  # the script's arguments, besides --timeout
    triggers: Sequence[pulumi.Input[str]]  # a change of any re-runs the gate
    timeout_s: int  # how long the script waits for readiness
    after: Sequence[pulumi.Resource] = ()  # what must succeed before this gate runs
    # Python put before the script on its stdin: a secret the script needs (a key) stays out of its command line.
    preamble: Optional[pulumi.Input[str]] = None


class Gate(pulumi.ComponentResource):
    """Succeeds once the script finds what it waits for; fails, bounded, with its diagnosis.

    The script bounds its own wait with `timeout_s`; `timeout` on the node bounds the rest (SSH, docker exec):
    pulumi-command enforces no timeout of its own.
    """

    ready_id: pulumi.Output[str]
    output: pulumi.Output[str]  # what the script printed, kept in the state until it runs again

    def __init__(self, name: str, args: GateArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:Gate", name, None, opts)
        def create(values: list[str]) -> str:
            argv = ["python3", "-", *values, f"--timeout={args.timeout_s}"]
            return bounded(docker_exec(args.container, argv) if args.container else shlex.join(argv),
                           args.timeout_s + REPORT_S)

        text = script(args.script)
        check = command.remote.Command(
            f"{name}-gate",
            connection=args.connection,
            create=pulumi.Output.all(*args.args).apply(create),
            stdin=pulumi.Output.from_input(args.preamble).apply(lambda p: p + text) if args.preamble else text,
            triggers=list(args.triggers),
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"], depends_on=list(args.after)))
        self.ready_id, self.output = check.id, check.stdout
        self.register_outputs({"readyId": self.ready_id})
