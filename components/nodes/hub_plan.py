"""What a stack's Hub download does, from what preflight found on the node that downloads (docs/artifacts.md).

That node keeps a record of its last download beside the weights (components/remote/hub_download.py): the repo,
the revision as written, the commit it resolved to and every file there. While the stack asks for that revision
(or that commit), the record answers: no call to the Hub. Any other revision, or no record, is asked of the Hub once,
with the real huggingface_hub client (hub_client.py), and the answer shows in the preview.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from ..config.artifacts_config import HubSpec
from ..config.spec import Deployment
from .hub_client import HubAnswer
from .hub_files import RepoFile, Selection, select
from .node_facts import Model, NodeFacts


@dataclass(frozen=True)
class HubPlan:
    commit: Optional[str] = None  # None: unknown (see error)
    asked: bool = False  # the Hub was asked in this run; False: the node's record answered
    files: tuple[RepoFile, ...] = ()  # every file of the repo at the commit
    selection: Optional[Selection] = None  # what a download fetches
    to_fetch: tuple[RepoFile, ...] = ()  # of those, what the node lacks, or holds in another size
    needed: bool = False  # the download must run
    config: Optional[dict] = None  # the Hub's reading of config.json, when it was asked
    error: Optional[str] = None  # why there is no plan

    def wanted(self) -> dict[str, int]:
        """Every file a node must hold, with its size."""
        return {f.path: f.size for f in self.selection.fetched} if self.selection else {}


def plan(deployment: Deployment, facts: Mapping[str, NodeFacts],
         ask: Callable[[HubSpec, Optional[str]], HubAnswer], token: Optional[str]) -> Optional[HubPlan]:
    """The download's plan; None without `serve.hub`."""
    hub = deployment.serve.hub
    if hub is None:
        return None
    node = deployment.source.name
    found = facts.get(node)
    model: Optional[Model] = found.model if found is not None and found.reachable else None
    if model is None or model.unavailable:
        why = model.unavailable if model is not None else "its probe did not run"
        return HubPlan(error=f"what {node} holds at {deployment.serve.model_path} is unknown ({why})")
    record = model.hub if model.exists else None
    config = None
    if record is not None and record.repo == hub.repo and hub.revision in (record.revision, record.commit):
        commit, files, asked = record.commit, tuple(RepoFile(*f) for f in record.files), False
    else:
        answer = ask(hub, token)
        if answer.error is not None or answer.commit is None:
            return HubPlan(asked=True, error=answer.error or "the Hub named no commit")
        commit, files, asked, config = answer.commit, answer.files, True, answer.config
    selection = select(files, hub.include, hub.exclude)
    have = dict(model.files) if model.exists else {}
    # What the last download recorded of each file: a file of another ETag is another file, whatever its size.
    recorded = {path: etag for path, _, etag in record.files} if record is not None else {}
    to_fetch = tuple(f for f in selection.fetched
                     if have.get(f.path) != f.size or recorded.get(f.path, f.etag) != f.etag)
    current = record is not None and record.complete and record.repo == hub.repo and record.commit == commit
    return HubPlan(commit=commit, asked=asked, files=files, selection=selection, to_fetch=to_fetch,
                   needed=bool(to_fetch) or not current, config=config)


def lacking(model: Optional[Model], wanted: Mapping[str, int]) -> list[str]:
    """The wanted files a node does not hold in their size."""
    have = dict(model.files) if model is not None and model.exists else {}
    return sorted(path for path, n in wanted.items() if have.get(path) != n)
