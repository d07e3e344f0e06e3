"""The fabric guard: Ray's ports answer only on the fabric and loopback of each node.

Ray binds its GCS, raylet and worker ports on 0.0.0.0 whatever --node-ip-address says, and has no auth, so
anyone on the management network could submit jobs. The guard is an iptables chain (components/remote/
fabric_guard.sh) that resets new connections to Ray's pinned ports, and to the ephemeral range where the
raylet's random ports are, arriving on any other interface.
"""

from __future__ import annotations

import hashlib
import shlex
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Optional, Sequence

import pulumi
import pulumi_command as command

from ..config.spec import ClusterSpec, NodeSpec
from ..remote import script


def chain_prefix(stack: str) -> str:
    return f"svl-{stack[:10]}-"


def guard_label(stack: str) -> str:
    """The comment on the chain's first rule: what tells a stack's chains from those of a stack whose name starts
    the same (the chain's name holds only the first 10 characters)."""
    return f"spark-vllm stack {stack}"


def chain_name(stack: str, cluster: ClusterSpec) -> str:
    """Per stack and rule set, within iptables' 28 characters: new rules go in under a new name before the old
    chain is removed, so a change of ports never leaves Ray open."""
    spec = " ".join([stack, cluster.fabric_interface, *cluster.guarded_ports])
    return chain_prefix(stack) + hashlib.sha256(spec.encode()).hexdigest()[:8]


class GuardState(Enum):
    """The guard on a node as found there."""
    IN_PLACE = "in place"  # this stack's current chain is hooked into INPUT
    STALE = "stale"  # only chains of this stack's other (older) rules are
    MISSING = "missing"  # no chain of this stack is


def guard_state(stack: str, cluster: ClusterSpec, hooked: Optional[Sequence[str]]) -> Optional[GuardState]:
    """The state from the stack's chains hooked into INPUT (fabric_guard.sh `list`); None when they are unknown."""
    if hooked is None:
        return None
    if chain_name(stack, cluster) in hooked:
        return GuardState.IN_PLACE
    return GuardState.STALE if hooked else GuardState.MISSING


def guard_command(node: NodeSpec, *args: str) -> str:
    """A shell command running the guard script as root: via `sudo -n` for another SSH user, with a plain error."""
    run = shlex.join(["sh", "-c", script("fabric_guard.sh"), "fabric-guard", *args])
    if node.ssh_user == "root":
        return run
    refusal = (f"fabric guard on {node.name}: {node.ssh_user} cannot run sudo without a password; allow it (iptables "
               "needs root) or set ray.fabricGuard: false")
    # Quoted whatever the names hold, and printed with printf: dash's echo would read backslashes in them.
    return f"if ! sudo -n true 2>/dev/null; then printf '%s\\n' {shlex.quote(refusal)} >&2; exit 4; fi; sudo -n {run}"


@dataclass
class FabricGuardArgs:
    stack: str
    cluster: ClusterSpec
    node: NodeSpec
    connection: command.remote.ConnectionArgs  # of this node
    found: Optional[GuardState]  # as preflight found it (guard_state); None: unknown


class FabricGuard(pulumi.ComponentResource):
    """The guard's chain on one node: applied before Ray starts there, removed on destroy.

    `remote.Command` cannot read the rules back, so preflight checks them. When no chain of the stack is
    hooked (a reboot flushes them), a fresh trigger re-applies the rules; rules in place leave the diff empty,
    and other rules (a config change) are replaced through the diff of the command itself.
    """

    guard_id: pulumi.Output[str]

    def __init__(self, name: str, args: FabricGuardArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:FabricGuard", name, None, opts)
        chain, ports = chain_name(args.stack, args.cluster), args.cluster.guarded_ports
        missing = args.found is GuardState.MISSING
        rules = command.remote.Command(
            f"{name}-rules",
            connection=args.connection,
            create=guard_command(args.node, "apply", chain, args.cluster.fabric_interface,
                                 guard_label(args.stack), *ports),
            delete=guard_command(args.node, "remove", chain),
            triggers=[uuid.uuid4().hex if missing else "applied"],
            add_previous_output_in_env=False,
            # Re-applying rules that vanished reuses the chain's name, so the old resource's delete must go first;
            # new rules have a new name and go in before the old chain is removed.
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"], delete_before_replace=missing,
                                        ignore_changes=[] if missing else ["triggers"]),
        )
        self.guard_id = rules.id
        self.register_outputs({"guardId": self.guard_id, "chain": chain, "ports": ports})
