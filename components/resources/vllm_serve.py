"""`vllm serve` as a resource: started in the background inside the Ray head container, stopped on delete.

With `serve.dropPageCache`, a command on every node drops its page cache first. Its triggers are what replaces
the serve (the cluster, the command line, the secrets, as a digest), so it runs again before every (re)start of
the serve, and never on a no-op.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_command as command

from ..config.spec import ClusterSpec, ServeSpec
from ..remote import script
from .load_turn import load_turns
from .spark_node import SparkNode

RUN_DIR = "/run/spark-vllm"
PID_FILE = f"{RUN_DIR}/serve.pid"
ENV_FILE = f"{RUN_DIR}/serve.env"
LIFE_FILE = f"{RUN_DIR}/serve.life"  # its life token (components/preflight/liveness.py), which a relaunch keeps
LOG_FILE = "/var/log/spark-vllm/serve.log"
SECRET_ENV = {"apiKey": "VLLM_API_KEY", "hfToken": "HF_TOKEN"}


def serve_argv(serve: ServeSpec, cluster: ClusterSpec) -> list[str]:
    argv = ["vllm", "serve", serve.model_path,
            "--served-model-name", serve.served_name,
            "--host", cluster.api_bind,
            "--port", str(cluster.api_port),
            "--tensor-parallel-size", str(serve.tensor_parallel),
            "--pipeline-parallel-size", str(serve.pipeline_parallel),
            "--distributed-executor-backend", serve.executor,
            "--gpu-memory-utilization", f"{serve.gpu_memory_utilization:g}",
            "--load-format", serve.load_format]
    if serve.max_model_len is not None:
        argv += ["--max-model-len", str(serve.max_model_len)]
    if serve.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(serve.max_num_seqs)]
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    return argv + list(serve.extra_args)


def start_script(env: Mapping[str, str]) -> str:
    """The launcher with the secrets inlined, base64-encoded; the result is a secret whenever any value is."""
    lines = "\n".join(f"{SECRET_ENV[key]} {base64.b64encode(value.encode()).decode()}"
                      for key, value in sorted(env.items()))
    return script("serve_start.sh").replace("@ENV@", lines)


def serve_ctl(container: str, action: str) -> str:
    """`alive` or `stop` (components/remote/serve_ctl.sh) for the serve in `container`, as a shell command."""
    return shlex.join(["docker", "exec", container, "sh", "-c", script("serve_ctl.sh"), "serve-ctl", action,
                       PID_FILE, ENV_FILE])


def stop_command(container: str) -> str:
    # Stops this serve's process group only. A container that is gone or stopped (a rebooted node) has nothing
    # left to stop, and `docker exec` into a stopped one would fail the delete.
    running = shlex.join(["docker", "inspect", "-f", "{{.State.Running}}", container])
    return f'if [ "$({running} 2>/dev/null)" = true ]; then {serve_ctl(container, "stop")}; fi'


def page_cache_drops(name: str, parent: Optional[pulumi.Resource], nodes: Mapping[str, command.remote.ConnectionArgs],
                     triggers: list, after: Sequence[pulumi.Resource] = ()) -> list[command.remote.Command]:
    """`serve.dropPageCache`: one command a node, replaced (so run again) whenever `triggers` change; after the
    load turns, since dropping the cache frees memory under another stack's loading vLLM."""
    return [command.remote.Command(
        f"{name}-drop-cache-{node}",
        connection=connection,
        create=shlex.join(["sh", "-s", "--", node]),
        stdin=script("drop_page_cache.sh"),
        triggers=triggers,
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(parent=parent, replace_on_changes=["*"], depends_on=list(after)),
    ) for node, connection in nodes.items()]


@dataclass
class VllmServeArgs:
    stack: str
    cluster: ClusterSpec
    serve: ServeSpec
    connection: command.remote.ConnectionArgs  # of the head node
    head_container: str
    cluster_ready_id: pulumi.Input[str]  # a new cluster means a new serve
    secrets: Mapping[str, pulumi.Input[str]]  # keys of SECRET_ENV; values are Pulumi secrets
    # Every node: its load turn is taken first (load_turn.py), and with serve.dropPageCache its page cache dropped.
    sparks: Mapping[str, SparkNode]
    load_s: int  # the longest a load may take (the serve gate's bound): how long a turn is held or waited for
    life: Optional[str] = None  # its life token (components/preflight/liveness.py): a new one restarts it
    weights: Optional[str] = None  # the commit of a Hub download's weights: a new one restarts it
    ordered_turns: bool = True  # the nodes' load turns one after another (another stack shares a node), or at once
    after: tuple = ()  # what must exist before it starts: the stack's memory claims, each node's weights


class VllmServe(pulumi.ComponentResource):
    """One `vllm serve` process. Any change to its spec or secrets, or a new cluster, replaces it."""

    serve_id: pulumi.Output[str]

    def __init__(self, name: str, args: VllmServeArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:VllmServe", name, None, opts)
        keys = sorted(args.secrets)
        stdin = pulumi.Output.all(*(args.secrets[k] for k in keys)).apply(
            lambda values: start_script(dict(zip(keys, values))))
        life = [args.life] if args.life else []
        weights = [f"weights {args.weights}"] if args.weights else []
        create = shlex.join(["docker", "exec", "-i", args.head_container, "sh", "-s", "--",
                             *(f"--life={token}" for token in life), *serve_argv(args.serve, args.cluster)])
        # What replaces the serve replaces these too; the secrets enter only as a digest, itself a secret.
        digest = stdin.apply(lambda text: hashlib.sha256(text.encode()).hexdigest()[:16])
        triggers = [args.cluster_ready_id, create, digest, *weights]
        turns = load_turns(name, self, args.stack, args.cluster, args.sparks, triggers, args.load_s, args.after,
                           args.ordered_turns)
        nodes = {node: spark.connection for node, spark in args.sparks.items()}
        drops = page_cache_drops(name, self, nodes, triggers, turns) if args.serve.drop_page_cache else []
        process = command.remote.Command(
            f"{name}-process",
            connection=args.connection,
            create=create,
            delete=stop_command(args.head_container),
            stdin=stdin,
            triggers=[args.cluster_ready_id, *life, *weights],
            add_previous_output_in_env=False,
            # A fixed port and pid file: the old process must be gone before the new one starts.
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"], delete_before_replace=True,
                                        depends_on=[*turns, *drops] or None),
        )
        self.serve_id = process.id
        self.register_outputs({"serveId": self.serve_id, "log": LOG_FILE})
