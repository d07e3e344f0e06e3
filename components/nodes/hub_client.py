"""The workstation's one question to the Hugging Face Hub, asked by preflight with the real huggingface_hub client:
what commit a revision is, and the files of the repo there. Asked only when the node that downloads has no record
of that revision, so a no-op preview never asks (components/nodes/hub_plan.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..config.artifacts_config import HubSpec
from .hub_files import RepoFile

TIMEOUT_S = 20


@dataclass(frozen=True)
class HubAnswer:
    commit: Optional[str] = None
    files: tuple[RepoFile, ...] = ()
    config: Optional[dict] = None  # what the Hub reads of the repo's config.json (its architectures)
    error: Optional[str] = None  # one sentence: why the Hub gave no files


def ask(hub: HubSpec, token: Optional[str]) -> HubAnswer:
    """The revision's commit and files, or why the Hub refused (gated, private, no such revision) or did not answer."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # read at import: no call beyond the one asked here
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(TIMEOUT_S))
    from huggingface_hub import HfApi
    from huggingface_hub import errors

    where = f"{hub.repo} on {hub.endpoint}"
    # token=False: the stack's hfToken or nothing, never a token this workstation happens to have saved.
    api = HfApi(endpoint=hub.endpoint, token=token or False)
    try:
        info = api.model_info(hub.repo, revision=hub.revision, files_metadata=True, timeout=TIMEOUT_S)
    except errors.GatedRepoError:
        why = "the stack's hfToken's account has not been granted access" if token else "no hfToken is set"
        return HubAnswer(error=f"{where} is gated and {why}: accept its terms on the Hub with the token's account, "
                               "then set that token (`pulumi config set --secret spark-vllm:hfToken <token>`)")
    except errors.RepositoryNotFoundError:
        fix = ("the stack's hfToken cannot read it" if token else
               "no hfToken is set (`pulumi config set --secret spark-vllm:hfToken <token>`)")
        return HubAnswer(error=f"{where} does not exist, or is private and {fix}")
    except errors.RevisionNotFoundError:
        return HubAnswer(error=f"{where} has no revision {hub.revision!r} (a branch, tag or commit)")
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status == 401:
            return HubAnswer(error=f"the Hub at {hub.endpoint} refused the stack's hfToken as not valid (401): "
                                   "set a current one (`pulumi config set --secret spark-vllm:hfToken <token>`)")
        return HubAnswer(error=f"the Hub at {hub.endpoint} answered {status} for {hub.repo}: {_first_line(e)}")
    except Exception as e:  # the client's HTTP library raises its own connection errors
        return HubAnswer(error=f"the Hub at {hub.endpoint} did not answer: {type(e).__name__}: {_first_line(e)}")
    files = tuple(RepoFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else (s.blob_id or ""))
                  for s in info.siblings or ())
    return HubAnswer(commit=info.sha, files=files, config=dict(info.config) if info.config else None)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0]
