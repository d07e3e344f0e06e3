"""docs/tests.md lists every lab scenario with its test, so that a change that drops one shows in the docs too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lab_tests() -> set[str]:
    found = set()
    for folder in ("e2e", "lab"):
        for file in sorted((ROOT / "tests" / folder).glob("test_*.py")):
            for node in ast.parse(file.read_text()).body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                    found.add(f"{folder}/{file.name}::{node.name}")
    return found


def table_tests() -> list[str]:
    section = (ROOT / "docs" / "tests.md").read_text().split("## Lab scenarios", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| [^|]+ \| `([^`]+)` \| [^|]+ \|$", section, re.M)


def test_the_table_lists_every_lab_test_once_and_nothing_else():
    listed = table_tests()
    assert len(listed) == len(set(listed)), [t for t in listed if listed.count(t) > 1]
    assert set(listed) == lab_tests(), {"not in the table": sorted(lab_tests() - set(listed)),
                                         "no such test": sorted(set(listed) - lab_tests())}


def test_the_table_is_read_whole():
    """A row that the pattern above cannot read would pass unseen: count the rows another way."""
    section = (ROOT / "docs" / "tests.md").read_text().split("## Lab scenarios", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == len(table_tests()) > 80
