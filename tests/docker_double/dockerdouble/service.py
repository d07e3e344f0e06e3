"""The pulumirpc.ResourceProvider gRPC service of the double.

It answers what the Pulumi engine calls on a resource provider: handshake and plugin info, provider config
(CheckConfig/DiffConfig/Configure), resource CRUD (Check/Diff/Create/Read/Update/Delete) and Cancel. Calls it
does not implement are answered UNIMPLEMENTED and reported as warnings in the engine's output.
"""

import functools
import logging
import threading

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc

from . import container, props, provider_config, remote_image, values
from .dockerapi import ConnectError, DockerError, DockerHost
from .engine_log import EngineLog

log = logging.getLogger("docker-double")

EMULATED_VERSION = "5.2.0"
RESOURCES = {container.TOKEN: container, remote_image.TOKEN: remote_image}


class UsageError(Exception):
    """The program asked for something the double refuses; reported to the engine as an error."""


def _type_of(request) -> str:
    if getattr(request, "type", ""):
        return request.type
    # urn:pulumi:<stack>::<project>::<parent types $-joined>::<name>
    return request.urn.split("::")[2].split("$")[-1]


def _rpc(method):
    """Log the call and turn failures into gRPC errors whose message the engine prints."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        log.debug("%s %s", method.__name__, getattr(request, "urn", ""))
        try:
            return method(self, request, context)
        except (UsageError, DockerError, ConnectError, RuntimeError, ValueError) as err:
            log.info("%s failed: %s", method.__name__, err)
            context.abort(grpc.StatusCode.UNKNOWN, str(err))
        except Exception as err:
            log.exception("%s: internal error", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"docker test double internal error in {method.__name__}: {err!r}")
    return wrapper


def _unimplemented(name: str):
    def method(self, request, context):
        self.engine_log.warn(f"docker test double: the engine called {name}, which the double does not implement")
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"the docker test double does not implement {name}")
    method.__name__ = name
    return method


def _check_response(inputs: dict, failures: props.CheckFailures) -> provider_pb2.CheckResponse:
    return provider_pb2.CheckResponse(
        inputs=values.encode(inputs),
        failures=[provider_pb2.CheckFailure(property=p, reason=r) for p, r in failures])


def _diff_response(changes: dict[str, int], delete_before_replace: bool) -> provider_pb2.DiffResponse:
    if not changes:
        return provider_pb2.DiffResponse(changes=provider_pb2.DiffResponse.DIFF_NONE, hasDetailedDiff=True)
    replace = props.is_replacement(changes)
    return provider_pb2.DiffResponse(
        changes=provider_pb2.DiffResponse.DIFF_SOME,
        diffs=list(changes),
        replaces=[k for k, kind in changes.items() if kind in (props.ADD_REPLACE, props.DELETE_REPLACE,
                                                                props.UPDATE_REPLACE)],
        detailedDiff={k: provider_pb2.PropertyDiff(kind=kind) for k, kind in changes.items()},
        hasDetailedDiff=True,
        deleteBeforeReplace=replace and delete_before_replace)


class DockerDouble(provider_pb2_grpc.ResourceProviderServicer):
    def __init__(self, engine_log: EngineLog):
        self.engine_log = engine_log
        self.client: DockerHost | None = None
        self.unconfigured_reason = "the provider has not been configured"
        self.cancelled = threading.Event()

    def _client(self) -> DockerHost:
        if self.client is None:
            raise UsageError(f"docker test double: no Docker connection ({self.unconfigured_reason})")
        return self.client

    def _resource(self, request):
        token = _type_of(request)
        module = RESOURCES.get(token)
        if module is None:
            raise UsageError(f"the docker test double does not implement resource type {token!r}")
        return module

    # --- plugin and protocol -------------------------------------------------------------------------------

    @_rpc
    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=EMULATED_VERSION)

    @_rpc
    def Handshake(self, request, context):
        self.engine_log.attach(request.engine_address)
        return provider_pb2.ProviderHandshakeResponse(accept_secrets=True, accept_resources=True,
                                                      accept_outputs=False)

    @_rpc
    def Attach(self, request, context):
        self.engine_log.attach(request.address)
        return empty_pb2.Empty()

    @_rpc
    def Cancel(self, request, context):
        self.cancelled.set()
        return empty_pb2.Empty()

    # --- provider configuration ----------------------------------------------------------------------------

    @_rpc
    def CheckConfig(self, request, context):
        return _check_response(*provider_config.check(values.decode(request.news)))

    @_rpc
    def DiffConfig(self, request, context):
        olds = values.decode(request.old_inputs) if request.HasField("old_inputs") else values.decode(request.olds)
        return _diff_response(provider_config.diff(olds, values.decode(request.news)), False)

    @_rpc
    def Configure(self, request, context):
        if request.HasField("args"):
            args = values.decode(request.args)
        else:  # engines that only send `variables` key them as "docker:config:<name>"
            args = {key.rsplit(":", 1)[-1]: value for key, value in request.variables.items()}
        target = provider_config.from_configure(args)
        if target is None:
            self.unconfigured_reason = "the provider's host or sshOpts were unknown when it was configured"
        else:
            host, opts = target
            client = DockerHost(host, opts)
            client.ping()  # pulumi-docker checks the daemon when it is configured
            if self.client is not None:
                self.client.close()
            self.client = client
        return provider_pb2.ConfigureResponse(acceptSecrets=True, supportsPreview=True, acceptResources=True,
                                              acceptOutputs=False)

    # --- resources -----------------------------------------------------------------------------------------

    @_rpc
    def Check(self, request, context):
        module = self._resource(request)
        return _check_response(*module.check(values.decode(request.news)))

    @_rpc
    def Diff(self, request, context):
        module = self._resource(request)
        news = values.decode(request.news)
        changes = module.diff(values.decode(request.olds), news)
        for ignored in request.ignoreChanges:
            changes.pop(ignored, None)
        return _diff_response(changes, delete_before_replace=module is container)

    @_rpc
    def Create(self, request, context):
        module = self._resource(request)
        news = values.decode(request.properties)
        if request.preview:
            return provider_pb2.CreateResponse(id="", properties=values.encode(module.preview_outputs(news)))
        if module is container:
            rid, outputs = container.create(self._client(), news, self.cancelled)
        else:
            rid, outputs = remote_image.create(self._client(), news)
        return provider_pb2.CreateResponse(id=rid, properties=values.encode(outputs))

    @_rpc
    def Read(self, request, context):
        module = self._resource(request)
        state, inputs = values.decode(request.properties), values.decode(request.inputs)
        if module is container:
            rid, outputs, new_inputs = container.read(self._client(), request.id, state, inputs,
                                                      lambda message: self.engine_log.warn(message, request.urn))
        else:
            rid, outputs, new_inputs = remote_image.read(self._client(), state, inputs)
        return provider_pb2.ReadResponse(id=rid, properties=values.encode(outputs), inputs=values.encode(new_inputs))

    @_rpc
    def Update(self, request, context):
        module = self._resource(request)
        olds, news = values.decode(request.olds), values.decode(request.news)
        if module is container:
            outputs = container.update(None if request.preview else self._client(), request.id, olds, news,
                                       request.preview)
        elif request.preview:
            outputs = {**olds, **news}
        else:
            outputs = remote_image.update(self._client(), news)
        return provider_pb2.UpdateResponse(properties=values.encode(outputs))

    @_rpc
    def Delete(self, request, context):
        module = self._resource(request)
        if module is container:
            container.delete(self._client(), request.id)
        else:
            remote_image.delete(self._client(), values.decode(request.properties))
        return empty_pb2.Empty()

    # --- not implemented: logged so a missing piece is visible -----------------------------------------------

    GetSchema = _unimplemented("GetSchema")
    Parameterize = _unimplemented("Parameterize")
    Invoke = _unimplemented("Invoke")
    Call = _unimplemented("Call")
    Construct = _unimplemented("Construct")
    List = _unimplemented("List")
    GetMapping = _unimplemented("GetMapping")
    GetMappings = _unimplemented("GetMappings")


class UnknownCalls(grpc.GenericRpcHandler):
    """Reports methods the bundled protos do not know (e.g. from a newer engine); gRPC answers UNIMPLEMENTED."""

    def __init__(self, engine_log: EngineLog):
        self.engine_log = engine_log

    def service(self, handler_call_details):
        method = handler_call_details.method
        if method not in ("", "/"):  # an empty method is the engine's readiness probe
            self.engine_log.warn(f"docker test double: the engine called unknown gRPC method {method}")
        return None
