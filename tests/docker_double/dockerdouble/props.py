"""Property tables and the diff rules pulumi-docker (a bridged Terraform provider) applies to them.

Terraform semantics carried over: a ForceNew property that changes forces a replacement; an Optional+Computed
property that the program stops setting keeps its old value (no diff); a property with a default compares
as that default when absent; set-typed properties compare without regard to order.
"""

import json
from dataclasses import dataclass, field

from providerkit import values
from providerkit.rpc import CheckFailures

# PropertyDiff kinds (pulumirpc.PropertyDiff.Kind)
ADD, ADD_REPLACE, DELETE, DELETE_REPLACE, UPDATE, UPDATE_REPLACE = range(6)


@dataclass(frozen=True)
class Prop:
    force_new: bool = True
    computed: bool = False
    default: object = None
    is_set: bool = False                 # Terraform TypeSet: order does not matter
    empty_is_noop: bool = False          # DiffSuppressFunc treating "" as "keep old"
    # ForceNew, yet a known change is planned in place (the real plugin's diff of `mounts`, seen, not documented)
    known_change_in_place: bool = False
    fields: frozenset = field(default_factory=frozenset)  # allowed keys of object elements
    required_fields: frozenset = field(default_factory=frozenset)


def check_names(token_label: str, table: dict, news: dict, failures: CheckFailures) -> None:
    """Refuse every property (and nested object key) the double does not implement, naming it."""
    for key, value in news.items():
        prop = table.get(key)
        if prop is None:
            failures.add(key, f"the docker test double does not implement {token_label} property '{key}'")
            continue
        if not prop.fields or values.contains_unknown(value):
            continue
        items = values.plain(value)
        for index, item in enumerate(items if isinstance(items, list) else [items]):
            path = f"{key}[{index}]" if isinstance(items, list) else key
            if not isinstance(item, dict):
                failures.add(path, f"{path} must be an object")
                continue
            for sub in item:
                if sub not in prop.fields:
                    failures.add(f"{path}.{sub}", f"the docker test double does not implement {token_label} "
                                                  f"property '{path}.{sub}'")
            for sub in prop.required_fields - set(item):
                failures.add(f"{path}.{sub}", f"{path}.{sub} is required")


def _unset(value):
    """Terraform's view: an empty string, list or object, zero and false are the same as absent (the real
    plugin writes them all into its state, the program sends none of them)."""
    if isinstance(value, dict):
        value = {k: v for k, v in ((k, _unset(v)) for k, v in value.items()) if v is not None}
    elif isinstance(value, list):
        value = [_unset(v) for v in value]
    return None if value in ("", [], {}, 0, False) and value is not True else value


def _normalized(prop: Prop, value):
    value = _unset(values.plain(value))
    if prop.is_set and isinstance(value, list):
        return sorted(json.dumps(v, sort_keys=True) for v in value)
    if isinstance(value, dict):  # e.g. capabilities {adds, drops}: nested string sets
        return {k: sorted(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


def diff(table: dict, olds: dict, news: dict) -> dict[str, int]:
    """Top-level property -> PropertyDiff kind, for every property whose value changes."""
    changes = {}
    for key in sorted(set(table) & (set(olds) | set(news))):
        prop = table[key]
        old = olds.get(key, prop.default)
        if key in news:
            new = news[key]
            if new == values.UNKNOWN and prop.computed and prop.is_set:
                continue  # the real plugin answers "no diff" for a whole Optional+Computed set that is unknown
            if values.contains_unknown(new):
                changes[key] = UPDATE_REPLACE if prop.force_new else UPDATE
                continue
            if prop.empty_is_noop and values.plain(new) == "":
                continue
        elif prop.computed:
            continue
        else:
            new = prop.default
        old_n, new_n = _normalized(prop, old), _normalized(prop, new)
        if old_n == new_n:
            continue
        if old_n is None:
            kind = ADD_REPLACE if prop.force_new else ADD
        elif new_n is None:
            kind = DELETE_REPLACE if prop.force_new else DELETE
        else:
            kind = UPDATE_REPLACE if prop.force_new and not prop.known_change_in_place else UPDATE
        changes[key] = kind
    return changes


def with_defaults(table: dict, news: dict) -> dict:
    """Checked inputs: the program's values plus schema defaults, as the bridge fills them in Check."""
    filled = dict(news)
    for key, prop in table.items():
        if prop.default is not None and key not in filled:
            filled[key] = prop.default
    return filled
