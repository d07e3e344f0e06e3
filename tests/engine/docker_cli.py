"""The host's docker CLI, used by tests to look behind the double's back."""

import json
import subprocess

TEST_PREFIX = "svl-dd-test-"  # every container a test creates is named with this prefix


def inspect(kind: str, name: str) -> dict | None:
    """`kind` is "container" or "image"; None when docker has no such object."""
    out = subprocess.run(["docker", kind, "inspect", name], capture_output=True, text=True)
    return json.loads(out.stdout)[0] if out.returncode == 0 else None


def remove_test_containers() -> None:
    ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^{TEST_PREFIX}"], capture_output=True,
                         text=True).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
