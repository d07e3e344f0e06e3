"""The weights from the Hugging Face Hub (`serve.hub`): one `command.remote.Command` on the node that downloads.

It runs components/remote/hub_download.sh, which fetches the planned files of one commit inside the model's image.
Its triggers name the repo, the commit and the files, so the preview shows the commit a branch resolved to, and a
new revision runs it again. It runs only when preflight found the node's weights short of that commit's
(components/nodes/hub_plan.py): otherwise its inputs are ignored, so a no-op preview shows no changes. What it
fetched reaches the other nodes by the weights sync, which runs after it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_command as command

from ..config.spec import Deployment
from ..nodes.hub_plan import HubPlan
from ..remote import script, with_progress

RECORD = ".cache/spark-vllm/hub.json"  # what a download recorded, beside the weights; the probe reads it
IGNORED_WHEN_CURRENT = ["triggers", "create", "stdin", "connection"]


def container_name(stack: str) -> str:
    return f"spark-vllm-{stack}-hub-download"


def download_spec(deployment: Deployment, plan: HubPlan) -> dict:
    hub = deployment.serve.hub
    assert hub is not None and plan.selection is not None and plan.commit is not None
    return {"repo": hub.repo, "revision": hub.revision, "commit": plan.commit, "endpoint": hub.endpoint,
            "path": deployment.serve.model_path, "node": deployment.source.name, "stallSeconds": hub.stall_s,
            "files": [[f.path, f.size, f.etag] for f in plan.files], "fetch": [f.path for f in plan.selection.fetched]}


def download_program(spec: dict, token: Optional[str]) -> str:
    """components/remote/hub_download.py with the spec and the token inlined as base64 (no value can end the text)."""
    program = with_progress("hub_download.py").replace("@SPEC@",
                                                        base64.b64encode(json.dumps(spec).encode()).decode())
    return program.replace("@TOKEN@", base64.b64encode((token or "").encode()).decode())


def download_script(spec: dict, token: Optional[str]) -> str:
    """The wrapper with the program inlined: a secret whenever the token is."""
    return script("hub_download.sh").replace("@PROGRAM@", download_program(spec, token))


def triggers(spec: dict, needed: bool, now: Optional[float] = None) -> list[str]:
    files = hashlib.sha256(json.dumps([spec["files"], spec["fetch"]]).encode()).hexdigest()[:16]
    found = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    return [f"{spec['repo']}@{spec['commit']} ({spec['revision']})", f"{len(spec['fetch'])} files {files}",
            *([f"found short at {found}"] if needed else [])]


@dataclass
class WeightsDownloadArgs:
    deployment: Deployment
    plan: HubPlan  # a plan with a commit (preflight fails the stack otherwise)
    connection: command.remote.ConnectionArgs  # of the node that downloads
    after: Sequence[pulumi.Resource]  # that node's image: the download runs in it
    token: Optional[pulumi.Input[str]] = None  # a secret: the stack's hfToken


class WeightsDownload(pulumi.ComponentResource):
    """The planned files of one commit, fetched into the weights' path on one node."""

    done: command.remote.Command

    def __init__(self, name: str, args: WeightsDownloadArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:WeightsDownload", name, None, opts)
        deployment = args.deployment
        spec = download_spec(deployment, args.plan)
        stdin = pulumi.Output.from_input(args.token).apply(lambda token: download_script(spec, token))
        self.done = command.remote.Command(
            f"{name}-{deployment.source.name}",
            connection=args.connection,
            create=shlex.join(["sh", "-s", "--", container_name(deployment.stack), deployment.serve.image,
                               deployment.serve.model_path]),
            stdin=stdin,
            triggers=triggers(spec, args.plan.needed),
            add_previous_output_in_env=False,
            # Bounded by its own stall timeout, not a total one: pulumi-command enforces no customTimeouts.
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["*"], depends_on=list(args.after),
                                        ignore_changes=None if args.plan.needed else IGNORED_WHEN_CURRENT))
        self.register_outputs({"commit": args.plan.commit, "downloadId": self.done.id})
