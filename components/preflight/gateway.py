"""Preflight of a gateway stack: its node checked before any resource, and the router's life read.

One probe over SSH (components/remote/preflight_probe.py, in its gateway mode) gathers Docker, the router's image,
who holds its port, and the router's container as Docker has it. Any failure stops the program with the table
before anything changes. The container carries a life token (liveness.py): the one it carries while it runs, a new
one when it was stopped, removed or lost with a reboot, so that a plain `preview` plans its repair and a plain `up`
makes it.
"""

from __future__ import annotations

import time
import pulumi

from ..config.gateway_config import GatewaySpec
from ..nodes.node_facts import NodeFacts
from ..resources.gateway import container_name
from ..text import duration
from .findings import Finding, Status
from .liveness import Life
from .probing import STEP_TIMEOUT_S, probe_node
from .table import render

TIMEOUT_S = 60


def probe_spec(spec: GatewaySpec) -> dict:
    return {"gateway": True, "image": spec.image, "inside": False, "ports": [spec.port],
            "running": {"stack": spec.stack}, "stepTimeout": STEP_TIMEOUT_S}


def run(spec: GatewaySpec) -> Life:
    """Probes and judges the router's node; raises pulumi.RunError with the table if a check failed. Returns the
    router's life (no token when preflight is off)."""
    if not spec.preflight:
        pulumi.log.info("preflight is off (spark-vllm:preflight.enabled is false): the router's node was not checked, "
                        "and a router stopped or removed by hand is seen only by `pulumi up --refresh`")
        return Life()
    start = time.monotonic()
    facts = probe_node(spec.cluster, spec.node, probe_spec(spec), TIMEOUT_S, "a gateway's preflight bound")
    findings, life = judge(spec, facts, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    failed = [f for f in findings if f.status is Status.FAIL]
    summary = (f"preflight of the gateway's node {spec.node.name} took {time.monotonic() - start:.1f} s: "
               f"{len(failed)} failed")
    if failed:
        raise pulumi.RunError(f"{summary}; nothing was deployed or changed.\n{render(findings)}")
    if life.dead:
        summary += f"; {life.dead}: the next up makes it"
    pulumi.log.info(f"{summary}\n{render(findings)}")
    return life


def judge(spec: GatewaySpec, facts: NodeFacts, new: str) -> tuple[list[Finding], Life]:
    """The findings on the node, and the router's life: its token while it runs, `new` when it does not."""
    node, router = spec.node.name, container_name(spec.stack)
    if facts.ssh_error or facts.probe_error:
        reason = f"SSH {facts.ssh_error}" if facts.ssh_error else str(facts.probe_error)
        return [Finding(node, "ssh", Status.FAIL, reason, f"check that `ssh {spec.node.ssh_host}` works")], Life()
    findings = [Finding(node, "ssh", Status.OK, f"answered in {facts.seconds:.1f} s")]
    if not facts.docker.server:
        findings.append(Finding(node, "docker", Status.FAIL, facts.docker.error or facts.docker.unavailable or
                                "no Docker server", f"start Docker on {node}, and let {spec.node.ssh_user} use it"))
        return findings, Life()
    findings.append(Finding(node, "docker", Status.OK, f"Docker {facts.docker.server}"))
    image = facts.image
    if image is None or not image.present:
        findings.append(Finding(node, "image", Status.FAIL, f"the router's image {spec.image} is not on {node}"
                                + (f" ({image.unavailable})" if image is not None and image.unavailable else ""),
                                "build it there (docs/gateway.md, \"The image\"), or set spark-vllm:gateway.image"))
    else:
        findings.append(Finding(node, "image", Status.OK, f"{spec.image} present"))
    findings.append(port_finding(spec, facts, router))
    life, state = router_life(facts, router, new)
    findings.append(Finding(node, "router", Status.OK, state))
    return findings, life


def port_finding(spec: GatewaySpec, facts: NodeFacts, router: str) -> Finding:
    node, port = spec.node.name, spec.port
    state = facts.ports.by_port.get(port) if facts.ports is not None else None
    if state is None:
        why = facts.ports.unavailable if facts.ports is not None else "not asked"
        return Finding(node, "port", Status.WARN, f"could not check port {port}: {why}")
    if state.free:
        return Finding(node, "port", Status.OK, f"{port} free")
    holders = [h for h in state.holders if not h.exiting]
    if state.hidden:
        if any(c.container == router for c in state.running):
            return Finding(node, "port", Status.OK, f"{port} in use while the router runs")
        return Finding(node, "port", Status.FAIL, f"{port} is in use, and ss shows its owner only to root",
                       f"see who holds it: `sudo ss -tlnp 'sport = :{port}'`; free it, or set "
                       "spark-vllm:gateway.port")
    if not holders or all(h.container == router for h in holders):
        return Finding(node, "port", Status.OK, f"{port} held by the router" if holders else f"{port} free")
    h = next(h for h in holders if h.container != router)
    where = (f" in {h.container} of stack {h.stack}" if h.stack else f" in container {h.container}" if h.container
             else ", outside any container")
    return Finding(node, "port", Status.FAIL, f"{port} is held by {h.process} (pid {h.pid}){where}",
                   "stop it, or set spark-vllm:gateway.port to a free port")


def router_life(facts: NodeFacts, router: str, new: str) -> tuple[Life, str]:
    """The router's life, and what preflight says of it."""
    running = facts.running
    if running is None or running.unavailable:
        return Life(), f"could not read {router}: {running.unavailable if running else 'not asked'}"
    c = running.containers.get(router)
    if c is None:  # never made, or removed by hand: `up` makes it either way
        return Life(new, f"{router} is not on the node"), f"{router} is not on the node: up creates it"
    if c.running:
        return Life(c.life), f"{router} running"
    ago = f" {duration(c.finished_ago_s)} ago" if c.finished_ago_s is not None else ""
    why = f"{router} {c.status}{ago} (code {c.exit_code})"
    return Life(new, why), f"{why}: up recreates it"
