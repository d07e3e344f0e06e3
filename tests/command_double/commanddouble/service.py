"""The pulumirpc.ResourceProvider gRPC service of the command double.

It answers what the Pulumi engine calls on a resource provider: handshake and plugin info, provider config
(pulumi-command has none), resource CRUD for command:remote:Command and Cancel. Other calls are logged to stderr
and answered UNIMPLEMENTED.
"""

import logging

from dockerdouble import props, values
from google.protobuf import empty_pb2
from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc

from . import engine_log, remote_command, rpc, ssh_session

log = logging.getLogger("command-double")

LABEL = "command test double"
EMULATED_VERSION = "1.2.1"
ENGINE_CONFIG_KEYS = frozenset({"version", "pluginDownloadURL"})
EXPECTED_ERRORS = (remote_command.CommandFailed, ssh_session.DialError, ssh_session.Cancelled, ValueError)

_rpc = rpc.method(LABEL, log, EXPECTED_ERRORS)


def _command_type(request) -> None:
    token = rpc.type_of(request)
    if token != remote_command.TOKEN:
        raise rpc.UsageError(f"the command test double implements only {remote_command.TOKEN}, "
                             f"not resource type {token!r}")


class CommandDouble(provider_pb2_grpc.ResourceProviderServicer):
    def __init__(self, engine_address: str | None):
        self.engine = engine_log.EngineLog(engine_address)
        self.procs = ssh_session.Processes()

    def _runner(self, request) -> remote_command.Runner:
        return remote_command.Runner(self.procs, self.engine, request.urn)

    # --- plugin and protocol -------------------------------------------------------------------------------

    @_rpc
    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=EMULATED_VERSION)

    @_rpc
    def Handshake(self, request, context):
        self.engine.retarget(request.engine_address)
        return provider_pb2.ProviderHandshakeResponse(accept_secrets=True, accept_resources=True,
                                                      accept_outputs=False)

    @_rpc
    def Attach(self, request, context):
        self.engine.retarget(request.address)
        return empty_pb2.Empty()

    @_rpc
    def Cancel(self, request, context):
        self.procs.cancel()
        return empty_pb2.Empty()

    # --- provider configuration: pulumi-command has no settings ------------------------------------------------

    @_rpc
    def CheckConfig(self, request, context):
        news = values.decode(request.news)
        failures = props.CheckFailures()
        for key in sorted(set(news) - ENGINE_CONFIG_KEYS):
            failures.add(key, f"the command test double does not implement provider config '{key}' "
                              "(pulumi-command has no provider configuration)")
        return rpc.check_response(news, failures)

    @_rpc
    def DiffConfig(self, request, context):
        return rpc.diff_response({}, has_changes=False)

    @_rpc
    def Configure(self, request, context):
        return provider_pb2.ConfigureResponse(acceptSecrets=True, supportsPreview=True, acceptResources=True,
                                              acceptOutputs=False)

    # --- resources -----------------------------------------------------------------------------------------

    @_rpc
    def Check(self, request, context):
        _command_type(request)
        return rpc.check_response(*remote_command.check(values.decode(request.news)))

    @_rpc
    def Diff(self, request, context):
        _command_type(request)
        olds, news = values.decode(request.olds), values.decode(request.news)
        for ignored in request.ignoreChanges:  # infer keeps the old value of ignored top-level properties
            if ignored in olds:
                news[ignored] = olds[ignored]
            else:
                news.pop(ignored, None)
        return rpc.diff_response(*remote_command.diff(olds, news))

    @_rpc
    def Create(self, request, context):
        _command_type(request)
        rid, outputs = self._runner(request).create(rpc.name_of(request), values.decode(request.properties),
                                                    request.preview)
        return provider_pb2.CreateResponse(id=rid, properties=values.encode(outputs))

    @_rpc
    def Read(self, request, context):
        _command_type(request)
        return provider_pb2.ReadResponse(id=request.id, properties=request.properties, inputs=request.inputs)

    @_rpc
    def Update(self, request, context):
        _command_type(request)
        outputs = self._runner(request).update(values.decode(request.olds), values.decode(request.news),
                                               request.preview)
        return provider_pb2.UpdateResponse(properties=values.encode(outputs))

    @_rpc
    def Delete(self, request, context):
        _command_type(request)
        self._runner(request).delete(values.decode(request.properties))
        return empty_pb2.Empty()

    # --- not implemented: logged so a missing piece is visible -----------------------------------------------

    GetSchema = rpc.unimplemented(LABEL, log, "GetSchema")
    Parameterize = rpc.unimplemented(LABEL, log, "Parameterize")
    Invoke = rpc.unimplemented(LABEL, log, "Invoke")
    Call = rpc.unimplemented(LABEL, log, "Call")
    Construct = rpc.unimplemented(LABEL, log, "Construct")
    List = rpc.unimplemented(LABEL, log, "List")
    GetMapping = rpc.unimplemented(LABEL, log, "GetMapping")
    GetMappings = rpc.unimplemented(LABEL, log, "GetMappings")
