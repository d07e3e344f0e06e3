"""The watchdog: a keeper container on every node, and the arm that tells the head's keeper what to watch.

The keepers (components/remote/keeper.py) run with Docker's `unless-stopped` policy, so they outlive what they
watch: the serve dying, the head container restarting, the node rebooting. They reach each other over the fabric
only (the leader's port, which the fabric guard closes elsewhere), and Docker through their own node's socket:
no new secret anywhere. The arm is created once the serve is ready and deleted first whenever `up` replaces any
container or the serve (their ids are its triggers; delete_before_replace): the watchdog never fights `up`.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Mapping, Optional

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from ..config.spec import ClusterSpec, NodeSpec, ServeSpec
from .fabric_guard import chain_name
from ..remote import bounded, script
from ..remote.keeper import BOOT
from .labels import life_labels
from .spark_node import SparkNode
from .vllm_serve import ENV_FILE, LOG_FILE, PID_FILE
from ..config.watchdog_config import WatchdogSpec

STATE_DIR = "/var/lib/spark-vllm"  # in the keeper; the node's Docker volume `volume_name(stack)`
ARGV_FILE = PID_FILE.rsplit("/", 1)[0] + "/serve.argv"
ARM_S = 60  # the arm's create: the leader takes the arm at its next tick
DISARM_S = 300  # the arm's delete: a relaunch in progress aborts at its next step


def volume_name(stack: str) -> str:
    """The node's volume of the keeper's state, its watchdog.log and (Ray) the serve log: it outlives every
    container, at /var/lib/docker/volumes/<name>/_data on the node."""
    return f"spark-vllm-{stack}"


def keeper_name(stack: str) -> str:
    return f"spark-vllm-{stack}-keeper"


def keeper_config(stack: str, cluster: ClusterSpec, serve: ServeSpec, watchdog: WatchdogSpec, node: NodeSpec,
                  containers: Mapping[str, str]) -> dict:
    """What one node's keeper needs, no secret among it: its role, the containers it keeps, the guard to put back."""
    cfg: dict = {"stack": stack, "node": node.name, "executor": serve.executor, "stateDir": STATE_DIR,
                 "containers": [containers[node.name]]}
    if cluster.fabric_guard:
        cfg["guard"] = {"script": script("fabric_guard.sh"), "chain": chain_name(stack, cluster),
                        "args": [cluster.fabric_interface, f"spark-vllm stack {stack}", *cluster.guarded_ports]}
    if not node.head:
        return {**cfg, "role": "follower", "leader": f"{cluster.head.fabric_ip}:{watchdog.port}"}
    w = watchdog
    cfg.update(role="leader", bind=node.fabric_ip, port=w.port, followers=[n.name for n in cluster.workers],
               api={"host": cluster.api_host_on_node, "port": cluster.api_port, "model": serve.served_name},
               watchdog={"interval": w.interval_s, "probeTimeout": w.probe_timeout_s, "failures": w.failures,
                         "backoffInitial": w.backoff_initial_s, "backoffMax": w.backoff_max_s,
                         "maxRestarts": w.max_restarts, "window": w.window_s, "loadTimeout": w.load_timeout_s})
    if serve.executor == "ray":
        cfg["ray"] = {"ctl": script("serve_ctl.sh"), "pidFile": PID_FILE, "envFile": ENV_FILE,
                      "argvFile": ARGV_FILE, "log": LOG_FILE}
    return cfg


@dataclass
class WatchdogArgs:
    stack: str
    cluster: ClusterSpec
    serve: ServeSpec
    watchdog: WatchdogSpec
    sparks: Mapping[str, SparkNode]  # every node's, by name
    containers: Mapping[str, str]  # node -> the name of the container its keeper keeps (Ray's, or the rank)
    guards: Mapping[str, pulumi.Resource]  # node -> its fabric guard, when there is one
    # What `up` replaces: any change of these disarms first, and re-arms once the serve is ready again.
    watched_ids: list
    serve_ready: pulumi.Resource
    # Life tokens (components/preflight/liveness.py): node -> its keeper's, and the arm's (kept in the token it
    # arms with).
    keeper_lives: Mapping[str, Optional[str]] = field(default_factory=dict)
    arm_life: Optional[str] = None


class Watchdog(pulumi.ComponentResource):
    """A keeper a node (`docker.Container`, restart `unless-stopped`), and the arm on the head."""

    arm_id: pulumi.Output[str]

    def __init__(self, name: str, args: WatchdogArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:Watchdog", name, None, opts)
        cluster, keeper = args.cluster, keeper_name(args.stack)
        keepers = {}
        for node in cluster.nodes:
            cfg = keeper_config(args.stack, cluster, args.serve, args.watchdog, node, args.containers)
            keepers[node.name] = docker.Container(
                f"{name}-keeper-{node.name}",
                name=keeper,
                image=args.sparks[node.name].image_id,
                entrypoints=["python3"],
                command=["-c", BOOT, script("keeper.py"), json.dumps(cfg, sort_keys=True)],
                envs=[f"SPARK_VLLM_STATE_DIR={STATE_DIR}"],
                labels=[docker.ContainerLabelArgs(label="spark-vllm.stack", value=args.stack),
                        docker.ContainerLabelArgs(label="spark-vllm.role", value="keeper"),
                        *life_labels(args.keeper_lives.get(node.name))],
                network_mode="host",
                # nsenter into the host's mount namespace runs the node's own iptables for the guard.
                pid_mode="host",
                capabilities=docker.ContainerCapabilitiesArgs(adds=["CAP_NET_ADMIN", "CAP_SYS_ADMIN",
                                                                    "CAP_SYS_PTRACE"]),
                mounts=[docker.ContainerMountArgs(type="bind", source="/var/run/docker.sock",
                                                  target="/var/run/docker.sock"),
                        docker.ContainerMountArgs(type="volume", source=volume_name(args.stack),
                                                  target=STATE_DIR)],
                restart="unless-stopped",
                opts=pulumi.ResourceOptions(parent=self, provider=args.sparks[node.name].provider,
                                            delete_before_replace=True, replace_on_changes=["*"],
                                            depends_on=[g for g in (args.guards.get(node.name),) if g]))
        ids = [*args.watched_ids, *(k.id for k in keepers.values())]
        life = [args.arm_life] if args.arm_life else []
        # The arm's life token rides in the token the leader keeps, where preflight reads it back.
        token = pulumi.Output.all(*ids).apply(lambda v: ".".join(
            [hashlib.sha256(json.dumps(v).encode()).hexdigest()[:16], *life]))
        head = args.sparks[cluster.head.name]
        running = shlex.join(["docker", "inspect", "-f", "{{.State.Running}}", keeper])
        disarm = shlex.join(["docker", "exec", keeper, "python3", "/keeper.py", "disarm", str(DISARM_S)])
        arm = command.remote.Command(
            f"{name}-arm",
            connection=head.connection,
            create=token.apply(lambda t: bounded(shlex.join(["docker", "exec", keeper, "python3", "/keeper.py",
                                                             "arm", t, str(ARM_S)]), ARM_S + 30)),
            # A keeper that is not running (its node down) acts on nothing: there is nothing to disarm.
            delete=f'if [ "$({running} 2>/dev/null)" = true ]; then {bounded(disarm, DISARM_S + 30)}; fi',
            triggers=[*ids, *life],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, replace_on_changes=["*"],
                                        depends_on=[args.serve_ready]))
        self.arm_id = arm.id
        self.register_outputs({"armId": self.arm_id, "volume": volume_name(args.stack)})
