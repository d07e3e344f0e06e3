"""Day two: what of a deployment is dead on its nodes, and the life tokens that make a plain `preview` see it.

Pulumi compares the program's inputs with the state of the last `up`; it looks at the nodes only when refreshed,
and remote.Command cannot be refreshed at all. A deployment that died since (a reboot, a container removed or
stopped by hand, a crash with the watchdog off or given up, a wedged engine) still matches its state. So each
container carries a life token in its `spark-vllm.life` label, and the Ray serve and the watchdog's arm in their
triggers, and the program gives each one, from preflight's one probe a node:
- the token that the living thing carries: no diff, nothing restarts;
- a new token when it is dead or gone: a diff, so it and what depends on it are recreated, and preflight says why;
- no token when nothing is known (preflight off), or it runs without one (deployed before tokens existed).
What the watchdog restarted is the same container, or the serve with the same token: not drift.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from ..config.spec import Deployment, NodeSpec
from ..resources.mp_rank import container_name as rank_name
from ..nodes.node_facts import NodeFacts, Running
from ..resources.ray_node import container_name as ray_name
from ..text import duration
from ..resources.watchdog import keeper_name


@dataclass(frozen=True)
class Life:
    token: Optional[str] = None  # what the resource carries; None: no token
    dead: Optional[str] = None  # why it is recreated; None: it lives, or nothing is known


@dataclass(frozen=True)
class Lives:
    engines: Mapping[str, Life] = field(default_factory=dict)  # node -> its Ray container or rank (mp: the group's)
    serve: Life = Life()  # Ray: the serve in the head container; mp: the group's
    keepers: Mapping[str, Life] = field(default_factory=dict)
    arm: Life = Life()
    dead: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # node -> what is dead there, and what follows
    alive: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # node -> what runs there

    def engine(self, node: str) -> Optional[str]:
        """The life token of the node's Ray container or rank; None when nothing is known."""
        return self.engines[node].token if node in self.engines else None


def judge(deployment: Deployment, facts: Mapping[str, NodeFacts], stamp: Optional[str] = None) -> Lives:
    """Every piece's life, from the facts of every node ({} when preflight is off: nothing is known)."""
    new = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    cluster, stack = deployment.cluster, deployment.stack
    running = {name: f.running for name, f in facts.items() if f.running is not None and not f.running.unavailable}
    deployed = any(r.containers for r in running.values())  # so what is missing was lost, not yet made
    dead: dict[str, list[str]] = {n.name: [] for n in cluster.nodes}
    alive: dict[str, list[str]] = {n.name: [] for n in cluster.nodes}

    def container(node: NodeSpec, name: str, then: str) -> Life:
        r = running.get(node.name)
        if r is None:
            return Life()
        c = r.containers.get(name)
        if c is not None and c.running:
            alive[node.name].append(f"{name} running")
            return Life(c.life)
        if c is None:
            # On a first `up` the engine creates it anyway; said as a fact, not as a loss.
            (dead if deployed else alive)[node.name].append(f"{name} is not on {node.name}" +
                                                            (f": {then}" if deployed else ": up creates it"))
            return Life(new, f"{name} is not on {node.name}" if deployed else None)
        ago = f" {duration(c.finished_ago_s)} ago" if c.finished_ago_s is not None else ""
        why = f"{name} {c.status}{ago} (code {c.exit_code})"
        dead[node.name].append(f"{why}: {then}")
        return Life(new, why)

    head = cluster.head
    on_head = running.get(head.name)
    gave_up = _gave_up(on_head)
    if deployment.serve.executor == "ray":
        engines = {n.name: container(n, ray_name(stack, n), "it and what depends on it will be recreated"
                                     if n.head else "it, the cluster gate and the serve will be recreated")
                   for n in cluster.nodes}
        if engines[head.name].token == new:
            # A new head is a new cluster: its workers are recreated with it, whether the engine replaces the head
            # or, after a refresh found it gone, creates it. They do not wait for its container (Ray's workers keep
            # trying to reach the GCS), so nothing but their own token ties them to it.
            engines = {name: Life(new, life.dead) for name, life in engines.items()}
        serve = _ray_serve(on_head, engines[head.name], new, gave_up)
        if serve.dead:
            dead[head.name].append(f"{serve.dead}: the serve will be restarted")
        elif on_head is not None and on_head.serve_running:
            alive[head.name].append("vllm serve running" + _answered(on_head))
    else:
        then = "every rank will be recreated (a torch.distributed group cannot take one back)"
        ranks = {n.name: container(n, rank_name(stack, cluster, n), then) for n in cluster.nodes}
        serve = _mp_group(on_head, ranks, new, gave_up)
        if serve.dead and not any(life.dead for life in ranks.values()):
            dead[head.name].append(f"{serve.dead}: {then}")
        elif not serve.dead and on_head is not None and on_head.api is not None:
            alive[head.name].append("rank 0" + _answered(on_head))
        engines = {name: serve for name in ranks}
    keepers, arm = {}, Life()
    if deployment.watchdog.enabled:
        keepers = {n.name: container(n, keeper_name(stack), "the keeper will be recreated") for n in cluster.nodes}
        arm = _arm(on_head, keepers[head.name], new)
        if arm.dead:
            dead[head.name].append(f"{arm.dead}: up arms it again")
    return Lives(engines=engines, serve=serve, keepers=keepers, arm=arm,
                 dead={k: tuple(v) for k, v in dead.items()}, alive={k: tuple(v) for k, v in alive.items()})


