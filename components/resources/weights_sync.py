"""The weights sync (`spark-vllm:preflight.syncWeights`): what a worker's weights lack, copied from the head.

One `command.remote.Command` a worker, run on the head: rsync over ssh to the worker's fabric IP, never its
management address, with components/remote/weights_sync.sh. It prints each file it copies, progress, and the
throughput at the end. It runs only when preflight found that worker's weights to differ from the head's:

- its `triggers` carry a digest of both manifests (names and sizes, and SHA-256 with `hashWeights`) and, when they
  differ, the time preflight found it, so the same loss found again later syncs again;
- when preflight finds them equal, its inputs are ignored (`ignore_changes`): a no-op preview shows no changes,
  and the sync does not run again after a change that copies nothing (a new key, another timeout).

The worker's Ray container depends on its node's sync, so the weights are in place before vLLM loads them. A sync
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

from ..config.spec import ClusterSpec, PreflightSpec, ServeSpec
from ..nodes.node_facts import NodeFacts
from ..nodes.node_runner import rsync_argv
from ..nodes.weight_manifests import manifest, sync_needed
from ..remote import script

# With nothing to copy, none of the sync's inputs may change it (the first create still runs it once).
IGNORED_WHEN_EQUAL = ["triggers", "create", "stdin", "connection"]


@dataclass(frozen=True)
class SyncPlan:
    needed: bool  # preflight found the worker's weights to differ from the head's
    triggers: list[str]


def plan(cluster: ClusterSpec, preflight: PreflightSpec, facts: Mapping[str, NodeFacts],
         now: Optional[float] = None) -> dict[str, SyncPlan]:
    """Worker name -> its plan, from the facts preflight gathered."""
    needed = sync_needed(cluster, preflight.hash_weights, facts)
    head = manifest(facts[cluster.head.name].model if cluster.head.name in facts else None)
    found_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    plans = {}
    for node in cluster.workers:
        mine = manifest(facts[node.name].model if node.name in facts else None)
        digest = hashlib.sha256(json.dumps([head, mine], sort_keys=True).encode()).hexdigest()[:16]
        triggers = [f"manifests {digest}"] + ([f"found different at {found_at}"] if needed[node.name] else [])
        plans[node.name] = SyncPlan(needed=needed[node.name], triggers=triggers)
    return plans


def sync_argv(cluster: ClusterSpec, preflight: PreflightSpec, model_path: str, worker_name: str,
              with_key: bool) -> list[str]:
    worker = cluster.node(worker_name)
    rsync = rsync_argv(model_path, worker, worker.fabric_ip, preflight.hash_weights, with_key)
    return ["sh", "-s", "--", cluster.head.name, worker.name, worker.fabric_ip, model_path,
            str(preflight.sync_timeout_s), *rsync]


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
    connection: command.remote.ConnectionArgs  # of the head node, where rsync runs
    private_key: Optional[pulumi.Input[str]] = None  # a secret: the cluster's key, for the hop to the workers


class WeightsSync(pulumi.ComponentResource):
    """The head's weights copied to every worker whose weights differ; `synced[worker]` is that worker's sync."""

    synced: dict[str, command.remote.Command]

    def __init__(self, name: str, args: WeightsSyncArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:WeightsSync", name, None, opts)
        plans = plan(args.cluster, args.preflight, args.facts)
        stdin = pulumi.Output.from_input(args.private_key).apply(sync_script)
        self.synced = {}
        for worker in args.cluster.workers:
            p = plans[worker.name]
            self.synced[worker.name] = command.remote.Command(
                f"{name}-{worker.name}",
                connection=args.connection,
                create=shlex.join(sync_argv(args.cluster, args.preflight, args.serve.model_path, worker.name,
                                            with_key=args.private_key is not None)),
                stdin=stdin,
                triggers=p.triggers,
                add_previous_output_in_env=False,
                # The script bounds rsync with `timeout` itself: pulumi-command enforces no customTimeouts.
                opts=pulumi.ResourceOptions(
                    parent=self, ignore_changes=None if p.needed else IGNORED_WHEN_EQUAL))
        self.register_outputs({"syncIds": {node: c.id for node, c in self.synced.items()}})
