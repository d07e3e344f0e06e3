"""Pulumi's structural diff of property maps, as a provider built on pulumi-go-provider's `infer` returns it.

`infer` diffs the old inputs against the new ones with `resource.PropertyMap.Diff` and turns the result into a
detailedDiff with `plugin.NewDetailedDiffFromObjectDiff`: one entry per changed leaf, keyed by property path
(`triggers[0]`, `a.b`), kind ADD/DELETE/UPDATE. Arrays compare element by element, plain objects key by key;
anything else (secrets, unknowns, assets) compares as a whole. A null value counts as absent. The engine then
turns entries into replacements for paths the program lists in `replaceOnChanges`.

Values are those `providerkit.values.decode` returns (JSON-like, with signature-keyed wrappers).
"""

import json
import re

from providerkit import values
from pulumi.runtime.proto import provider_pb2

ADD = provider_pb2.PropertyDiff.ADD
DELETE = provider_pb2.PropertyDiff.DELETE
UPDATE = provider_pb2.PropertyDiff.UPDATE
AS_REPLACE = {ADD: provider_pb2.PropertyDiff.ADD_REPLACE, DELETE: provider_pb2.PropertyDiff.DELETE_REPLACE,
              UPDATE: provider_pb2.PropertyDiff.UPDATE_REPLACE}

_SIMPLE_KEY = re.compile(r'^[^.\[\]"]+$')


def detailed_diff(olds: dict, news: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    _objects(olds, news, [], out)
    return out


def _is_object(value) -> bool:
    return isinstance(value, dict) and values.SIG_KEY not in value


def equal(a, b) -> bool:
    """PropertyValue.DeepEquals: null-valued object keys do not count; numbers compare by value."""
    if _is_object(a) and _is_object(b):
        keys = {k for k, v in a.items() if v is not None} | {k for k, v in b.items() if v is not None}
        return all(equal(a.get(k), b.get(k)) for k in keys)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):  # secrets, assets, resource references: wrapper and content
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if _number(a) and _number(b):
        return a == b
    return type(a) is type(b) and a == b


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _objects(olds: dict, news: dict, path: list, out: dict) -> None:
    for key in sorted(set(olds) | set(news)):
        old, new = olds.get(key), news.get(key)
        if old is None and new is None or equal(old, new):
            continue
        here = path + [key]
        if old is None:
            out[path_string(here)] = ADD
        elif new is None:
            out[path_string(here)] = DELETE
        else:
            _changed(old, new, here, out)


def _changed(old, new, path: list, out: dict) -> None:
    if isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            if i >= len(old):
                out[path_string(path + [i])] = ADD
            elif i >= len(new):
                out[path_string(path + [i])] = DELETE
            elif not equal(old[i], new[i]):
                _changed(old[i], new[i], path + [i], out)
    elif _is_object(old) and _is_object(new):
        _objects(old, new, path, out)
    elif old is None:
        out[path_string(path)] = ADD
    elif new is None:
        out[path_string(path)] = DELETE
    else:
        out[path_string(path)] = UPDATE


def path_string(path: list) -> str:
    """resource.PropertyPath.String(): `a.b[0]`, with keys that would not parse back written `["k.e.y"]`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _SIMPLE_KEY.match(part):
            text += ("." if text else "") + part
        else:
            text += f"[{json.dumps(part)}]"
    return text
