"""The model's image on every node, by id (docs/artifacts.md): a `command.remote.Command` a node that is not the
reference, which copies the reference's image to it over the fabric (components/remote/image_copy.py, run on the
reference), or pulls it from the registry (image_pull.py, run on the node); and one on the reference itself when it
may pull (`images.pull`).

Each runs only when preflight found its node short of the image (components/nodes/image_plan.py): its triggers then
say so, with the time, and the script copies or pulls. Otherwise its inputs are ignored, so a no-op preview shows no
changes, and its first run finds the image there and moves nothing.
"""

from __future__ import annotations

import base64
import shlex
import time
from dataclasses import dataclass
from typing import Mapping, Optional

import pulumi
import pulumi_command as command

from ..config.artifacts_config import registry_of
from ..config.spec import Deployment
from ..nodes.image_plan import Action, ImagePlan
from ..nodes.node_runner import hop_ssh
from ..remote import with_progress

IGNORED_WHEN_HELD = ["triggers", "create", "stdin", "connection"]


def copy_argv(deployment: Deployment, target: str, wanted: Optional[str], with_key: bool) -> list[str]:
    node = deployment.cluster.node(target)
    hop = [*hop_ssh(node, with_key), f"{node.ssh_user}@{node.fabric_ip}"]
    return ["python3", "-", deployment.serve.image, wanted or "", target, node.fabric_ip,
            str(deployment.images.stall_s), *hop]


def pull_argv(deployment: Deployment, node: str, wanted: Optional[str]) -> list[str]:
    image = deployment.serve.image
    return ["python3", "-", image, registry_of(image), deployment.images.registry_user or "", wanted or "",
            str(deployment.images.stall_s), node]


def with_secret(name: str, placeholder: str, secret: Optional[str]) -> str:
    """A script with a secret inlined as base64 (no value can end it early); a secret whenever the value is."""
    value = secret.rstrip("\n") + "\n" if placeholder == "@KEY@" and secret else secret or ""
    return with_progress(name).replace(placeholder, base64.b64encode(value.encode()).decode())


def triggers(deployment: Deployment, wanted: Optional[str], why: Optional[str], now: Optional[float] = None) -> list:
    found = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    return [f"{deployment.serve.image} as {wanted or 'the registry has it'}", *([f"{why} at {found}"] if why else [])]


@dataclass
class ImageTransferArgs:
    deployment: Deployment
    plan: ImagePlan
    connections: Mapping[str, command.remote.ConnectionArgs]  # every node's
    private_key: Optional[pulumi.Input[str]] = None  # a secret: the cluster's key, for the copy's hop
    registry_password: Optional[pulumi.Input[str]] = None  # a secret: spark-vllm:registryPassword


class ImageTransfer(pulumi.ComponentResource):
    """`ready[node]` brings the image to that node; nodes without one hold the reference's already."""

    ready: dict[str, command.remote.Command]

    def __init__(self, name: str, args: ImageTransferArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:ImageTransfer", name, None, opts)
        deployment, plan = args.deployment, args.plan
        pulls = deployment.images.pull != "none"
        copy_stdin = pulumi.Output.from_input(args.private_key).apply(
            lambda key: with_secret("image_copy.py", "@KEY@", key))
        pull_stdin = pulumi.Output.from_input(args.registry_password).apply(
            lambda password: with_secret("image_pull.py", "@PASSWORD@", password))
        self.ready = {}
        reference = plan.reference
        # The reference first: a node copies from it once it holds the image.
        order = sorted(plan.nodes, key=lambda node: node != reference)
        for node in order:
            step = plan.nodes[node]
            pulled = (node == reference and pulls) or deployment.images.pull == "all"
            if reference is None or (node == reference and not pulls):
                continue  # no node has the image (preflight fails then), or it is the one the others copy
            if pulled:
                create, stdin, connection = pull_argv(deployment, node, step.wanted_id), pull_stdin, node
            else:
                create = copy_argv(deployment, node, step.wanted_id, args.private_key is not None)
                stdin, connection = copy_stdin, reference
            why = None
            if step.action is not Action.KEEP:
                why = f"{node} holds another build ({step.holds[:19]})" if step.holds else f"{node} lacks it"
            after = self.ready.get(reference) if reference and node != reference else None
            self.ready[node] = command.remote.Command(
                f"{name}-{node}",
                connection=args.connections[connection],
                create=shlex.join(create),
                stdin=stdin,
                triggers=triggers(deployment, step.wanted_id, why),
                add_previous_output_in_env=False,
                # Bounded by its own stall timeout: pulumi-command enforces no customTimeouts.
                opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"],
                                            depends_on=[after] if after else None,
                                            ignore_changes=IGNORED_WHEN_HELD if why is None else None))
        self.register_outputs({"reference": reference, "readyIds": {n: c.id for n, c in self.ready.items()}})
