"""The pulumirpc.ResourceProvider gRPC service of the command double.

On top of what every double answers alike (providerkit's ProviderDouble: handshake, plugin info, UNIMPLEMENTED
for the rest, logged to stderr), it answers provider config (pulumi-command has none), resource CRUD for
command:remote:Command and Cancel.
"""

import logging

from google.protobuf import empty_pb2
from providerkit import engine_log, rpc, values
from providerkit.servicer import ProviderDouble
from pulumi.runtime.proto import provider_pb2

from . import remote_command, ssh_session

log = logging.getLogger("command-double")

ENGINE_CONFIG_KEYS = frozenset({"version", "pluginDownloadURL"})
ENGINE_LOG_TIMEOUT_S = 30


def _command_type(request) -> None:
    token = rpc.type_of(request)
    if token != remote_command.TOKEN:
        raise rpc.UsageError(f"the command test double implements only {remote_command.TOKEN}, "
                             f"not resource type {token!r}")


class CommandDouble(ProviderDouble):
    LABEL = "command test double"
    EMULATED_VERSION = "1.2.1"
    EXPECTED_ERRORS = (remote_command.CommandFailed, ssh_session.DialError, ssh_session.Cancelled, ValueError)
    log = log

    def __init__(self, engine_address: str | None):
        # Command output lines exist nowhere else for the user, so one the engine did not take is a warning.
        super().__init__(engine_log.EngineLog(engine_address, log, self.LABEL, ENGINE_LOG_TIMEOUT_S,
                                              logging.WARNING))
        self.procs = ssh_session.Processes()

    def _runner(self, request) -> remote_command.Runner:
        return remote_command.Runner(self.procs, self.engine, request.urn)

    def cancel(self) -> None:
        self.procs.close()  # running commands finish, as upstream's do

    # --- provider configuration: pulumi-command has no settings ------------------------------------------------

    @rpc.method
    def CheckConfig(self, request, context):
        news = values.decode(request.news)
        failures = rpc.CheckFailures()
        for key in sorted(set(news) - ENGINE_CONFIG_KEYS):
            failures.add(key, f"the command test double does not implement provider config '{key}' "
                              "(pulumi-command has no provider configuration)")
        return rpc.check_response(news, failures)

    @rpc.method
    def DiffConfig(self, request, context):
        return rpc.diff_response({}, has_changes=False)

    @rpc.method
    def Configure(self, request, context):
        return self.configured()

    # --- resources -----------------------------------------------------------------------------------------

    @rpc.method
    def Check(self, request, context):
        _command_type(request)
        return rpc.check_response(*remote_command.check(values.decode(request.news)))

    @rpc.method
    def Diff(self, request, context):
        _command_type(request)
        olds, news = values.decode(request.olds), values.decode(request.news)
        for ignored in request.ignoreChanges:  # infer keeps the old value of ignored top-level properties
            if ignored in olds:
                news[ignored] = olds[ignored]
            else:
                news.pop(ignored, None)
        return rpc.diff_response(*remote_command.diff(olds, news))

    @rpc.method
    def Create(self, request, context):
        _command_type(request)
        rid, outputs = self._runner(request).create(rpc.name_of(request), values.decode(request.properties),
                                                    request.preview)
        return provider_pb2.CreateResponse(id=rid, properties=values.encode(outputs))

    @rpc.method
    def Read(self, request, context):
        _command_type(request)
        return provider_pb2.ReadResponse(id=request.id, properties=request.properties, inputs=request.inputs)

    @rpc.method
    def Update(self, request, context):
        _command_type(request)
        outputs = self._runner(request).update(values.decode(request.olds), values.decode(request.news),
                                               request.preview)
        return provider_pb2.UpdateResponse(properties=values.encode(outputs))

    @rpc.method
    def Delete(self, request, context):
        _command_type(request)
        self._runner(request).delete(values.decode(request.properties))
        return empty_pb2.Empty()
