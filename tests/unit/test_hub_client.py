"""Preflight's one question to the Hub, asked with the real huggingface_hub client of the program's venv, against the
Hub double on loopback: the revision's commit and files, and each refusal in one sentence."""

from __future__ import annotations

import socket
import sys

import pytest

from components.config.artifacts_config import HubSpec
from components.nodes import hub_client
from harness import ROOT

sys.path.insert(0, str(ROOT / "lab" / "hub_double"))
import server as hub_double  # noqa: E402


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    double = hub_double.serve("127.0.0.1", 0, tmp_path_factory.mktemp("hub") / "data",
                              {"hf_granted": ["lab/tiny-gated", "lab/tiny-private"], "hf_plain": []})
    yield f"http://127.0.0.1:{double.server_address[1]}", double.hub
    double.shutdown()


def ask(endpoint, repo="lab/tiny", revision="main", token=None):
    return hub_client.ask(HubSpec(repo=repo, revision=revision, endpoint=endpoint[0]), token)


def test_a_revision_is_its_commit_and_files_with_sizes_and_etags(endpoint):
    answer = ask(endpoint, revision="v2")
    repo = endpoint[1].repos["lab/tiny"]
    commit = repo.refs["v2"]
    assert answer.error is None and answer.commit == commit
    blobs = repo.commits[commit]
    assert {f.path: (f.size, f.etag) for f in answer.files} == {p: (b.size, b.etag) for p, b in blobs.items()}
    assert answer.config == {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    assert ask(endpoint, revision=commit).commit == commit


@pytest.mark.parametrize("repo,revision,token,error", [
    ("lab/tiny-gated", "main", None,
     "lab/tiny-gated on {url} is gated and no hfToken is set: accept its terms on the Hub with the token's account, "
     "then set that token (`pulumi config set --secret spark-vllm:hfToken <token>`)"),
    ("lab/tiny-gated", "main", "hf_plain",
     "lab/tiny-gated on {url} is gated and the stack's hfToken's account has not been granted access: accept its "
     "terms on the Hub with the token's account, then set that token (`pulumi config set --secret "
     "spark-vllm:hfToken <token>`)"),
    ("lab/tiny-private", "main", None,
     "lab/tiny-private on {url} does not exist, or is private and no hfToken is set (`pulumi config set --secret "
     "spark-vllm:hfToken <token>`)"),
    ("lab/tiny", "v9", None, "lab/tiny on {url} has no revision 'v9' (a branch, tag or commit)"),
    ("lab/tiny", "main", "hf_wrong",
     "the Hub at {url} refused the stack's hfToken as not valid (401): set a current one (`pulumi config set "
     "--secret spark-vllm:hfToken <token>`)"),
])
def test_each_refusal_is_one_sentence(endpoint, repo, revision, token, error):
    answer = ask(endpoint, repo, revision, token)
    assert answer.commit is None and answer.error == error.format(url=endpoint[0])
    assert token is None or token not in answer.error


def test_granted_tokens_read_gated_and_private_repos(endpoint):
    assert ask(endpoint, "lab/tiny-gated", token="hf_granted").commit is not None
    assert ask(endpoint, "lab/tiny-private", token="hf_granted").commit is not None


def test_a_hub_that_does_not_answer_is_named(endpoint):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        answer = hub_client.ask(HubSpec(repo="lab/tiny", revision="main", endpoint=f"http://127.0.0.1:{port}"), None)
    assert answer.error is not None and answer.error.startswith(f"the Hub at http://127.0.0.1:{port} did not answer: ")
