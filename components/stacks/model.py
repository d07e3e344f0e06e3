"""A model stack: preflight, then each node's Docker provider, the engine (Ray or mp), the gates, the keeper and
the outputs, wired from the validated deployment."""

import hashlib
import json
from typing import Mapping

import pulumi

from .. import preflight
from ..config import pulumi_config, spec
from ..config.spec import Deployment
from ..nodes.node_facts import NodeFacts
from ..nodes import load_floor, weight_manifests
from ..resources.fabric_guard import FabricGuard, FabricGuardArgs
from ..resources.gate import Gate, GateArgs
from ..resources.gate_args import cluster_ready_args, rank_ready_args, serve_ready_args
from ..resources.load_turn import load_turns, shared
from ..resources.memory_claim import MemoryClaim, MemoryClaimArgs
from ..resources.mp_rank import MpRank, MpRankArgs, ranks_digest
from ..resources.ray_node import RayNode, RayNodeArgs
from ..resources.image_transfer import ImageTransfer, ImageTransferArgs
from ..resources.spark_node import SparkNode, SparkNodeArgs, connection
from ..resources.vllm_serve import VllmServe, VllmServeArgs, page_cache_drops
from ..resources.watchdog import Watchdog, WatchdogArgs
from ..resources.weights_download import WeightsDownload, WeightsDownloadArgs
from ..resources.weights_sync import WeightsSync, WeightsSyncArgs

# The gates were two component types before they were one: the aliases keep existing stacks' gates in place.
SERVE_READY_ALIAS = pulumi.ResourceOptions(aliases=[pulumi.Alias(type_="spark-vllm:index:ServeReady")])


def weights_root(deployment: Deployment, facts: Mapping[str, NodeFacts], node: str) -> str:
    """What the node's containers mount for the weights: their folder, or the folder that also holds whatever their
    links lead to (a Hugging Face cache snapshot's links lead to ../../blobs), as preflight found it."""
    model = facts[node].model if node in facts else None
    root = model.mount_root if model is not None and model.exists and not model.unavailable else None
    return root or deployment.serve.model_path


