"""A corpus of configs written as users write them, mistakes included: tests/unit/corpus/{refused,accepted}/*.yaml.

Each case starts from the files in corpus/base (a stack, its cluster catalog and its model catalog) and changes them:
- `stack`: stack-file text, whose top-level keys replace the base's (`drop` removes some); read as Pulumi reads a
  stack file (YAML 1.2), and handed to the program as Pulumi hands it (JSON text for objects, strings otherwise);
- `secrets`: keys set with `pulumi config set --secret`, with their decrypted values;
- `clusters` / `models`: a catalog's whole text, or `{old text: new text}` edits of the base text.

A refused case names the `path` and what the sentence `says` (one fragment or several), and what it must `never` say
(secrets); the file is the stack's for a config key's path (`ns:key`), else `file`. An accepted case may `expect`
values of the Deployment, by attribute path (`cluster.nodes.1.env`). Every accepted config also goes through the
program's own builders.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from components.config import loader, pulumi_config, serve_flags, spec
from components.resources.fabric_guard import chain_name, guard_command
from components.resources.ray_node import container_env, ray_start
from components.config.schema import ConfigError
from components.resources.vllm_serve import serve_argv, start_script

CORPUS = Path(__file__).with_name("corpus")
ROOT = Path(__file__).resolve().parents[2]
STACK = "test"


class PulumiYaml(yaml.SafeLoader):
    """A stack file as Pulumi's YAML 1.2 reads it: only true and false are booleans (`no` is a string)."""


PulumiYaml.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
PulumiYaml.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))


def cases(kind: str) -> list:
    found = []
    for file in sorted((CORPUS / kind).glob("*.yaml")):
        for case in yaml.safe_load(file.read_text()):
            found.append(pytest.param(case, id=f"{file.stem}: {case['case']}"))
    return found


def catalog_text(base: str, change) -> str:
    if change is None:
        return base
    if isinstance(change, str):
        return change
    for old, new in change.items():
        assert base.count(old) == 1, f"{old!r} is not once in the base catalog"
        base = base.replace(old, new)
    return base


def load(tmp_path: Path, case: dict) -> spec.Deployment:
    """The case's Deployment, with the stack config as the Pulumi engine hands it to the program."""
    folder = tmp_path / "catalog"
    folder.mkdir()
    for name in ("clusters", "models"):
        base = (CORPUS / "base" / f"{name}.yaml").read_text()
        (folder / f"{name}.yaml").write_text(catalog_text(base, case.get(name)))
    stack = yaml.load((CORPUS / "base" / "stack.yaml").read_text(), PulumiYaml)["config"]
    stack.update(yaml.load(case.get("stack", "{}"), PulumiYaml))
    for key in case.get("drop", []):
        del stack[key]
    stack.update(case.get("secrets", {}))
    stack.setdefault("spark-vllm:catalog", str(folder))
    handed = {key: value if isinstance(value, str) else json.dumps(value) if isinstance(value, (dict, list))
              else str(value).lower() if isinstance(value, bool) else str(value) for key, value in stack.items()}
    secret_keys = set(case.get("secrets", {}))
    return loader.load(STACK, {key: pulumi_config.decode(value) for key, value in handed.items()}, secret_keys, ROOT)


@pytest.mark.parametrize("case", cases("refused"))
def test_refused(tmp_path, case):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, case)
    message = str(err.value)
    file = f"Pulumi.{STACK}.yaml" if ":" in case["path"] else case["file"]
    assert message.split(": ", 1)[0].endswith(file), message
    assert f": {case['path']} " in message, message
    says = case["says"] if isinstance(case["says"], list) else [case["says"]]
    for fragment in says:
        assert fragment in message, message
    for secret in case.get("never", []):
        assert secret not in message, message
    assert "; expected " in message and message.endswith(".") and "\n" not in message, message


@pytest.mark.parametrize("case", cases("accepted"))
def test_accepted_and_built(tmp_path, case):
    d = load(tmp_path, case)
    for attribute, expected in case.get("expect", {}).items():
        actual = d
        for name in attribute.split("."):
            actual = actual[int(name)] if name.isdigit() else getattr(actual, name)
        assert (list(actual) if isinstance(actual, tuple) else actual) == expected, attribute
    # Whatever the check lets through, the program's builders must take.
    chain = chain_name(d.stack, d.cluster)
    for node in d.cluster.nodes:
        assert all("=" in entry for entry in container_env(d.cluster, node))
        assert ray_start(d.cluster, node)[0] == "start"
        guard_command(node, "apply", chain, d.cluster.fabric_interface, f"spark-vllm stack {d.stack}",
                      *d.cluster.guarded_ports)
        guard_command(node, "remove", chain)
    argv = serve_argv(d.serve, d.cluster)
    assert "@ENV@" not in start_script({key: case["secrets"][f"spark-vllm:{key}"] for key in d.secrets})
    # No flag the program sets appears twice, in any spelling vLLM reads.
    flags = [serve_flags.flag(arg) for arg in argv if serve_flags.flag(arg) in serve_flags.OWNED]
    assert len(flags) == len(set(flags)), argv


def test_serve_argv_sets_only_flags_extra_args_may_not_repeat():
    # serve_flags.OWNED must name every flag serve_argv emits, or extraArgs could repeat it.
    d = load_base()
    spec = d.serve.__class__(**{**d.serve.__dict__, "max_model_len": 8192, "max_num_seqs": 8, "enforce_eager": True})
    emitted = {arg for arg in serve_argv(spec, d.cluster) if arg.startswith("-")}
    assert emitted <= set(serve_flags.OWNED)


def load_base() -> spec.Deployment:
    return loader.load(STACK, {"spark-vllm:catalog": str(CORPUS / "base"), **yaml.load(
        (CORPUS / "base" / "stack.yaml").read_text(), PulumiYaml)["config"]}, set(), ROOT)


def test_the_corpus_is_large_enough():
    refused, accepted = len(cases("refused")), len(cases("accepted"))
    assert refused >= 100 and accepted >= 50, (refused, accepted)
