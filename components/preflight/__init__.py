"""Preflight: what can be checked on the nodes, checked before any resource is registered.

`run()` probes every node at once over SSH (probing.py, with components/remote/preflight_probe.py, which only
gathers facts), judges the facts of all nodes together (judging.py) into one table (table.py): node x check -> ok,
warn or fail, with a one-line reason and the fix. Warnings are printed and the program goes on; any failure stops
it with the whole table, before anything is created, replaced or deleted. It registers no resource, so a no-op
preview still has no changes. `run()` returns every node's facts: the fabric guard reads what preflight found of
it, and with `preflight.syncWeights` components/resources/weights_sync.py reads the weights manifests in them.
It returns what of the deployment lives too (liveness.py): the life tokens that recreate what died; and the plans of
the artifacts (docs/artifacts.md): which node copies or pulls the image, and what the Hub download fetches, for which
the Hub is asked only when the node that downloads has no record of the revision (components/nodes/hub_plan.py).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Optional

import pulumi

from ..config.spec import Deployment, NodeSpec
from ..nodes import hub_client, hub_plan, image_plan
from ..nodes.hub_plan import HubPlan
from ..nodes.image_plan import ImagePlan
from ..nodes.node_facts import NodeFacts
from ..resources.fabric_guard import GuardState, guard_state
from .findings import Status
from .judging import evaluate
from .liveness import Lives, judge
from .probing import probe
from .table import render


@dataclass(frozen=True)
class Checked:
    facts: dict[str, NodeFacts] = field(default_factory=dict)  # by node name; {} when preflight is off
    lives: Lives = Lives()  # nothing known when preflight is off
    images: ImagePlan = ImagePlan(None, {})  # nothing to copy or pull when preflight is off
    hub: Optional[HubPlan] = None  # the Hub download's, with serve.hub


def run(deployment: Deployment, hf_token: Optional[str] = None) -> Checked:
    """Probes, judges and reports; raises pulumi.RunError (no traceback) with the table if any check failed.

    Returns each node's facts, for the resources whose diff depends on them, the deployment's lives, and the
    artifacts' plans. `hf_token` is the stack's hfToken, for the Hub's one question.
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
    hub = hub_plan.plan(deployment, facts, hub_client.ask, hf_token)
    images = image_plan.plan(deployment, {name: f for name, f in facts.items() if f.reachable})
    findings = evaluate(deployment, facts, lives, hub, images)
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
    return Checked(facts, lives, images, hub)


def guard_found(deployment: Deployment, facts: Mapping[str, NodeFacts], node: NodeSpec) -> Optional[GuardState]:
    """The fabric guard on `node` as preflight found it; None when it was not checked."""
    guard = facts[node.name].guard if node.name in facts else None
    hooked = guard.hooked if guard is not None and not guard.unavailable else None
    return guard_state(deployment.stack, deployment.cluster, hooked)


def image_found(checked: Checked, node: NodeSpec) -> Optional[str]:
    """The id of the deployment's image on `node` once its image arrived: what it holds, or the reference's that a
    copy brings; None when unknown (not checked, or pulled from the registry)."""
    step = checked.images.nodes.get(node.name)
    return step.wanted_id if step is not None else None


def nccl_mounts(deployment: Deployment, checked: Checked) -> dict[str, tuple[str, str]]:
    """With nccl.hostLibrary: each node's (host libnccl.so.2, the image's pip one it covers), as preflight found them
    (its check refused a node without either); {} without the setting."""
    if not deployment.host_nccl:
        return {}
    inside = [f.image.inside.nccl for f in checked.facts.values()
              if f.image is not None and f.image.inside is not None and f.image.inside.nccl is not None]
    target = inside[0].path  # one image, one path: a node that gets a copy gets the same files
    return {name: (f.nccl.real, target) for name, f in checked.facts.items() if f.nccl is not None}
