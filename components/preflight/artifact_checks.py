"""Preflight's judgement of the artifacts on each node: the image, the Hub download, the weights and the disk space
for what is to arrive (docs/artifacts.md). Pure, like judging.py, which calls these."""

from __future__ import annotations

import re
from typing import Optional

from ..config.artifacts_config import registry_of
from ..config.spec import Deployment, NodeSpec
from ..nodes.hub_plan import HubPlan, lacking
from ..nodes.image_plan import Action, ImagePlan
from ..nodes.node_facts import Model, NodeFacts
from ..nodes.weight_manifests import WEIGHT_SUFFIXES, weight_differences
from ..text import size
from .findings import Finding, Reference, Status, could_not, short, some

# huggingface_hub's downloads into a folder (local_dir) write plain files, not links into a cache, and keep
# metadata of what they fetched, from 0.23 on: the download's resume and "only what changed" rest on it.
MIN_HUGGINGFACE_HUB = (0, 23)
NO_IMAGE_FIX = ("set spark-vllm:images.pull to head, so that the head pulls it (with spark-vllm:images.registryUser "
                "and the secret spark-vllm:registryPassword for a private registry), or load it on one node")


def check_image(deployment: Deployment, node: NodeSpec, facts: NodeFacts, plan: ImagePlan,
                reference: Optional[NodeFacts]) -> Finding:
    image, name = facts.image, deployment.serve.image
    if image is None:
        return could_not(node.name, "image", "Docker does not answer")
    if image.unavailable:
        return could_not(node.name, "image", image.unavailable)
    ref = plan.reference
    if ref is None:
        return Finding(node.name, "image", Status.FAIL, f"{name} is on no node of the stack, and none pulls it",
                       NO_IMAGE_FIX)
    step = plan.nodes[node.name]
    held = f"holds {name} as {short(step.holds)}" if step.holds else f"lacks {name}"
    if step.action is Action.COPY:
        ref_image = reference.image if reference is not None else None
        moved = f" ({short(ref_image.id)}, {size(ref_image.size)})" if ref_image and ref_image.size else ""
        return Finding(node.name, "image", Status.WARN,
                       f"{node.name} {held}; up copies {ref}'s{moved} over the fabric before anything starts here")
    if step.action is Action.PULL:
        user = deployment.images.registry_user
        login = f" as {user}" if user else " without a login"
        return Finding(node.name, "image", Status.WARN,
                       f"{node.name} {held}; up pulls it from {registry_of(name)}{login} before anything starts here")
    return Finding(node.name, "image", Status.OK, f"{name} is {short(image.id)}" +
                   (", the same on every node" if len(deployment.cluster.nodes) > 1 and len(plan.nodes) ==
                    len(deployment.cluster.nodes) and all(s.action is Action.KEEP for s in plan.nodes.values())
                    else ""))


def check_hub(deployment: Deployment, node: NodeSpec, hub: HubPlan, inside_hub: Optional[str]) -> Finding:
    """On the node that downloads: what the revision is, what is fetched and skipped, and what is still to come."""
    spec = deployment.serve.hub
    assert spec is not None
    if hub.error is not None:
        return Finding(node.name, "hub", Status.FAIL, hub.error)
    if inside_hub == "":
        return Finding(node.name, "hub", Status.FAIL, f"{deployment.serve.image} has no huggingface_hub, which the "
                                                      "download runs with", "use a vLLM image (they carry it)")
    if inside_hub and _older(inside_hub, MIN_HUGGINGFACE_HUB):
        return Finding(node.name, "hub", Status.FAIL,
                       f"{deployment.serve.image} has huggingface_hub {inside_hub}, older than "
                       f"{'.'.join(map(str, MIN_HUGGINGFACE_HUB))}, whose downloads into a folder write plain files "
                       "and keep what they fetched", "use a newer vLLM image")
    assert hub.selection is not None and hub.commit is not None
    how = "asked the Hub now" if hub.asked else "as the last download recorded it"
    head = f"{spec.repo} {spec.revision} is {hub.commit[:12]} ({how})"
    skipped = hub.selection.skipped
    skips = ""
    if skipped:
        shown = [f"{f.path} ({why})" for f, why in skipped[:3]]
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        skips = (f"; skips {len(skipped)} file{'s' if len(skipped) != 1 else ''}, "
                 f"{size(sum(f.size for f, _ in skipped))}: {', '.join(shown)}{more}")
    fetched = hub.selection.fetched
    whole = f"{len(fetched)} files, {size(hub.selection.bytes)}"
    if hub.to_fetch:
        return Finding(node.name, "hub", Status.WARN,
                       f"{head}; up downloads {len(hub.to_fetch)} of its {whole} "
                       f"({size(sum(f.size for f in hub.to_fetch))}){skips}")
    if hub.needed:
        return Finding(node.name, "hub", Status.WARN, f"{head}; all its {whole}, are here, and up records them "
                                                      f"as {hub.commit[:12]}{skips}")
    return Finding(node.name, "hub", Status.OK, f"{head}; all its {whole}, are here{skips}")


