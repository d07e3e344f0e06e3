"""The weights sync (`spark-vllm:preflight.syncWeights`): what a node's weights lack, copied from the source.

The source is the node the others get the weights from: the head, or the node that downloads them from the Hub
(`serve.hub`, which turns the sync on). One `command.remote.Command` a node, run on the source: rsync over ssh to the
node's fabric IP, never its management address, with components/remote/weights_sync.sh, which follows links (a Hugging
Face cache snapshot is a folder of links) and checks the result. It prints each file it copies, progress, and the
throughput at the end. It runs only when preflight found that node's weights to differ from the source's, or from what
a Hub download is about to fetch:

- its `triggers` carry a digest of both manifests (names and sizes, and SHA-256 with `hashWeights`) and, when they
  differ, the time preflight found it, so the same loss found again later syncs again;
- when preflight finds them equal, its inputs are ignored (`ignore_changes`): a no-op preview shows no changes,
  and the sync does not run again after a change that copies nothing (a new key, another timeout).

The node's engine container depends on its node's sync, so the weights are in place before vLLM loads them. A sync
of a running deployment replaces nothing else: the running vLLM keeps the weights it loaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import Mapping, Optional

import pulumi
import pulumi_command as command

from ..config.spec import ClusterSpec, NodeSpec, PreflightSpec, ServeSpec
from ..nodes.hub_plan import HubPlan
from ..nodes.node_facts import NodeFacts
from ..nodes.node_runner import rsync_argv
from ..nodes.weight_manifests import manifest, sync_needed
from ..remote import script

# With nothing to copy, none of the sync's inputs may change it (the first create still runs it once).
IGNORED_WHEN_EQUAL = ["triggers", "create", "stdin", "connection"]


@dataclass(frozen=True)
class SyncPlan:
    needed: bool  # preflight found the node's weights to differ from the source's, or a download will change them
    triggers: list[str]


def plan(cluster: ClusterSpec, preflight: PreflightSpec, facts: Mapping[str, NodeFacts], source: NodeSpec,
         hub: Optional[HubPlan] = None, now: Optional[float] = None) -> dict[str, SyncPlan]:
    """Node name -> its plan, for every node but the source, from the facts preflight gathered and the download's
    plan: with a download, a node must hold every file it fetches, and a download that runs is synced after."""
    wanted = hub.wanted() if hub is not None else None
    needed = sync_needed(cluster, source, preflight.hash_weights, facts, wanted)
    ref = {"wanted": wanted, "commit": hub.commit} if hub is not None else \
        manifest(facts[source.name].model if source.name in facts else None)
    found_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    plans = {}
    for node in cluster.nodes:
        if node.name == source.name:
            continue
        mine = manifest(facts[node.name].model if node.name in facts else None)
        digest = hashlib.sha256(json.dumps([ref, mine], sort_keys=True).encode()).hexdigest()[:16]
        differs = needed[node.name] or (hub is not None and hub.needed)
        triggers = [f"manifests {digest}"] + ([f"found different at {found_at}"] if differs else [])
        plans[node.name] = SyncPlan(needed=differs, triggers=triggers)
    return plans


def sync_argv(cluster: ClusterSpec, preflight: PreflightSpec, model_path: str, source: NodeSpec, target: str,
              with_key: bool, from_hub: bool = False) -> list[str]:
    node = cluster.node(target)
    compare = "checksum" if preflight.hash_weights else "size and time" if from_hub else "size"
    rsync = rsync_argv(model_path, node, node.fabric_ip, compare, with_key)
    return ["sh", "-s", "--", source.name, node.name, node.fabric_ip, model_path, str(preflight.sync_timeout_s),
            *rsync]


def sync_script(private_key: Optional[str]) -> str:
    """The script with the key inlined as base64; a secret whenever the key is. Without a key, the head's own
    identity."""
    key = private_key.rstrip("\n") + "\n" if private_key else ""
    return script("weights_sync.sh").replace("@KEY@", base64.b64encode(key.encode()).decode())


@dataclass
class WeightsSyncArgs:
    cluster: ClusterSpec
    serve: ServeSpec
    preflight: PreflightSpec
    facts: Mapping[str, NodeFacts]  # what preflight.run returned
    source: NodeSpec  # the node the others copy from: the head, or the Hub download's
    connection: command.remote.ConnectionArgs  # of the source, where rsync runs
    private_key: Optional[pulumi.Input[str]] = None  # a secret: the cluster's key, for the hop to the nodes
    hub: Optional[HubPlan] = None  # the Hub download's plan, with `serve.hub`
    after: Optional[pulumi.Resource] = None  # the Hub download: every sync copies what it fetched


class WeightsSync(pulumi.ComponentResource):
    """The source's weights copied to every node whose weights differ; `synced[node]` is that node's sync."""

    synced: dict[str, command.remote.Command]

    def __init__(self, name: str, args: WeightsSyncArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:WeightsSync", name, None, opts)
        plans = plan(args.cluster, args.preflight, args.facts, args.source, args.hub)
        stdin = pulumi.Output.from_input(args.private_key).apply(sync_script)
        self.synced = {}
        for node, p in plans.items():
            self.synced[node] = command.remote.Command(
                f"{name}-{node}",
                connection=args.connection,
                create=shlex.join(sync_argv(args.cluster, args.preflight, args.serve.model_path, args.source, node,
                                            with_key=args.private_key is not None, from_hub=args.hub is not None)),
                stdin=stdin,
                triggers=p.triggers,
                add_previous_output_in_env=False,
                # The script bounds rsync with `timeout` itself: pulumi-command enforces no customTimeouts.
                opts=pulumi.ResourceOptions(
                    parent=self, ignore_changes=None if p.needed else IGNORED_WHEN_EQUAL,
                    depends_on=[args.after] if args.after else None))
        self.register_outputs({"syncIds": {node: c.id for node, c in self.synced.items()}})
