"""The life token's label, which every container of a deployment carries (components/preflight/liveness.py)."""

from __future__ import annotations

from typing import Optional

import pulumi_docker as docker

LIFE_LABEL = "spark-vllm.life"  # components/remote/preflight_probe.py reads it by this name


def life_labels(life: Optional[str]) -> list[docker.ContainerLabelArgs]:
    """The container's life token, when it has one: a new token replaces the container."""
    return [docker.ContainerLabelArgs(label=LIFE_LABEL, value=life)] if life else []