def wire(deployment: Deployment) -> None:
    cluster, serve = deployment.cluster, deployment.serve
    stack_config = pulumi.Config(spec.NAMESPACE)
    secret = {key: stack_config.require_secret(key) for key in (*deployment.secrets, *(
        [spec.REGISTRY_SECRET] if deployment.images.registry_password else []))}
    hf_token = pulumi_config.secret_value("hfToken") if "hfToken" in deployment.secrets and serve.hub else None
    checked = preflight.run(deployment, hf_token)  # before any resource: a failed check leaves the stack as it was
    facts, lives = checked.facts, checked.lives
    private_key = pulumi.Output.secret(deployment.ssh_private_key) if deployment.ssh_private_key else None

    # The artifacts first: the image on every node, then the weights from the Hub on one node, then on the others.
    connections = {node.name: connection(node, cluster.node(node.via) if node.via else None, private_key)
                   for node in cluster.nodes}
    transfer = ImageTransfer("image-transfer", ImageTransferArgs(
        deployment=deployment, plan=checked.images, connections=connections, private_key=private_key,
        registry_password=secret.get(spec.REGISTRY_SECRET))) if checked.images.nodes else None
    image_ready = transfer.ready if transfer else {}
    sparks = {
        node.name: SparkNode(node.name, SparkNodeArgs(node=node, ssh=cluster.ssh, image=serve.image,
                                                      jump=cluster.node(node.via) if node.via else None,
                                                      private_key=private_key,
                                                      image_found=preflight.image_found(checked, node),
                                                      image_ready=image_ready.get(node.name)))
        for node in cluster.nodes
    }
    source = deployment.source
    download = WeightsDownload("weights-download", WeightsDownloadArgs(
        deployment=deployment, plan=checked.hub, connection=connections[source.name],
        after=[sparks[source.name].image], token=secret.get("hfToken"))) if checked.hub else None
    sync = WeightsSync("weights-sync", WeightsSyncArgs(
        cluster=cluster, serve=serve, preflight=deployment.preflight, facts=facts, source=source,
        connection=connections[source.name], private_key=private_key, hub=checked.hub,
        after=download.done if download else None)) if deployment.preflight.sync_weights else None
    # What each node's engine waits for: its weights, synced there, or downloaded there; and what its containers
    # mount: the weights' folder, or the folder that also holds what its links point to (a Hugging Face cache).
    weights_ready = {**({source.name: download.done} if download else {}), **(sync.synced if sync else {})}
    # Nothing that runs is replaced before every node holds every new artifact: a failed copy, download or sync
    # leaves the running deployment serving (docs/artifacts.md).
    artifacts = (*image_ready.values(), *weights_ready.values())
    roots = {node.name: weights_root(deployment, facts, node.name) for node in cluster.nodes}
    nccl = preflight.nccl_mounts(deployment, checked)  # docs/host-nccl.md
    version = checked.hub.commit if checked.hub else None  # a new commit is new weights: the serve loads again
    ordered_turns = shared(deployment.stack, facts)  # docs/placement.md: a load at a time on a node
    guards = {
        node.name: FabricGuard(f"fabric-guard-{node.name}", FabricGuardArgs(
            stack=deployment.stack, cluster=cluster, node=node, connection=sparks[node.name].connection,
            found=preflight.guard_found(deployment, facts, node)))
        for node in cluster.nodes if cluster.fabric_guard
    }
    # Each node's share of memory, left there for other stacks' preflight to add up (docs/placement.md).
    claims = [MemoryClaim(f"memory-claim-{node.name}", MemoryClaimArgs(
        stack=deployment.stack, fraction=serve.gpu_memory_utilization, connection=sparks[node.name].connection))
        for node in cluster.nodes]
    head_spark = sparks[cluster.head.name]
    def ray_engine():
        """Ray: a `ray start` container a node, Ray's own gate, then `vllm serve` in the head's container."""
        head = RayNode("ray-head", RayNodeArgs(stack=deployment.stack, cluster=cluster, serve=serve, node=cluster.head,
                                               spark=head_spark, guard=guards.get(cluster.head.name),
                                               artifacts=artifacts,
                                               weights_root=roots[cluster.head.name],
                                               nccl=nccl.get(cluster.head.name),
                                               life=lives.engine(cluster.head.name)))
        workers = {
            node.name: RayNode(f"ray-worker-{node.name}",
                               RayNodeArgs(stack=deployment.stack, cluster=cluster, serve=serve, node=node,
                                           spark=sparks[node.name], head=head, head_id_label=not facts,
                                           guard=guards.get(node.name),
                                           artifacts=artifacts, weights_root=roots[node.name],
                                           nccl=nccl.get(node.name), life=lives.engine(node.name)))
            for node in cluster.workers
        }
        cluster_ready = Gate("cluster-ready", GateArgs(
            connection=head_spark.connection, container=head.container_name, script="cluster_ready.py",
            args=cluster_ready_args(cluster), triggers=[head.container_id, *(w.container_id for w in workers.values())],
            timeout_s=deployment.cluster_ready_timeout_s),
            opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(type_="spark-vllm:index:ClusterReady")]))
        serve_process = VllmServe("vllm-serve", VllmServeArgs(
            stack=deployment.stack, cluster=cluster, serve=serve, connection=head_spark.connection,
            head_container=head.container_name, cluster_ready_id=cluster_ready.ready_id,
            secrets={key: secret[key] for key in deployment.secrets}, sparks=sparks,
            load_s=deployment.serve_ready_timeout_s, life=lives.serve.token, weights=version,
            after=(*claims, *artifacts), ordered_turns=ordered_turns))
        serve_ready = Gate("serve-ready", GateArgs(
            connection=head_spark.connection, container=head.container_name, script="serve_ready.py",
            args=serve_ready_args(cluster, serve), triggers=[serve_process.serve_id],
            timeout_s=deployment.serve_ready_timeout_s), opts=SERVE_READY_ALIAS)
        nodes = {cluster.head.name: head, **workers}
        return nodes, serve_ready, [serve_process.serve_id]


    def mp_engine():
        """mp: a `vllm serve --node-rank k` container a node, every rank restarting together; a gate a node (its rank
        reaches the master), then the serve gate on the head, run on the node beside rank 0."""
        secrets = {key: secret[key] for key in deployment.secrets}
        keys = sorted(secrets)
        # Every rank's settings, the images, the weights' commit and the secrets: a change of any restarts all ranks.
        settings = ranks_digest(cluster, serve, roots, nccl)
        digest = pulumi.Output.all(*(s.image_id for s in sparks.values()), *(secrets[k] for k in keys)).apply(
            lambda values: hashlib.sha256(json.dumps([settings, version, values]).encode()).hexdigest()[:16])
        # One stack loads on a node at a time (docs/placement.md): each node's turn first, then its cache drop.
        life = [lives.serve.token] if lives.serve.token else []  # a dead group's new ranks load again
        turns = load_turns("mp-serve", None, deployment.stack, cluster, sparks, [digest, *life],
                           deployment.serve_ready_timeout_s, [*claims, *artifacts], ordered_turns)
        drops = page_cache_drops("mp-serve", None, {n: s.connection for n, s in sparks.items()},
                                 [digest], turns) if serve.drop_page_cache else []
        head = MpRank(f"vllm-rank-{cluster.head.name}", MpRankArgs(
            stack=deployment.stack, cluster=cluster, serve=serve, node=cluster.head, spark=head_spark, digest=digest,
            secrets=secrets, weights_root=roots[cluster.head.name], nccl=nccl.get(cluster.head.name),
            depends_on=(guards.get(cluster.head.name), *artifacts, *turns, *drops),
            life=lives.serve.token))
        ranks = {cluster.head.name: head, **{
            node.name: MpRank(f"vllm-rank-{node.name}", MpRankArgs(
                stack=deployment.stack, cluster=cluster, serve=serve, node=node, spark=sparks[node.name], digest=digest,
                head=head, head_id_label=not facts, weights_root=roots[node.name], nccl=nccl.get(node.name),
                depends_on=(guards.get(node.name), *artifacts, *turns, *drops),
                life=lives.serve.token))
            for node in cluster.workers}}
        ids = [rank.container_id for rank in ranks.values()]
        # Without these, a rank that cannot reach the master (the seed's c10d failure: the master on the head's
        # management address) would show only as a head that never loads, until the serve gate's long bound. The
        # head's comes first: it names that cause at once, where the workers' would each wait out their bound.
        def rank_ready(name: str, after: tuple[Gate, ...]) -> Gate:
            return Gate(f"ranks-ready-{name}", GateArgs(
                connection=sparks[name].connection, container=None, script="rank_ready.py",
                args=rank_ready_args(cluster, name, ranks[name].container_name), triggers=ids,
                timeout_s=deployment.cluster_ready_timeout_s, after=after))
        ranks_ready: list[Gate] = []
        if cluster.workers:  # on one node there is no master to reach: the serve gate alone follows the rank
            head_ready = rank_ready(cluster.head.name, ())
            ranks_ready = [head_ready, *(rank_ready(node.name, (head_ready,)) for node in cluster.workers)]
        serve_ready = Gate("serve-ready", GateArgs(
            connection=head_spark.connection, container=None, script="serve_ready.py",
            args=serve_ready_args(cluster, serve, rank0=head.container_name),
            triggers=[head.container_id, *(gate.ready_id for gate in ranks_ready)],
            timeout_s=deployment.serve_ready_timeout_s), opts=SERVE_READY_ALIAS)
        return ranks, serve_ready, []


    engines, serve_ready, serve_ids = mp_engine() if serve.executor == "mp" else ray_engine()
    container_ids = {name: engine.container_id for name, engine in engines.items()}
    if deployment.watchdog.enabled:
        Watchdog("watchdog", WatchdogArgs(
            stack=deployment.stack, cluster=cluster, serve=serve, watchdog=deployment.watchdog, sparks=sparks,
            containers={name: engine.container_name for name, engine in engines.items()}, guards=guards,
            watched_ids=[*container_ids.values(), *serve_ids], serve_ready=serve_ready,
            keeper_lives={name: life.token for name, life in lives.keepers.items()}, arm_life=lives.arm.token))

    # The URL is exported only once the model answers, so a stack output always points at a working endpoint.
    pulumi.export("baseUrl", serve_ready.ready_id.apply(
        lambda _: f"http://{cluster.endpoint_host}:{cluster.api_port}/v1"))
    pulumi.export("servedModel", serve.served_name)
    if "apiKey" in deployment.secrets:  # what a gateway's route to this model sends (docs/gateway.md); a secret
        pulumi.export("apiKey", secret["apiKey"])
    if checked.hub is not None:
        pulumi.export("weights", {"repo": serve.hub.repo if serve.hub else None, "commit": checked.hub.commit})
    pulumi.export("fabricIps", {node.name: node.fabric_ip for node in cluster.nodes})
    pulumi.export("nodes", [node.name for node in cluster.nodes])  # the stack's, its head first
    # The ports its head opens, by config key (its `portSlot` moves them): what another stack on the node must not take.
    pulumi.export("ports", dict(sorted((key, port) for port, (_, key) in cluster.head_ports.items())))
    pulumi.export("containerIds", container_ids)
    # The last load against its floor (the slowest node's weights over its disk's read speed), from the serve gate.
    # The floor is kept as measured by the preflight of the `up` that ran that gate: every preflight reads the disks
    # again, a little faster or slower each time, and an `up` that loads nothing must change no output. A new gate
    # (a new load) replaces the stash with this run's figures; `ignore_changes` keeps the rest from showing as diffs.
    weights = weight_manifests.weight_bytes(facts[cluster.head.name].model) if facts else None
    measured = pulumi.Stash("load-floor", input={"weights": weights, "floorSeconds": load_floor.floor(facts)},
                            opts=pulumi.ResourceOptions(replacement_trigger=serve_ready.ready_id,
                                                        ignore_changes=["input"]))
    pulumi.export("load", pulumi.Output.all(serve_ready.output, measured.output).apply(
        lambda got: load_floor.report(got[0], got[1].get("weights"), got[1].get("floorSeconds"))))  # None: absent
