"""Reads the stack's config and the catalogs it names, once, before any resource is registered.

`load()` either returns a complete `Deployment` or raises one `ConfigError` naming the file, the key path, the
value and what is accepted. The keys are checked by `validate.py`; this module reads the files. Only the secrets'
values are taken from Pulumi again, by `__main__`, as secret outputs; `Deployment.secrets` says which ones are set.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from . import artifacts_config, gateway_config, placement, validate, watchdog_config, yaml_file
from .schema import ConfigError, Section, did_you_mean
from .spec import NAMESPACE, ClusterSpec, Deployment, PreflightSpec, ServeSpec


def load_stack(stack: str, config: Mapping[str, Any], secret_keys: set[str],
               project_dir: Path) -> Deployment | gateway_config.GatewaySpec:
    """A model stack's `load()`, or a gateway stack's `load_gateway()`: a stack that sets `spark-vllm:gateway` is
    a gateway."""
    if gateway_config.is_gateway(config):
        return load_gateway(stack, config, secret_keys, project_dir)
    return load(stack, config, secret_keys, project_dir)


def load(stack: str, config: Mapping[str, Any], secret_keys: set[str], project_dir: Path) -> Deployment:
    """Validates the stack's config (`spark-vllm:*` keys, already JSON-decoded) and the catalogs it names."""
    stack_file = f"Pulumi.{stack}.yaml"
    keys = validate.stack_keys(config, secret_keys, stack_file)
    catalog_dir = project_dir / Path(keys.catalog).expanduser()
    clusters = _catalog_entry(catalog_dir, keys.catalog, "clusters.yaml", keys.cluster, stack_file, "cluster")
    cluster = validate.cluster(clusters, keys.cluster)
    preset = _catalog_entry(catalog_dir, keys.catalog, "models.yaml", keys.model, stack_file, "model")
    serve = validate.serve(preset, keys.overrides, keys.model)
    watchdog = keys.watchdog
    if watchdog.enabled:
        watchdog_config.check_port(keys.watchdog_keys, watchdog.port, validate.fixed_ports(cluster),
                                   cluster.worker_ports)
    cluster, keeper_port = placement.place(cluster, keys, watchdog.port if watchdog.enabled else None)
    if keeper_port is not None:
        watchdog = dataclasses.replace(watchdog, port=keeper_port)
    cluster = dataclasses.replace(cluster, executor=serve.executor, watchdog_port=keeper_port)
    validate.world_size(cluster, serve, stack_file)
    artifacts_config.check_node(serve.hub, preset, keys.overrides, tuple(n.name for n in cluster.nodes))
    return Deployment(stack=stack, cluster=cluster, serve=serve, cluster_ready_timeout_s=keys.cluster_ready_timeout_s,
                      serve_ready_timeout_s=keys.serve_ready_timeout_s, secrets=keys.secrets,
                      ssh_private_key=_read_key(cluster, clusters.file), preflight=_with_hub(keys, serve),
                      watchdog=watchdog, images=keys.images, host_nccl=keys.host_nccl)


def _with_hub(keys: validate.StackKeys, serve: ServeSpec) -> PreflightSpec:
    """A model from the Hub is downloaded on one node and synced to the others: preflight must be on, and the sync
    is on unless the stack turns it off, which it may not."""
    if serve.hub is None:
        return keys.preflight
    if not keys.preflight.enabled:
        raise keys.preflight_keys.error("enabled", False, "true with a model whose weights come from the Hub "
                                        "(serve.hub)", "is false, but the download acts on what preflight finds on the "
                                        "node and asks the Hub")
    if keys.sync_weights is False:
        raise keys.preflight_keys.error("syncWeights", False, "true (or left out) with a model whose weights come "
                                        "from the Hub (serve.hub)", "is false, but the other nodes get the download "
                                        "by the sync")
    return dataclasses.replace(keys.preflight, sync_weights=True)


def load_gateway(stack: str, config: Mapping[str, Any], secret_keys: set[str],
                 project_dir: Path) -> gateway_config.GatewaySpec:
    """Validates a gateway stack's config (gateway_config.py) and the cluster entry it names."""
    stack_file = f"Pulumi.{stack}.yaml"
    top = validate.top_section(config, secret_keys, stack_file)
    top.secret_keys.add(gateway_config.GATEWAY_KEY)
    keys = gateway_config.keys(top, secret_keys)
    clusters = _catalog_entry(project_dir / Path(keys.catalog).expanduser(), keys.catalog, "clusters.yaml",
                              keys.cluster, stack_file, "cluster")
    cluster = validate.cluster(clusters, keys.cluster)
    return gateway_config.GatewaySpec(
        stack=stack, cluster=cluster, node=gateway_config.place(cluster, keys), models=keys.models, port=keys.port,
        image=keys.image, ready_timeout_s=keys.ready_timeout_s, ssh_private_key=_read_key(cluster, clusters.file),
        preflight=keys.preflight)


def _catalog_entry(folder: Path, folder_name: str, file: str, name: str, stack_file: str, what: str) -> Section:
    """The entry `name` of a catalog file, read as `folder_name/file` in errors."""
    shown = f"{folder_name}/{file}"
    try:
        text = (folder / file).read_text()
    except OSError as e:
        raise ConfigError(stack_file, f"{NAMESPACE}:catalog", folder_name, f"a folder holding {file}",
                          f"is {folder_name!r}, where {file} cannot be read ({e.strerror})") from None
    data = yaml_file.load(text, shown)
    catalog = Section(data if data is not None else {}, shown, "")
    if not catalog.has(name):
        raise ConfigError(stack_file, f"{NAMESPACE}:{what}", name,
                          f"a {what} defined in {shown}: " + (", ".join(sorted(map(str, catalog.data))) or "none"),
                          f"is {name!r}" + did_you_mean(name, catalog.data))
    return catalog.section(name)


def _read_key(cluster: ClusterSpec, clusters_file: str) -> Optional[str]:
    if cluster.ssh.key_file is None:
        return None
    path = Path(os.path.expanduser(cluster.ssh.key_file))
    try:
        return path.read_text()
    except OSError as e:
        raise ConfigError(clusters_file, f"{cluster.name}.ssh.keyFile", cluster.ssh.key_file,
                          "a readable SSH private key file (or leave it out to use the ssh agent)",
                          f"is {cluster.ssh.key_file!r}, which cannot be read ({e.strerror})") from None
