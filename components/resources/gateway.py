"""The gateway: LiteLLM's proxy in a container on one node, routing by model name to model stacks (docs/gateway.md).

Each model stack is read through a `pulumi.StackReference`: its served name, its head's fabric IP and its API port
make the route, and its `apiKey` output (a secret) the route's key. A stack with no `baseUrl` (never deployed, or
destroyed) has no route. The routes are a label of the container, so `preview` shows which change; LiteLLM does not
read its config again, so a route change replaces the container, and the readiness gate then waits for every route
to answer a completion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pulumi
import pulumi_docker as docker
import yaml

from ..config.gateway_config import GatewaySpec
from .gate import Gate, GateArgs
from .spark_node import SparkNode

ROUTES_LABEL = "spark-vllm.routes"
CONFIG_ENV = "SVL_GATEWAY_CONFIG"
KEY_ENV = "SVL_ROUTE_KEY_{}"  # a route's backend key, which LiteLLM reads as os.environ/<name>
# The config arrives in the environment (it holds no key: those are os.environ/ references), so no file is copied to
# the node; the shell only writes it out, and no value is ever part of the shell string.
START = ('printf "%s" "$SVL_GATEWAY_CONFIG" > /tmp/spark-vllm-gateway.yaml && '
         'exec litellm --config /tmp/spark-vllm-gateway.yaml --host 0.0.0.0 --port "$SVL_GATEWAY_PORT"')


def container_name(stack: str) -> str:
    return f"spark-vllm-{stack}-gateway"


@dataclass(frozen=True)
class Route:
    model: str  # the served name, which clients ask for
    api_base: str
    stack: str
    keyed: bool  # whether the model stack has an API key


def route(stack: str, outputs: dict[str, Any]) -> Optional[Route]:
    """A model stack's route from its outputs; None while it serves nothing (no `baseUrl`)."""
    if not outputs.get("baseUrl") or not outputs.get("servedModel"):
        return None
    head = outputs["nodes"][0]
    port = int(outputs["ports"]["api.port"])  # another stack's numbers arrive as floats (a protobuf Struct)
    return Route(outputs["servedModel"], f"http://{outputs['fabricIps'][head]}:{port}/v1",
                 stack, bool(outputs.get("hasApiKey")))


def litellm_config(routes: Sequence[Route]) -> str:
    """LiteLLM's config: one entry per route, keys by environment reference, and no retry (a dead model's request
    fails at once, for that model alone)."""
    model_list = []
    for i, r in enumerate(routes):
        params = {"model": f"hosted_vllm/{r.model}", "api_base": r.api_base}
        if r.keyed:
            params["api_key"] = f"os.environ/{KEY_ENV.format(i)}"
        model_list.append({"model_name": r.model, "litellm_params": params})
    return yaml.safe_dump({
        "model_list": model_list,
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "router_settings": {"num_retries": 0},
        "litellm_settings": {"num_retries": 0},
    }, sort_keys=False)


def gateway_env(port: int, routes: Sequence[Route], master_key: str, api_keys: dict[str, Any]) -> list[str]:
    """The router's environment: its config, its port, the clients' key and each keyed route's backend key."""
    return [f"{CONFIG_ENV}={litellm_config(routes)}", f"SVL_GATEWAY_PORT={port}",
            # The proxy's only outbound call, the model cost map, is read from the package instead.
            "LITELLM_LOCAL_MODEL_COST_MAP=True",
            f"LITELLM_MASTER_KEY={master_key}",
            *(f"{KEY_ENV.format(i)}={api_keys[r.stack]}" for i, r in enumerate(routes) if r.keyed)]


@dataclass
class GatewayArgs:
    spec: GatewaySpec
    spark: SparkNode
    gateway_key: pulumi.Input[str]  # a secret


class Gateway(pulumi.ComponentResource):
    """The router's container and its readiness gate; `routes` maps each routed model to its API base."""

    routes: pulumi.Output[dict[str, str]]
    ready_id: pulumi.Output[str]

    def __init__(self, name: str, args: GatewayArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:Gateway", name, None, opts)
        spec, child = args.spec, pulumi.ResourceOptions(parent=self)
        org, project = pulumi.get_organization() or "organization", pulumi.get_project()
        refs = {stack: pulumi.StackReference(f"{name}-{stack.replace('/', '-')}",
                                             stack_name=stack if "/" in stack else f"{org}/{project}/{stack}",
                                             opts=child)
                for stack in spec.models}
        plain = ("baseUrl", "servedModel", "nodes", "fabricIps", "ports")

        def read(stack: str, ref: pulumi.StackReference) -> pulumi.Output[dict[str, Any]]:
            values = [ref.get_output(k) for k in plain]
            has_key = ref.get_output("apiKey").apply(lambda k: k is not None)
            return pulumi.Output.all(*values, pulumi.Output.unsecret(has_key)).apply(
                lambda v: {**dict(zip(plain, v)), "hasApiKey": v[-1]})

        found = pulumi.Output.all(*(read(s, r) for s, r in refs.items())).apply(
            lambda outs: [r for s, o in zip(refs, outs) if (r := route(s, o)) is not None])
        # The routes in plain text (no key is in them): the label and the output show each change in `preview`.
        routes_json = found.apply(lambda rs: json.dumps({r.model: r.api_base for r in rs}, sort_keys=True))
        # The model stacks' keys, secrets, and the gateway's own: the environment (and so the state) holds them as
        # secrets; no key is in the config text or the command.
        api_keys = pulumi.Output.all(*(ref.get_output("apiKey") for ref in refs.values()))
        envs = pulumi.Output.all(found, pulumi.Output.secret(args.gateway_key), api_keys).apply(
            lambda v: gateway_env(spec.port, v[0], v[1], dict(zip(refs, v[2]))))
        self.container_name = container_name(spec.stack)
        container = docker.Container(
            f"{name}-container",
            name=self.container_name,
            image=args.spark.image_id,
            entrypoints=["sh", "-c"],
            command=[START],
            envs=envs,
            labels=[docker.ContainerLabelArgs(label="spark-vllm.stack", value=spec.stack),
                    docker.ContainerLabelArgs(label=ROUTES_LABEL, value=routes_json)],
            network_mode="host",
            # A crashed router, or a rebooted node, gets it back without a `pulumi up`.
            restart="unless-stopped",
            opts=pulumi.ResourceOptions(parent=self, provider=args.spark.provider, delete_before_replace=True,
                                        replace_on_changes=["*"]))
        ready = Gate(f"{name}-ready", GateArgs(
            connection=args.spark.connection, container=self.container_name, script="gateway_ready.py",
            args=[f"--port={spec.port}", f"--container={self.container_name}"],
            triggers=[container.id], timeout_s=spec.ready_timeout_s), opts=child)
        self.routes = routes_json.apply(json.loads)
        self.ready_id = ready.ready_id
        self.register_outputs({"routes": self.routes, "containerId": container.id})
