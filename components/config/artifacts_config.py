"""Where a deployment's artifacts come from: the `hub:` key of a model preset (the weights, from the Hugging Face Hub)
and the stack's `images:` section (how every node gets the image). See docs/artifacts.md.

Their own small specs and parsers, called once from validate.py, so that they stay apart from the rest of the config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from .schema import Section

# Hub repo ids: `org/name` (or a bare legacy name), of letters, digits, `-`, `_` and `.` (the Hub's rule, 96 at most).
REPO = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}\Z", re.ASCII)
# A branch, tag or commit: git ref characters; `refs/pr/1` is one too. No `..`, no leading `-` or `/`.
REVISION = re.compile(r"(?!.*\.\.)[\w.][\w./-]{0,254}\Z", re.ASCII)
COMMIT = re.compile(r"[0-9a-f]{40}", re.ASCII)
DEFAULT_ENDPOINT = "https://huggingface.co"
PULL = ("none", "head", "all")


@dataclass(frozen=True)
class HubSpec:
    """A model's weights on the Hugging Face Hub, downloaded on one node and copied to the others."""
    repo: str
    revision: str  # a branch, tag or commit, as written; the download records the commit it resolved to
    endpoint: str = DEFAULT_ENDPOINT  # the Hub (or a mirror) that the workstation and the node ask
    node: Optional[str] = None  # the node that downloads; None: the stack's head
    include: Optional[tuple[str, ...]] = None  # glob patterns of files to fetch; None: hub_files' defaults
    exclude: Optional[tuple[str, ...]] = None  # patterns of files to skip; None: hub_files' defaults
    stall_s: int = 300  # a download that gains no byte for this long fails, naming its files

    @property
    def pinned(self) -> bool:
        """The revision is a commit already: nothing to resolve."""
        return COMMIT.fullmatch(self.revision) is not None


@dataclass(frozen=True)
class ImagesSpec:
    """How the nodes get the model's image: a node that lacks it, or holds another build, gets the reference's."""
    pull: str = "none"  # which nodes pull it from its registry: none, head (the others copy the head's), all
    registry_user: Optional[str] = None  # the registry's user; the password is the secret registryPassword
    registry_password: bool = False  # the secret spark-vllm:registryPassword is set
    stall_s: int = 300  # a copy or a pull that moves no byte for this long fails


def hub(preset: Section, overrides: Section) -> Optional[HubSpec]:
    """The preset's `hub:`, each key overridable by the stack's `serve.hub.<key>` (errors blame the right file)."""
    mine, theirs = overrides.section("hub"), preset.section("hub")
    if not mine.data and not theirs.data:
        return None

    def pick(key: str) -> Section:
        theirs._read.add(key)
        return mine if mine.has(key) else theirs

    patterns = "a list of glob patterns of paths in the repo, such as ['*.safetensors', '*.json']"
    spec = HubSpec(
        repo=pick("repo").str("repo", pattern=REPO, accepted="a Hub repo id such as Qwen/Qwen3-30B-A3B-FP8"),
        revision=pick("revision").str("revision", "main", pattern=REVISION,
                                      accepted="a branch, tag or commit of the repo, such as main or v1.0"),
        endpoint=pick("endpoint").str("endpoint", DEFAULT_ENDPOINT, accepted="the Hub's URL, such as "
                                      "https://huggingface.co (http:// or https://, no path after the host)"),
        node=pick("node").name("node", None),
        include=_patterns(pick("include"), "include", patterns),
        exclude=_patterns(pick("exclude"), "exclude", patterns),
        stall_s=pick("stallSeconds").int("stallSeconds", 300, lo=10, hi=24 * 3600))
    url = urlsplit(spec.endpoint)
    if url.scheme not in ("http", "https") or not url.hostname or url.path.strip("/") or url.query:
        raise pick("endpoint").error("endpoint", spec.endpoint, "the Hub's URL, such as https://huggingface.co "
                                                                "(http:// or https://, no path after the host)")
    theirs.done()
    mine._read |= theirs._read
    mine.done()
    return spec


def _patterns(s: Section, key: str, accepted: str) -> Optional[tuple[str, ...]]:
    found = s.str_list(key, None)
    if found is None:
        return None
    if not found or any(not p.strip() or p != p.strip() for p in found):
        raise s.error(key, list(found), accepted + ", none empty or with surrounding spaces")
    return found


def check_node(hub_spec: Optional[HubSpec], preset: Section, overrides: Section, nodes: tuple[str, ...]) -> None:
    """`hub.node` names one of the stack's nodes."""
    if hub_spec is None or hub_spec.node is None or hub_spec.node in nodes:
        return
    where = overrides.section("hub") if overrides.section("hub").has("node") else preset.section("hub")
    raise where.error("node", hub_spec.node, f"one of the stack's nodes: {', '.join(nodes)}")


def images(s: Section, password_set: bool) -> ImagesSpec:
    spec = ImagesSpec(pull=s.choice("pull", PULL, "none"),
                      registry_user=s.str("registryUser", None, accepted="the registry's user name, such as "
                                                                         "$oauthtoken for nvcr.io"),
                      registry_password=password_set,
                      stall_s=s.int("stallSeconds", 300, lo=10, hi=24 * 3600))
    if spec.registry_user is not None and not password_set:
        raise s.error("registryUser", spec.registry_user, "a user with its password: run `pulumi config set "
                      "--secret spark-vllm:registryPassword <password>` too",
                      "is set, but spark-vllm:registryPassword is not")
    s.done()
    return spec


def registry_of(image: str) -> str:
    """The registry host of an image reference, as `docker login` takes it (Docker Hub when it names none)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"
