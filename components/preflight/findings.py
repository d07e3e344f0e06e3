"""What a preflight check says of one node: ok, warn or fail, with a one-line reason and the fix."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from ..nodes.node_facts import NodeFacts


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    status: Status
    reason: str
    fix: str = ""


# A node and its facts: the one that others are compared with.
Reference = Optional[tuple[str, NodeFacts]]


def could_not(node: str, check: str, why: str, fix: str = "") -> Finding:
    return Finding(node, check, Status.WARN, f"could not check: {why}", fix)


def some(names: list[str]) -> str:
    """At most three names, then how many more."""
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def short(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]