def _gave_up(on_head: Optional[Running]) -> str:
    keeper = on_head.keeper if on_head is not None else None
    return f" (the watchdog {keeper.gave_up})" if keeper is not None and keeper.gave_up else ""


def _answered(on_head: Running) -> str:
    api = on_head.api
    if api is None:
        return ""
    if api.answered_s is not None:
        return f", answered a completion in {api.answered_s:.2f} s"
    if api.refused:
        return ", not answering yet (loading)"
    return f", answered a completion with {api.failed}"


def _wedged(on_head: Running) -> Optional[str]:
    """Why the API that runs does not serve: no answer in time, or a server error; None if it serves or loads."""
    api = on_head.api
    if api is None:
        return None
    if api.timeout_s is not None:
        return f"the API gives no completion within {api.timeout_s:g} s (a wedged engine)"
    if api.failed and (api.status is None or api.status >= 500):
        return f"the API fails a completion: {api.failed}"
    return None


def _ray_serve(on_head: Optional[Running], head: Life, new: str, gave_up: str) -> Life:
    if on_head is None:
        return Life()
    if head.dead or head.token == new:
        return Life(new)  # it goes with its container, which says why
    if on_head.serve_running is False:
        return Life(new, f"vllm serve is not running{gave_up}")
    wedged = _wedged(on_head)
    return Life(new, f"vllm serve runs, but {wedged}") if wedged else Life(on_head.serve_life)


def _mp_group(on_head: Optional[Running], ranks: Mapping[str, Life], new: str, gave_up: str) -> Life:
    lost = [life.dead for life in ranks.values() if life.dead]
    if lost:
        return Life(new, "; ".join(lost) + gave_up)
    wedged = _wedged(on_head) if on_head is not None else None
    if wedged:
        return Life(new, f"rank 0 runs, but {wedged}")
    tokens = {life.token for life in ranks.values()}
    return Life(tokens.pop()) if len(tokens) == 1 else Life(new)  # ranks of different lives are no one group


def _arm(on_head: Optional[Running], keeper: Life, new: str) -> Life:
    state = on_head.keeper if on_head is not None else None
    if on_head is None or keeper.token == new or state is None:
        return Life(new if on_head is not None else None)
    if state.unreadable:
        return Life()
    if state.gave_up:
        return Life(new, f"the watchdog {state.gave_up}")
    if not state.armed:
        return Life(new, f"the watchdog is not armed ({state.phase or 'never armed'})")
    token = state.token or ""
    return Life(token.split(".", 1)[1] if "." in token else None)
