"""gRPC plumbing any provider double needs, independent of what it emulates.

Errors become gRPC statuses whose message the engine prints; calls a double does not implement are reported
(see `ProviderDouble.warn`) and answered UNIMPLEMENTED; Check and Diff results are put in their protos.
"""

import functools

import grpc
from pulumi.runtime.proto import provider_pb2

from . import values

REPLACE_KINDS = frozenset({provider_pb2.PropertyDiff.ADD_REPLACE, provider_pb2.PropertyDiff.DELETE_REPLACE,
                           provider_pb2.PropertyDiff.UPDATE_REPLACE})


class UsageError(Exception):
    """The program asked for something the double refuses; reported to the engine as an error."""


class CheckFailures(list):
    """(property path, reason) pairs, the CheckFailure entries of a Check response."""

    def add(self, prop: str, reason: str) -> None:
        self.append((prop, reason))


def type_of(request) -> str:
    if getattr(request, "type", ""):
        return request.type
    # urn:pulumi:<stack>::<project>::<parent types $-joined>::<name>
    return request.urn.split("::")[2].split("$")[-1]


def name_of(request) -> str:
    return getattr(request, "name", "") or request.urn.split("::")[-1]


def method(fn):
    """Decorator for methods of a `ProviderDouble`: logs the call; UsageError and the double's EXPECTED_ERRORS
    become UNKNOWN with their message (what a provider returns for a failed operation), anything else INTERNAL
    naming the double."""
    @functools.wraps(fn)
    def wrapper(self, request, context):
        self.log.debug("%s %s", fn.__name__, getattr(request, "urn", ""))
        try:
            return fn(self, request, context)
        except (UsageError, *self.EXPECTED_ERRORS) as err:
            self.log.info("%s failed: %s", fn.__name__, err)
            context.abort(grpc.StatusCode.UNKNOWN, str(err))
        except Exception as err:
            self.log.exception("%s: internal error", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{self.LABEL} internal error in {fn.__name__}: {err!r}")
    return wrapper


def unimplemented(name: str):
    """A `ProviderDouble` method that reports the call, so a missing piece is visible, and answers UNIMPLEMENTED."""
    def fn(self, request, context):
        self.warn(f"{self.LABEL}: the engine called {name}, which the double does not implement")
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"the {self.LABEL} does not implement {name}")
    fn.__name__ = name
    return fn


class UnknownCalls(grpc.GenericRpcHandler):
    """Catches methods the bundled protos do not know (e.g. from a newer engine) and reports them; gRPC then
    answers UNIMPLEMENTED."""

    def __init__(self, label: str, warn):
        self.label, self.warn = label, warn

    def service(self, handler_call_details):
        name = handler_call_details.method
        if name not in ("", "/"):  # the engine's readiness probe calls an empty method and expects UNIMPLEMENTED
            self.warn(f"{self.label}: the engine called unknown gRPC method {name}")
        return None


def check_response(inputs, failures: CheckFailures) -> provider_pb2.CheckResponse:
    return provider_pb2.CheckResponse(
        inputs=values.encode(inputs),
        failures=[provider_pb2.CheckFailure(property=p, reason=r) for p, r in failures])


def diff_response(detailed: dict[str, int], has_changes: bool,
                  delete_before_replace: bool = False) -> provider_pb2.DiffResponse:
    """`detailed` maps property paths ("triggers[0]", or top-level names) to PropertyDiff kinds."""
    if not has_changes:
        return provider_pb2.DiffResponse(changes=provider_pb2.DiffResponse.DIFF_NONE, hasDetailedDiff=True)
    replaces = sorted(k for k, kind in detailed.items() if kind in REPLACE_KINDS)
    return provider_pb2.DiffResponse(
        changes=provider_pb2.DiffResponse.DIFF_SOME,
        diffs=sorted({_root(path) for path in detailed}),
        replaces=replaces,
        detailedDiff={k: provider_pb2.PropertyDiff(kind=kind) for k, kind in detailed.items()},
        hasDetailedDiff=True,
        deleteBeforeReplace=bool(replaces) and delete_before_replace)


def _root(path: str) -> str:
    """Top-level property of a property path: `triggers[0]` -> `triggers`, `a.b` -> `a`, `["x.y"]` -> `x.y`."""
    if path.startswith('["'):
        return path[2:path.index('"]')]
    for i, ch in enumerate(path):
        if ch in ".[":
            return path[:i]
    return path
