"""Pulumi property values as they travel in google.protobuf.Struct.

The engine marks special values with a signature key: secrets, resource references and output values are
objects, unknowns (computed values during preview) are a sentinel string. A double keeps the marked form
in what it returns (so secrets stay secret in the state) and uses `plain` values to act (talk to Docker, run
a command).
"""

from google.protobuf import json_format, struct_pb2

SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
RESOURCE_SIG = "5cf8f73096256a8f31e491e813e4eb8e"
OUTPUT_SIG = "d0e6a833031e9bbcd3f4e8bde6ca49a4"
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


def decode(struct: struct_pb2.Struct) -> dict:
    return json_format.MessageToDict(struct)


def encode(props: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(props)
    return struct


def _sig(value) -> str | None:
    return value.get(SIG_KEY) if isinstance(value, dict) else None


def is_secret(value) -> bool:
    return _sig(value) == SECRET_SIG


def secret(value) -> dict:
    return {SIG_KEY: SECRET_SIG, "value": value}


def contains_unknown(value) -> bool:
    if value == UNKNOWN:
        return True
    sig = _sig(value)
    if sig == OUTPUT_SIG:
        return "value" not in value or contains_unknown(value["value"])
    if sig == SECRET_SIG:
        return contains_unknown(value.get("value"))
    if sig == RESOURCE_SIG:
        return False
    if isinstance(value, dict):
        return any(contains_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_unknown(v) for v in value)
    return False


def plain(value):
    """The value with secret/output wrappers removed and integral numbers as int (Struct numbers are doubles)."""
    sig = _sig(value)
    if sig in (SECRET_SIG, OUTPUT_SIG):
        return plain(value.get("value"))
    if sig == RESOURCE_SIG:
        return plain(value.get("id") or value.get("urn"))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def like(old_raw, new_plain):
    """`new_plain` wrapped as a secret if `old_raw` was one, so refreshed values keep their secrecy."""
    return secret(new_plain) if is_secret(old_raw) else new_plain
