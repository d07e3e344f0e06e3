"""The pulumirpc.ResourceProvider gRPC service of the docker double.

On top of what every double answers alike (providerkit's ProviderDouble: handshake, plugin info, UNIMPLEMENTED
for the rest), it answers provider config (CheckConfig/DiffConfig/Configure), resource CRUD
(Check/Diff/Create/Read/Update/Delete) and Cancel. Its warnings, such as calls it does not implement, are also
shown in the engine's output.
"""

import logging

from google.protobuf import empty_pb2
from providerkit import engine_log, rpc, values
from providerkit.servicer import ProviderDouble
from pulumi.runtime.proto import provider_pb2

from . import container, provider_config, remote_image
from .dockerapi import ConnectError, DockerError, DockerHost

log = logging.getLogger("docker-double")

RESOURCES = {container.TOKEN: container, remote_image.TOKEN: remote_image}
ENGINE_LOG_TIMEOUT_S = 5


class DockerDouble(ProviderDouble):
    LABEL = "docker test double"
    EMULATED_VERSION = "5.2.0"
    EXPECTED_ERRORS = (DockerError, ConnectError, RuntimeError, ValueError)
    log = log

    def __init__(self, engine_address: str | None):
        # Warnings are on stderr too, so one the engine did not take is only worth a DEBUG line.
        super().__init__(engine_log.EngineLog(engine_address, log, self.LABEL, ENGINE_LOG_TIMEOUT_S, logging.DEBUG))
        self.client: DockerHost | None = None
        self.unconfigured_reason = "the provider has not been configured"

    def warn(self, message: str, urn: str = "") -> None:
        """Warnings (unknown calls, containers removed on refresh) also go to the engine: the CLI shows them."""
        super().warn(message)
        self.engine.send(urn, message, engine_log.WARNING, ephemeral=False)

    def _client(self) -> DockerHost:
        if self.client is None:
            raise rpc.UsageError(f"docker test double: no Docker connection ({self.unconfigured_reason})")
        return self.client

    def _resource(self, request):
        token = rpc.type_of(request)
        module = RESOURCES.get(token)
        if module is None:
            raise rpc.UsageError(f"the docker test double does not implement resource type {token!r}")
        return module

    def cancel(self) -> None:
        """Nothing waits to be cancelled: like upstream, Create returns once the container is started."""

    # --- provider configuration ----------------------------------------------------------------------------

    @rpc.method
    def CheckConfig(self, request, context):
        return rpc.check_response(*provider_config.check(values.decode(request.news)))

    @rpc.method
    def DiffConfig(self, request, context):
        olds = values.decode(request.old_inputs) if request.HasField("old_inputs") else values.decode(request.olds)
        changes = provider_config.diff(olds, values.decode(request.news))
        return rpc.diff_response(changes, bool(changes))

    @rpc.method
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
        return self.configured()

    # --- resources -----------------------------------------------------------------------------------------

    @rpc.method
    def Check(self, request, context):
        module = self._resource(request)
        return rpc.check_response(*module.check(values.decode(request.news)))

    @rpc.method
    def Diff(self, request, context):
        module = self._resource(request)
        news = values.decode(request.news)
        changes = module.diff(values.decode(request.olds), news)
        for ignored in request.ignoreChanges:
            changes.pop(ignored, None)
        return rpc.diff_response(changes, bool(changes), delete_before_replace=module is container)

    @rpc.method
    def Create(self, request, context):
        module = self._resource(request)
        news = values.decode(request.properties)
        if request.preview:
            return provider_pb2.CreateResponse(id="", properties=values.encode(module.preview_outputs(news)))
        if module is container:
            rid, outputs = container.create(self._client(), news)
        else:
            rid, outputs = remote_image.create(self._client(), news)
        return provider_pb2.CreateResponse(id=rid, properties=values.encode(outputs))

    @rpc.method
    def Read(self, request, context):
        module = self._resource(request)
        state, inputs = values.decode(request.properties), values.decode(request.inputs)
        if module is container:
            rid, outputs, new_inputs = container.read(self._client(), request.id, state, inputs)
        else:
            rid, outputs, new_inputs = remote_image.read(self._client(), state, inputs)
        return provider_pb2.ReadResponse(id=rid, properties=values.encode(outputs), inputs=values.encode(new_inputs))

    @rpc.method
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

    @rpc.method
    def Delete(self, request, context):
        module = self._resource(request)
        if module is container:
            container.delete(self._client(), request.id)
        else:
            remote_image.delete(self._client(), values.decode(request.properties))
        return empty_pb2.Empty()
