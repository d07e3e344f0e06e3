"""The gateway: HAProxy in a container on one node, routing by model name to model stacks (docs/gateway.md).

Each model stack is read through a `pulumi.StackReference`: its served name, its head's fabric IP and its API port
make the route, and its `apiKey` output (a secret) the key the route sends. A stack with no `baseUrl` (never deployed,
or destroyed) has no route. The router's config (components/resources/router_config.py) lives in a Docker volume of
its own: a route change rewrites it and reloads the router in place, whose new process takes over the listening
socket while the old one finishes its streams, so no request is dropped. The container itself changes only with its
image or port.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from ..config.gateway_config import GatewaySpec
from ..remote import bounded
from .gate import Gate, GateArgs
from .labels import life_labels
from .router_config import CONFIG_PATH, Backend, RouterConfig, render
from .spark_node import SparkNode

CONFIG_DIR = CONFIG_PATH.rsplit("/", 1)[0]
WRITE_S = 120  # bound on writing, checking and loading the config


def container_name(stack: str) -> str:
    return f"spark-vllm-{stack}-gateway"


def volume_name(stack: str) -> str:
    return f"spark-vllm-{stack}-gateway-config"


@dataclass(frozen=True)
class Route:
    model: str  # the served name, which clients ask for
    host: str  # the model stack's head, on the fabric
    port: int
    stack: str
    keyed: bool  # whether the model stack has an API key

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def route(stack: str, outputs: dict[str, Any]) -> Optional[Route]:
    """A model stack's route from its outputs; None while it serves nothing (no `baseUrl`)."""
    if not outputs.get("baseUrl") or not outputs.get("servedModel"):
        return None
    head = outputs["nodes"][0]
    port = int(outputs["ports"]["api.port"])  # another stack's numbers arrive as floats (a protobuf Struct)
    return Route(outputs["servedModel"], outputs["fabricIps"][head], port, stack, bool(outputs.get("hasApiKey")))


def router_config(port: int, routes: Sequence[Route], gateway_key: str, api_keys: dict[str, Any]) -> RouterConfig:
    return render(port, gateway_key, [Backend(r.model, r.host, r.port, r.stack, api_keys[r.stack] if r.keyed else None)
                                      for r in routes])


def write_config(volume: str, image: str, router: str) -> str:
    """Writes the config from stdin into the volume, checked by the router's own binary first, then reloads the
    router if it runs (a stopped or new one reads it when it starts). A config HAProxy refuses changes nothing."""
    check = (f"umask 077 && cat > {CONFIG_PATH}.next && haproxy -c -q -f {CONFIG_PATH}.next "
             f"&& mv {CONFIG_PATH}.next {CONFIG_PATH}")
    write = shlex.join(["docker", "run", "--rm", "-i", "--network", "none", "--entrypoint", "sh",
                        "-v", f"{volume}:{CONFIG_DIR}", image, "-c", check])
    running = f"[ \"$(docker inspect -f '{{{{.State.Running}}}}' {router} 2>/dev/null)\" = true ]"
    return f"{bounded(write, WRITE_S)} && if {running}; then docker kill -s USR2 {router} >/dev/null; fi"


@dataclass
class GatewayArgs:
    spec: GatewaySpec
    spark: SparkNode
    gateway_key: pulumi.Input[str]  # a secret
    life: Optional[str] = None  # the router's life token (components/preflight/gateway.py): a new one recreates it


class Gateway(pulumi.ComponentResource):
    """The router's container and its readiness gate; `routes` maps each routed model to its API base."""

    routes: pulumi.Output[dict[str, str]]
    ready_id: pulumi.Output[str]
    config: pulumi.Output[str]  # the digest of the router's config

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
        # The routes in plain text (no key is in them): the output shows each change in `preview`.
        routes_json = found.apply(lambda rs: json.dumps({r.model: r.api_base for r in rs}, sort_keys=True))
        # The model stacks' keys and the gateway's own are in the config, which is a secret in the state and reaches
        # the node on stdin: no key is in a command line.
        api_keys = pulumi.Output.all(*(ref.get_output("apiKey") for ref in refs.values()))
        config = pulumi.Output.all(found, pulumi.Output.secret(args.gateway_key), api_keys).apply(
            lambda v: router_config(spec.port, v[0], v[1], dict(zip(refs, v[2]))))
        text: pulumi.Output[str] = pulumi.Output.secret(config.apply(lambda c: c.text))
        served = pulumi.Output.unsecret(config.apply(lambda c: c.digest))  # a hash: it tells nothing of a key
        self.container_name = container_name(spec.stack)
        volume = volume_name(spec.stack)  # Docker makes it with the first `docker run` that names it
        # A route change updates this in place: it rewrites the config and reloads the running router. Its delete
        # comes after the container's, which depends on it, and takes the keys with the volume.
        routes = command.remote.Command(
            f"{name}-routes",
            connection=args.spark.connection,
            create=args.spark.image_id.apply(lambda image: write_config(volume, image, self.container_name)),
            delete=f"docker volume rm -f {volume} >/dev/null",
            stdin=text,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["create"]))
        container = docker.Container(
            f"{name}-container",
            name=self.container_name,
            image=args.spark.image_id,
            entrypoints=["haproxy"],
            command=["-W", "-db", "-f", CONFIG_PATH],  # master-worker, in the foreground
            mounts=[docker.ContainerMountArgs(type="volume", source=volume, target=CONFIG_DIR, read_only=True)],
            labels=[docker.ContainerLabelArgs(label="spark-vllm.stack", value=spec.stack), *life_labels(args.life)],
            network_mode="host",
            # A crashed router, or a rebooted node, gets it back without a `pulumi up`.
            restart="unless-stopped",
            opts=pulumi.ResourceOptions(parent=self, provider=args.spark.provider, delete_before_replace=True,
                                        replace_on_changes=["*"], depends_on=[routes]))
        ready = Gate(f"{name}-ready", GateArgs(
            connection=args.spark.connection, container=None, script="gateway_ready.py",
            args=[f"--port={spec.port}", f"--container={self.container_name}",
                  served.apply(lambda d: f"--config={d}")],
            preamble=pulumi.Output.secret(args.gateway_key).apply(lambda k: f"KEY = {k!r}\n"),
            triggers=[container.id], timeout_s=spec.ready_timeout_s, after=[routes]),
            opts=child)
        self.routes = routes_json.apply(json.loads)
        self.ready_id, self.config = ready.ready_id, served
        self.register_outputs({"routes": self.routes, "containerId": container.id, "config": served})
