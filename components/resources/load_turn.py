"""The load turn: before a stack's vLLM starts, each of its nodes' turn is taken (components/remote/load_turn.py),
so that two stacks never load on one node at the same time (docs/placement.md).

One command a node, replaced (so run again) whenever what starts a new load changes, like the page-cache drops.
Where another stack is deployed on one of the nodes (its memory claim is there, components/resources/memory_claim.py),
the turns are taken in node-name order, each after the one before: two stacks that share two nodes cannot each hold
one and wait for the other. Where none is, no other stack can hold a turn, and the nodes' turns are taken all at once:
in a row, they cost a stack with eight nodes eight round trips before its vLLM starts.
"""

from __future__ import annotations

import shlex
from typing import Mapping, Sequence

import pulumi
import pulumi_command as command

from ..config.spec import ClusterSpec
from ..nodes.node_facts import NodeFacts
from ..remote import bounded, script
from .spark_node import SparkNode

TURN = "spark-vllm-load-turn"


def give_back(stack: str) -> str:
    """The turn removed if this stack holds it: on delete, so that a destroyed stack leaves no turn behind. A
    removal already under way elsewhere reaches the same end."""
    owner = shlex.quote('{{index .Config.Labels "spark-vllm.load-turn-stack"}}')
    return (f"if [ \"$(docker inspect -f {owner} {TURN} 2>/dev/null)\" = {shlex.quote(stack)} ]; then "
            f"docker rm -f {TURN} >/dev/null 2>&1 || true; fi")


def shared(stack: str, facts: Mapping[str, NodeFacts]) -> bool:
    """Whether the turns must be taken in order: another stack's memory claim is on one of the nodes, or what the
    nodes hold is unknown (preflight off, or a node it could not read)."""
    for found in facts.values():
        claims = found.claims
        if claims is None or claims.unavailable or any(other != stack for other in claims.by_stack):
            return True
    return not facts


def load_turns(name: str, parent: pulumi.Resource | None, stack: str, cluster: ClusterSpec,
               sparks: Mapping[str, SparkNode], triggers: list, seconds: int,
               after: Sequence[pulumi.Resource] = (), ordered: bool = True) -> list[command.remote.Command]:
    """`seconds` (the serve gate's bound) is how long this stack holds a turn at most, and waits for another's;
    `ordered`: each turn after the one before (see `shared`), else all at once."""
    host = cluster.head.fabric_ip if cluster.api_bind == "0.0.0.0" else cluster.api_bind
    health = f"http://{host}:{cluster.api_port}/health"
    turns: list[command.remote.Command] = []
    for node in sorted(cluster.nodes, key=lambda n: n.name):
        spark = sparks[node.name]
        take = bounded(shlex.join(["python3", "-", "take", f"--stack={stack}", f"--node={node.name}",
                                   f"--health={health}", f"--hold={seconds}", f"--wait={seconds}"]), seconds + 30)
        turns.append(command.remote.Command(
            f"{name}-load-turn-{node.name}",
            connection=spark.connection,
            create=take,
            stdin=script("load_turn.py"),
            delete=give_back(stack),
            triggers=triggers,
            add_previous_output_in_env=False,
            # The old turn is given back before the new one is taken: given back after, it would end the new one.
            opts=pulumi.ResourceOptions(parent=parent, replace_on_changes=["*"], delete_before_replace=True,
                                        depends_on=[turns[-1]] if turns and ordered else list(after))))
    return turns
