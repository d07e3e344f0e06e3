"""A stack's share of a node's memory, left on the node for other stacks' preflight to add up (docs/placement.md).

On a GB10's unified memory, `gpuMemoryUtilization` is a fraction of the whole node, per vLLM, and vLLM's start-up
check fails when the fractions of the vLLMs on a node add up past what is free. So every stack leaves its fraction
on each of its nodes, as a Docker volume named for the stack and labelled with it: another stack's preflight lists
them there (components/remote/preflight_probe.py), whatever state file, machine or user deployed them. Nothing
mounts the volume; it lives as long as the stack is deployed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_command as command

STACK_LABEL = "spark-vllm.stack"
FRACTION_LABEL = "spark-vllm.gpu-memory-utilization"


def claim_name(stack: str) -> str:
    return f"spark-vllm-{stack}-memory"


@dataclass
class MemoryClaimArgs:
    stack: str
    fraction: float  # the stack's serve.gpuMemoryUtilization
    connection: command.remote.ConnectionArgs  # of this node


class MemoryClaim(pulumi.ComponentResource):
    """The claim on one node: a new fraction replaces it (the volume's name is the stack's, so the old one goes
    first); `destroy` removes it."""

    claim_id: pulumi.Output[str]

    def __init__(self, name: str, args: MemoryClaimArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:MemoryClaim", name, None, opts)
        volume = shlex.quote(claim_name(args.stack))
        labels = f"--label {shlex.quote(f'{STACK_LABEL}={args.stack}')} --label {FRACTION_LABEL}={args.fraction:g}"
        claim = command.remote.Command(
            f"{name}-volume",
            connection=args.connection,
            # `docker volume create` keeps an existing volume's labels: one a crashed run left goes first.
            create=f"docker volume rm -f {volume} >/dev/null && docker volume create {labels} {volume} >/dev/null",
            delete=f"docker volume rm -f {volume} >/dev/null",
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"], delete_before_replace=True))
        self.claim_id = claim.id
        self.register_outputs({"claimId": self.claim_id, "volume": claim_name(args.stack),
                               "fraction": args.fraction})