def _older(version: str, minimum: tuple[int, int]) -> bool:
    """Whether a version string (2.4.0, 0.36.0rc1) is below major.minor; an unreadable one is not judged."""
    parts = re.match(r"(\d+)\.(\d+)", version)
    return parts is not None and (int(parts[1]), int(parts[2])) < minimum


def check_space(deployment: Deployment, node: NodeSpec, facts: NodeFacts, hub: Optional[HubPlan],
                plan: ImagePlan, reference: Optional[NodeFacts]) -> Finding:
    """Room for what is to arrive: the weights a download or a sync brings, the image a copy brings."""
    space = facts.space
    if space is None or space.unavailable:
        return could_not(node.name, "space", (space.unavailable if space else None) or "the probe read no disk space")
    parts: list[str] = []
    failures: list[str] = []
    if hub is not None and hub.selection is not None:
        model = facts.model if facts.model is not None and not facts.model.unavailable else None
        wanted = hub.wanted()
        need = sum(wanted[path] for path in lacking(model, wanted))
        part = (f"{size(space.weights_free or 0)} free at {space.weights_mount}, the weights need "
                f"{size(need)} more")
        (failures if need > (space.weights_free or 0) else parts).append(part)
    step = plan.nodes.get(node.name)
    ref_image = reference.image if reference is not None else None
    if step is not None and step.action is Action.COPY and ref_image is not None and ref_image.size:
        if space.docker_free is None:
            parts.append(f"the free space where Docker keeps images is not readable here ({space.docker_root})")
        else:
            part = (f"{size(space.docker_free)} free at {space.docker_root}, the image needs "
                    f"{size(ref_image.size)}")
            (failures if ref_image.size > space.docker_free else parts).append(part)
    if failures:
        return Finding(node.name, "space", Status.FAIL, "; ".join(failures + parts),
                       f"free space on {node.name}, or put the weights' path on a larger disk")
    if not parts:
        return Finding(node.name, "space", Status.OK,
                       f"{size(space.weights_free or 0)} free at {space.weights_mount}; nothing is to arrive")
    return Finding(node.name, "space", Status.OK, "; ".join(parts))


def check_weights(deployment: Deployment, node: NodeSpec, facts: NodeFacts, ref: Reference,
                  hub: Optional[HubPlan], source_facts: Optional[NodeFacts] = None) -> Finding:
    """The weights against the reference's, or with `serve.hub` against what the download fetches; `source_facts`
    are those of the node the others copy from, which the sync needs rsync on."""
    model, path = facts.model, deployment.serve.model_path
    if model is None:
        return could_not(node.name, "weights", "the probe listed no weights")
    if model.unavailable:
        return could_not(node.name, "weights", model.unavailable, f"let {node.ssh_user} read {path}")
    broken = _links(node, model, path)
    if broken is not None:
        return broken
    if hub is not None:
        return _against_download(deployment, node, facts, source_facts, hub)
    copy_from = None
    if ref and ref[0] != node.name:
        copy_from = (f"copy them from {ref[0]} over the fabric: on {ref[0]}, rsync -a --copy-links --progress "
                     f"{path}/ {node.ssh_user}@{node.fabric_ip}:{path}/")
    source = deployment.source.name
    syncs = deployment.preflight.sync_weights and ref is not None and ref[0] == source and ref[0] != node.name

    def differs(reason: str, fix: Optional[str]) -> Finding:
        """A difference the sync can repair is a warning when it is on, and a failure otherwise."""
        if not syncs or ref is None:
            return Finding(node.name, "weights", Status.FAIL, reason, fix or "")
        return _sync_or_fail(node, facts, ref[1], source, reason)

    if not model.exists:
        if model.is_file:
            return Finding(node.name, "weights", Status.FAIL, f"{path} is a file, not a folder on {node.name}",
                           copy_from or f"put the model's weights at {path} on every node")
        return differs(f"{path} is not there on {node.name}",
                       copy_from or f"put the model's weights at {path} on every node")
    files = dict(model.files)
    weights = {name: n for name, n in files.items() if name.endswith(WEIGHT_SUFFIXES)}
    if not weights:
        return differs(f"{path} holds no *.safetensors, *.bin or *.pt files",
                       copy_from or "copy the complete checkpoint")
    summary = f"{len(weights)} weight file{'s' if len(weights) != 1 else ''}, {size(sum(weights.values()))}"
    ref_model = ref[1].model if ref is not None and ref[0] != node.name else None
    if ref is None or ref_model is None:
        return Finding(node.name, "weights", Status.OK, summary + _hash_note(deployment, model, None))
    theirs = dict(ref_model.files)
    missing, differ, changed = weight_differences(model, ref_model, deployment.preflight.hash_weights)
    extra = sorted(set(files) - set(theirs))
    problems = []
    if missing:
        problems.append(f"{node.name} lacks {some(missing)}")
    problems += [f"{node.name}'s {name} is {size(files[name])}, {ref[0]}'s is {size(theirs[name])}"
                 for name in differ[:3]]
    if len(differ) > 3:
        problems.append(f"{len(differ) - 3} more files differ in size")
    if changed and (not problems or syncs):
        problems.append(f"{node.name}'s {some(changed)} differ{'s' if len(changed) == 1 else ''} "
                        f"from {ref[0]}'s (SHA-256)")
    if problems:
        return differs("; ".join(problems), copy_from)
    if extra:
        return Finding(node.name, "weights", Status.WARN,
                       f"{summary}: every file of {ref[0]}, the same size, and also {some(extra)}"
                       + _hash_note(deployment, model, ref[0]),
                       f"remove what {ref[0]} does not have, so every node loads the same files")
    return Finding(node.name, "weights", Status.OK,
                   f"{summary}, the same names and sizes as {ref[0]}" + _hash_note(deployment, model, ref[0]))


