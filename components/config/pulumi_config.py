"""The stack's config as the Pulumi engine hands it to the program, through Pulumi's semi-private
`pulumi.runtime.config`: the only way to read every `spark-vllm:*` key at once, and which of them are secret.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .gateway_config import GatewaySpec
from .loader import load_stack
from .spec import NAMESPACE, Deployment


def from_pulumi(project_dir: Path) -> Deployment | GatewaySpec:
    """`load_stack()` with this stack's config, as the Pulumi engine handed it to the program."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    raw = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    values = {key: decode(value) for key, value in raw.items()}
    secret_keys = {key for key in raw if runtime_config.is_config_secret(key)}
    return load_stack(pulumi.get_stack(), values, secret_keys, project_dir)


def secret_value(key: str) -> str | None:
    """A secret's plain value, for what the program itself sends (preflight's question to the Hub); resources get
    secrets as secret outputs (`pulumi.Config.require_secret`)."""
    from pulumi.runtime import config as runtime_config

    return runtime_config.get_config(f"{NAMESPACE}:{key}")


def decode(value: Any) -> Any:
    # Structured config (objects, lists) reaches the program as JSON text; plain values stay strings.
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
