"""Preflight: what can be checked on the nodes, checked before any resource is registered.

`run()` probes every node at once over SSH (probing.py, with components/remote/preflight_probe.py, which only
gathers facts), judges the facts of all nodes together (judging.py) into one table (table.py): node x check -> ok,
warn or fail, with a one-line reason and the fix. Warnings are printed and the program goes on; any failure stops
it with the whole table, before anything is created, replaced or deleted. It registers no resource, so a no-op
preview still has no changes. `run()` returns every node's facts: the fabric guard reads what preflight found of
it, and with `preflight.syncWeights` components/weights_sync.py reads the weights manifests in them.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Optional

import pulumi

from ..spec import Deployment, NodeSpec
from ..fabric_guard import GuardState, guard_state
from ..node_facts import NodeFacts
from .judging import Status, evaluate
from .probing import probe
from .table import render


def run(deployment: Deployment) -> dict[str, NodeFacts]:
    """Probes, judges and reports; raises pulumi.RunError (no traceback) with the table if any check failed.

    Returns each node's facts by node name ({} when preflight is off), for the resources whose diff depends on
    them.
    """
    if not deployment.preflight.enabled:
        pulumi.log.info("preflight is off (spark-vllm:preflight.enabled is false): the nodes were not checked")
        return {}
    start = time.monotonic()
    nodes = deployment.cluster.nodes
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        facts = dict(zip([n.name for n in nodes], pool.map(lambda n: probe(deployment, n), nodes)))
    findings = evaluate(deployment, facts)
    table = render(findings)
    failed = [finding for finding in findings if finding.status is Status.FAIL]
    warned = [finding for finding in findings if finding.status is Status.WARN]
    summary = (f"preflight of {len(facts)} nodes took {time.monotonic() - start:.1f} s: "
               f"{len(failed)} failed, {len(warned)} warnings")
    if failed:
        raise pulumi.RunError(f"{summary}; nothing was deployed or changed.\n{table}")
    (pulumi.log.warn if warned else pulumi.log.info)(f"{summary}\n{table}")
    return facts


def guard_found(deployment: Deployment, facts: Mapping[str, NodeFacts], node: NodeSpec) -> Optional[GuardState]:
    """The fabric guard on `node` as preflight found it; None when it was not checked."""
    guard = facts[node.name].guard if node.name in facts else None
    hooked = guard.hooked if guard is not None and not guard.unavailable else None
    return guard_state(deployment.stack, deployment.cluster, hooked)