def _links(node: NodeSpec, model: Model, path: str) -> Optional[Finding]:
    """Links that lead nowhere, or a folder whose links lead all over the disk, refused as such."""
    if model.dangling:
        shown = ", ".join(f"{name} -> {target}" for name, target in model.dangling[:3])
        more = f" and {len(model.dangling) - 3} more" if len(model.dangling) > 3 else ""
        return Finding(node.name, "weights", Status.FAIL,
                       f"{len(model.dangling)} of the files in {path} on {node.name} are links to nothing: "
                       f"{shown}{more}",
                       "put back what they point to (a Hugging Face cache's blobs/), or download the model again")
    if model.exists and model.mount_root == "/":
        return Finding(node.name, "weights", Status.FAIL,
                       f"the links in {path} on {node.name} lead to places that share no folder but /, which the "
                       "containers would have to mount whole",
                       "keep the weights and what their links point to under one folder")
    return None


def _sync_or_fail(node: NodeSpec, facts: NodeFacts, source_facts: NodeFacts, source: str, reason: str) -> Finding:
    lacking_rsync = [name for name, holder in ((source, source_facts), (node.name, facts)) if holder.rsync is False]
    if lacking_rsync:
        return Finding(node.name, "weights", Status.FAIL,
                       f"{reason}; spark-vllm:preflight.syncWeights cannot copy them: rsync is not installed on "
                       f"{' and '.join(lacking_rsync)}",
                       f"install rsync on {' and '.join(lacking_rsync)} (`sudo apt-get install rsync`)")
    return Finding(node.name, "weights", Status.WARN,
                   f"{reason}; will sync from {source} over the fabric (spark-vllm:preflight.syncWeights)")


def _against_download(deployment: Deployment, node: NodeSpec, facts: NodeFacts, source_facts: Optional[NodeFacts],
                      hub: HubPlan) -> Finding:
    """With `serve.hub`, every node must hold the files the download fetches: the source gets them from the Hub, the
    others from the source."""
    if hub.error is not None or hub.commit is None:
        return could_not(node.name, "weights", "the download's files are unknown (see hub)")
    spec, model = deployment.serve.hub, facts.model
    assert spec is not None and model is not None
    wanted = hub.wanted()
    short_of = lacking(model, wanted)
    version = f"{spec.repo}@{hub.commit[:12]}"
    if not short_of:
        return Finding(node.name, "weights", Status.OK,
                       f"every file of {version}, {size(sum(wanted.values()))}, in its size" +
                       (f" ({model.links} of them links, followed)" if model.links else ""))
    lacks = f"{node.name} lacks {len(short_of)} of the {len(wanted)} files of {version} ({some(short_of)})"
    source = deployment.source.name
    if node.name == source:
        return Finding(node.name, "weights", Status.WARN, f"{lacks}; up downloads them from the Hub")
    if source_facts is None:
        return Finding(node.name, "weights", Status.WARN,
                       f"{lacks}; up copies them from {source} over the fabric once it holds them")
    return _sync_or_fail(node, facts, source_facts, source, f"{lacks}, which {source} downloads first")


def _hash_note(deployment: Deployment, model: Model, ref: Optional[str]) -> str:
    if not deployment.preflight.hash_weights:
        return " (contents not hashed: spark-vllm:preflight.hashWeights is off)"
    return f"; SHA-256 the same as {ref}'s" if ref else f"; {len(model.sha256)} SHA-256 sums taken"
