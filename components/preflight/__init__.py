"""Preflight: what can be checked on the nodes, checked before any resource is registered.

`run()` probes every node at once over SSH (probing.py, with components/remote/preflight_probe.py, which only
gathers facts), judges the facts of all nodes together (judging.py) into one table (table.py): node x check -> ok,
warn or fail, with a one-line reason and the fix. Warnings are printed and the program goes on; any failure stops
it with the whole table, before anything is created, replaced or deleted. It registers no resource, so a no-op
preview still has no changes. `run()` returns every node's facts: the fabric guard reads what preflight found of
it, and with `preflight.syncWeights` components/resources/weights_sync.py reads the weights manifests in them.
It returns what of the deployment lives too (liveness.py): the life tokens that recreate what died.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Optional

import pulumi

from ..config.spec import Deployment, NodeSpec
from ..resources.fabric_guard import GuardState, guard_state
from .liveness import Lives, judge
from ..nodes.node_facts import NodeFacts
from .judging import Status, evaluate
from .probing import probe
from .table import render


@dataclass(frozen=True)
class Checked:
    facts: dict[str, NodeFacts] = field(default_factory=dict)  # by node name; {} when preflight is off
    lives: Lives = Lives()  # nothing known when preflight is off


def run(deployment: Deployment) -> Checked:
    """Probes, judges and reports; raises pulumi.RunError (no traceback) with the table if any check failed.

    Returns each node's facts, for the resources whose diff depends on them, and the deployment's lives.
    """
    if not deployment.preflight.enabled:
        pulumi.log.info("preflight is off (spark-vllm:preflight.enabled is false): the nodes were not checked, "
                        "what died since the last up is not seen (`pulumi up --refresh` sees the containers), and the "
                        "containers that carry a life token are replaced (docs/design.md)")
        return Checked()
    start = time.monotonic()
    nodes = deployment.cluster.nodes
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        facts = dict(zip([n.name for n in nodes], pool.map(lambda n: probe(deployment, n), nodes)))
    lives = judge(deployment, facts)
    findings = evaluate(deployment, facts, lives)
    table = render(findings)
    failed = [finding for finding in findings if finding.status is Status.FAIL]
    warned = [finding for finding in findings if finding.status is Status.WARN]
    summary = (f"preflight of {len(facts)} nodes took {time.monotonic() - start:.1f} s: "
               f"{len(failed)} failed, {len(warned)} warnings")
    dead = [f"{node}: {line}" for node, lines in lives.dead.items() for line in lines]
    if failed:
        raise pulumi.RunError(f"{summary}; nothing was deployed or changed.\n{table}")
    if dead:
        summary += ". Dead since the last up, so recreated by this one:\n  " + "\n  ".join(dead)
    (pulumi.log.warn if warned else pulumi.log.info)(f"{summary}\n{table}")
    return Checked(facts, lives)


def guard_found(deployment: Deployment, facts: Mapping[str, NodeFacts], node: NodeSpec) -> Optional[GuardState]:
    """The fabric guard on `node` as preflight found it; None when it was not checked."""
    guard = facts[node.name].guard if node.name in facts else None
    hooked = guard.hooked if guard is not None and not guard.unavailable else None
    return guard_state(deployment.stack, deployment.cluster, hooked)


def image_found(facts: Mapping[str, NodeFacts], node: NodeSpec) -> Optional[str]:
    """The id of the deployment's image on `node` as preflight found it; None when it was not checked."""
    image = facts[node.name].image if node.name in facts else None
    return image.id if image is not None and image.present else None
