"""Preflight's table: one line a finding, with the fix of every one that is not ok."""

from __future__ import annotations

from ..text import table
from .judging import Finding, Status


def render(findings: list[Finding]) -> str:
    rows = [(f.node, f.check, "FAIL" if f.status is Status.FAIL else str(f.status),
             f.reason + (f". Fix: {f.fix}" if f.fix and f.status is not Status.OK else "")) for f in findings]
    return table([("node", "check", "result", ""), *rows])
