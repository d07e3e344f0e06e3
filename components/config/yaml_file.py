"""Reads a catalog file as YAML, refusing what YAML would drop without a word: a key given twice in one mapping.

PyYAML keeps the last of two equal keys, so a second `fabricIp` on a node, or a cluster defined twice, would win
silently. A `<<` merge (`<<: *lab`, then the keys that differ) is not a repeat.
"""

from __future__ import annotations

from typing import Any

import yaml

from .schema import ConfigError

_MERGE = "tag:yaml.org,2002:merge"


def load(text: str, shown: str) -> Any:
    """The data of `text`; `shown` is the file's name as errors print it."""
    try:
        return _parse(text, shown)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        lines = text.splitlines()
        line = lines[mark.line] if mark and mark.line < len(lines) else ""
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        quoted = f" ({line.strip()!r})" if line.strip() else ""
        raise ConfigError(shown, where, line, "valid YAML",
                          f"{quoted} is not valid YAML: {getattr(e, 'problem', None) or e}") from None


def _parse(text: str, shown: str) -> Any:
    """Parsed once: the node tree is checked for repeats, then built into data, as yaml.safe_load builds it."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _refuse_repeats(root, "", shown, set())
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _refuse_repeats(node: yaml.Node, path: str, shown: str, seen: set[int]) -> None:
    if id(node) in seen:  # an alias: its anchor was walked where it was defined
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_repeats(item, f"{path}[{i}]", shown, seen)
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[tuple[str, str], tuple[yaml.Node, yaml.Node]] = {}
    for key, value in node.value:
        if key.tag == _MERGE or not isinstance(key, yaml.ScalarNode):
            _refuse_repeats(value, path, shown, seen)
            continue
        where = f"{path}.{key.value}" if path else key.value
        if (key.tag, key.value) in first:
            raise ConfigError(shown, where, None, "each key once in a mapping (YAML keeps only the last, silently)",
                              f"is given twice: {_said(*first[key.tag, key.value])}, then {_said(key, value)}")
        first[key.tag, key.value] = key, value
        _refuse_repeats(value, where, shown, seen)


def _said(key: yaml.Node, value: yaml.Node) -> str:
    line = f"on line {key.start_mark.line + 1}"
    return f"{value.value!r} {line}" if isinstance(value, yaml.ScalarNode) else line
