"""Runs __main__.py under Pulumi's mocks and records every registration with its resource options.

The mocks give each resource an id derived from its inputs, so a resource whose inputs change gets a new id,
as a replacement does in the engine, and the change flows on to everything fed by that id.
"""

from __future__ import annotations

import hashlib
import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.rpc import _special_secret_sig as SECRET_SIG, _special_sig_key as SIG_KEY
from pulumi.runtime.settings import get_root_resource
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

ROOT = Path(__file__).resolve().parents[2]
# pulumi-docker plans a change of these Container fields as an in-place update (for `mounts` one Docker cannot
# apply, as the real plugin showed); every other input forces a replacement.
CONTAINER_IN_PLACE = {"restart", "maxRetryCount", "mustRun", "mounts", "cpuShares", "cpuSet", "memory",
                      "memoryReservation", "memorySwap"}


@dataclass
class Registration:
    urn: str
    type: str
    name: str
    id: str
    inputs: dict  # the request's property struct as JSON, secrets still wrapped
    provider: str
    dependencies: list[str]
    delete_before_replace: bool
    replace_on_changes: list[str]
    parent: str
    ignore_changes: list[str] = field(default_factory=list)
    replace_with: list[str] = field(default_factory=list)
    replacement_trigger: Any = None  # as JSON; None when not set

    def replace_key(self) -> str:
        """What the engine compares to decide on a replacement (the model this test suite checks)."""
        if self.type.startswith("pulumi:providers:") or "*" in self.replace_on_changes:
            watched = self.inputs
        elif self.type == "docker:index/container:Container":
            watched = {k: v for k, v in self.inputs.items() if k not in CONTAINER_IN_PLACE}
        else:
            watched = {k: v for k, v in self.inputs.items() if k in self.replace_on_changes or k == "name"}
        return _digest([watched, self.provider])


@dataclass
class Recording:
    resources: dict[str, Registration] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)  # the stack's

    def by_name(self, name: str) -> Registration:
        matches = [r for r in self.resources.values() if r.name == name]
        assert len(matches) == 1, f"{len(matches)} resources named {name}: {sorted(self.resources)}"
        return matches[0]

    def names(self, type_: str | None = None) -> set[str]:
        return {r.name for r in self.resources.values() if type_ is None or r.type == type_}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, stack_outputs: dict[str, dict[str, Any]] | None = None):
        self.stack_outputs = stack_outputs or {}  # other stacks' outputs, by full name, for StackReferences

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        if args.typ == "pulumi:pulumi:StackReference":
            outputs = self.stack_outputs.get(args.inputs["name"], {})
            return args.inputs["name"], {"outputs": outputs,
                                         "secretOutputNames": [k for k in outputs if k == "apiKey"]}
        rid = _digest([args.typ, args.name, args.inputs, args.provider])
        if args.typ == "pulumi:index:Stash":  # the engine's own: on create, what it keeps is what it was given
            state["output"] = args.inputs["input"]
        if args.typ == "docker:index/remoteImage:RemoteImage":
            state["imageId"] = "sha256:" + _digest(args.inputs["name"])
        return rid, state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, recording: Recording, mocks: _Mocks):
        super().__init__(mocks)
        self.recording = recording

    def ReadResource(self, request):  # a StackReference reads another stack
        response = super().ReadResource(request)
        self.recording.resources[response.urn] = Registration(
            urn=response.urn, type=request.type, name=request.name, id=request.id,
            inputs=json_format.MessageToDict(request.properties), provider=request.provider,
            dependencies=list(request.dependencies), delete_before_replace=False, replace_on_changes=[],
            parent=request.parent, ignore_changes=[], replace_with=[])
        return response

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.recording.resources[response.urn] = Registration(
                urn=response.urn, type=request.type, name=request.name, id=response.id,
                inputs=json_format.MessageToDict(request.object), provider=request.provider,
                dependencies=list(request.dependencies), delete_before_replace=request.deleteBeforeReplace,
                replace_on_changes=list(request.replaceOnChanges), parent=request.parent,
                ignore_changes=list(request.ignoreChanges), replace_with=list(request.replace_with),
                replacement_trigger=json_format.MessageToDict(request.replacement_trigger)
                if request.HasField("replacement_trigger") else None)
        return response


def run_program(config: dict[str, Any], secret_keys: tuple[str, ...] = (), stack: str = "test",
                stack_outputs: dict[str, dict[str, Any]] | None = None) -> Recording:
    """Runs the real __main__.py with `config` ({"spark-vllm:key": value}) and returns what it registered;
    `stack_outputs` are other stacks' outputs by full name (organization/spark-vllm/<stack>)."""
    recording = Recording()
    mocks = _Mocks(stack_outputs)
    pulumi.runtime.settings.ROOT.set(None)  # a new root stack, so that no run sees an earlier run's exports
    pulumi.runtime.set_mocks(mocks, project="spark-vllm", stack=stack, preview=False,
                             monitor=_RecordingMonitor(recording, mocks), organization="organization")
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()},
                                  list(secret_keys))
    pulumi.runtime.settings.SETTINGS.rpc_manager.clear()
    pulumi.runtime.settings.SETTINGS.outputs.clear()
    _sync_await(run_pulumi_func(lambda: runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")))
    root = get_root_resource()  # the mocks' stack, which holds the exports
    recording.outputs = _sync_await(pulumi.Output.from_input(getattr(root, "outputs", {})).future()) or {}
    return recording


def plain_strings(value: Any) -> list[str]:
    """Every string in a property struct that is not inside a secret."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return []
        return [s for v in value.values() for s in plain_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in plain_strings(v)]
    return [value] if isinstance(value, str) else []

