"""How every node comes to run the same image, by id: from what preflight found, which node keeps what it has,
which receives a copy of the reference's over the fabric, and which pulls from the registry (docs/artifacts.md).

The reference is the head's image when the head has it, else the first node's that has it. With `images.pull: head`
a head that lacks the image pulls it, and becomes the reference; with `all`, every node that lacks it or holds
another build pulls. Every other node that lacks it, or holds another build, receives the reference's by copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping, Optional

from ..config.spec import Deployment
from .node_facts import Image, NodeFacts


class Action(StrEnum):
    KEEP = "keep"  # it holds the reference's image
    COPY = "copy"  # it receives the reference's image from `source` over the fabric
    PULL = "pull"  # it pulls the image from its registry


@dataclass(frozen=True)
class NodeImage:
    action: Action
    source: Optional[str] = None  # COPY: the node it copies from
    wanted_id: Optional[str] = None  # the id it will hold; None: the registry's, known once pulled
    size: Optional[int] = None  # the bytes a copy moves (the reference's size)
    holds: Optional[str] = None  # the id it holds now, when another build; None: it lacks the image


@dataclass(frozen=True)
class ImagePlan:
    reference: Optional[str]  # the node whose image is the reference; None: no node has it and none pulls
    nodes: Mapping[str, NodeImage]  # every node the plan knows of (all of them once every node was read)

    def action(self, node: str) -> Action:
        return self.nodes[node].action if node in self.nodes else Action.KEEP


def _present(facts: Optional[NodeFacts]) -> Optional[Image]:
    image = facts.image if facts is not None else None
    return image if image is not None and image.present else None


def _readable(facts: NodeFacts) -> bool:
    return facts.image is not None and not facts.image.unavailable


def plan(deployment: Deployment, facts: Mapping[str, NodeFacts]) -> ImagePlan:
    """Each node's action; nodes whose image could not be read keep what they have (their row says why)."""
    cluster, pull = deployment.cluster, deployment.images.pull
    ordered = sorted(cluster.nodes, key=lambda n: not n.head)
    readable = [n for n in ordered if n.name in facts and _readable(facts[n.name])]
    head = cluster.head
    holders = [n for n in readable if _present(facts[n.name])]
    reference: Optional[str] = None
    ref_image: Optional[Image] = None
    if pull != "none" and head in readable and not _present(facts[head.name]):
        reference = head.name  # the head pulls, then is the reference
    elif holders:
        reference, ref_image = holders[0].name, _present(facts[holders[0].name])
    elif pull != "none" and head in readable:
        reference = head.name
    nodes: dict[str, NodeImage] = {}
    for node in readable:
        image = _present(facts[node.name])
        holds = image.id if image is not None else None
        wanted = ref_image.id if ref_image is not None else None
        size = ref_image.size if ref_image is not None else None
        if node.name == reference:
            nodes[node.name] = NodeImage(Action.PULL) if image is None else NodeImage(Action.KEEP, wanted_id=holds)
        elif reference is None:
            nodes[node.name] = NodeImage(Action.KEEP, wanted_id=holds)
        elif holds is not None and holds == wanted:
            nodes[node.name] = NodeImage(Action.KEEP, wanted_id=holds)
        elif pull == "all":
            nodes[node.name] = NodeImage(Action.PULL, wanted_id=wanted, holds=holds)
        else:
            nodes[node.name] = NodeImage(Action.COPY, source=reference, wanted_id=wanted, size=size, holds=holds)
    return ImagePlan(reference, nodes)
