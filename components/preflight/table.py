"""Preflight's table: one line a finding, with the fix of every one that is not ok."""

from __future__ import annotations

from ..text import table
from .judging import Finding, Status


def render(findings: list[Finding]) -> str:
    rows = [(finding.node, finding.check, "FAIL" if finding.status is Status.FAIL else str(finding.status),
             finding.reason + (f". Fix: {finding.fix}" if finding.fix and finding.status is not Status.OK else ""))
            for finding in findings]
    return table([("node", "check", "result", ""), *rows])
