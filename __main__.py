"""spark-vllm: wires the validated stack config to the components; the components hold the logic."""

from pathlib import Path

from components.config import pulumi_config
from components.config.gateway_config import GatewaySpec
from components.stacks import gateway, model

deployment = pulumi_config.from_pulumi(Path(__file__).parent)
if isinstance(deployment, GatewaySpec):
    gateway.wire(deployment)
else:
    model.wire(deployment)
