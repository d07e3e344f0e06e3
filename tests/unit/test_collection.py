"""A Python developer's habit: a plain `pytest --collect-only` at the checkout's root collects every test, with no
error (two test files of one basename in different folders stop it with "import file mismatch")."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

from harness import ROOT


def test_plain_pytest_collects_every_test_without_an_error():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ tests collected in [\d.]+s", summary), summary  # "..., 2 errors in" otherwise
    collected = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert {str(p.relative_to(ROOT)) for p in ROOT.glob("tests/**/test_*.py")} <= collected


def test_no_two_test_files_share_a_basename():
    names = Counter(p.name for p in ROOT.glob("tests/**/test_*.py"))
    assert [name for name, n in names.items() if n > 1] == []
