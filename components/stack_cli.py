"""A stack as the Pulumi CLI shows it, for the scripts that run beside the program (scripts/status, scripts/logs).

Every command names the stack with `--stack`, so none of them changes which stack is selected.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from .config import gateway_config, loader, spec


def pulumi_json(*args: str, stack: str) -> Any:
    """`pulumi <args> --json` on `stack`; exits with pulumi's error when it fails."""
    done = subprocess.run(["pulumi", *args, "--json", "--stack", stack], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        if "no stack named" in done.stderr:
            raise SystemExit(f"no stack named {stack!r} in this backend: `pulumi stack ls` lists the stacks here "
                             "(for the lab's stacks, `. ~/.cache/spark-vllm/try-lab/lab.env` first)")
        raise SystemExit(f"pulumi {' '.join(args)} --stack {stack} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


@dataclass(frozen=True)
class StackConfig:
    name: str
    deployment: spec.Deployment | gateway_config.GatewaySpec
    values: Mapping[str, Any]  # every config value by its full key, secrets shown


def selected(project: Path) -> str:
    """The stack selected in `project`; exits with one sentence when none is."""
    done = subprocess.run(["pulumi", "stack", "--show-name"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"no stack is selected in {project}: name one with `--stack <name>`, or select one with "
                         "`pulumi stack select <name>` (`pulumi stack ls` lists them)")
    return done.stdout.strip()


def read(project: Path, stack: Optional[str]) -> StackConfig:
    """The named stack's config (a model stack's or a gateway's), validated as `up` validates it; the selected
    stack when `stack` is None."""
    name = stack or selected(project)
    raw = pulumi_json("config", "--show-secrets", stack=name)
    values = {key: value.get("objectValue", value.get("value")) for key, value in raw.items()}
    secret_keys = {key for key, value in raw.items() if value.get("secret")}
    return StackConfig(name, loader.load_stack(name, values, secret_keys, project), values)
