"""The repos the Hub double serves: the lab's tiny model, generated as the node image's is (lab/labkit/model.py), in
two revisions, with files a download must skip, and a gated and a private copy.

Each revision is a commit whose id is the SHA-1 of its files' names and blob ids, so every start on every machine
serves the same commits. Weight-like files are stored as Git LFS stores them: their ETag is their SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import model  # noqa: E402

LFS_SUFFIXES = (".safetensors", ".pth", ".gguf", ".bin")
PUBLIC, GATED, PRIVATE = "lab/tiny", "lab/tiny-gated", "lab/tiny-private"


@dataclass(frozen=True)
class Blob:
    path: Path  # the bytes, in the double's data folder
    size: int
    etag: str  # LFS: SHA-256; else the git blob id (SHA-1 of "blob <size>\0" + bytes)
    lfs: bool
    blob_id: str  # the git blob id of what git holds: the LFS pointer, or the file itself


@dataclass
class Repo:
    name: str
    gated: bool = False
    private: bool = False
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)  # commit -> file path -> blob
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


def _blob(path: Path) -> Blob:
    data = path.read_bytes()
    git_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    if not path.name.endswith(LFS_SUFFIXES):
        return Blob(path, len(data), git_id, False, git_id)
    sha = hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()
    return Blob(path, len(data), sha, True, hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest())


def _commit(files: dict[str, Blob]) -> str:
    return hashlib.sha1(json.dumps({p: b.blob_id for p, b in sorted(files.items())}).encode()).hexdigest()


def build(data: Path, shard_mib: int = 4, shards: int = 4) -> dict[str, Repo]:
    """Writes the repos' files under `data` and returns them by name.

    Revision `main` (also tag `v1`) is the lab's model plus files vLLM never reads (an `original/` checkpoint, a GGUF
    copy); tag `v2` changes one shard, so a revision change has exactly one file to fetch."""
    if data.exists():
        shutil.rmtree(data)
    v1, v2 = data / "v1", data / "v2"
    model.write_model(v1, "Qwen3ForCausalLM", shards=shards, shard_mib=shard_mib)
    (v1 / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}) + "\n")
    (v1 / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n")
    (v1 / "README.md").write_text("# lab/tiny\n\nThe spark-vllm lab's model, served by the Hub double.\n")
    (v1 / "original").mkdir()
    (v1 / "original" / "consolidated.00.pth").write_bytes(hashlib.shake_256(b"original").digest(1 << 20))
    (v1 / "tiny.Q8_0.gguf").write_bytes(hashlib.shake_256(b"gguf").digest(1 << 20))
    shutil.copytree(v1, v2)
    changed = v2 / f"model-00003-of-{shards:05d}.safetensors"  # shards >= 3
    raw = bytearray(changed.read_bytes())
    raw[-1] ^= 0xFF  # the last byte of the last tensor: still a valid checkpoint, with other bytes
    changed.write_bytes(bytes(raw))
    revisions = {}
    for name, folder in (("v1", v1), ("v2", v2)):
        files = {str(f.relative_to(folder)): _blob(f) for f in sorted(folder.rglob("*")) if f.is_file()}
        revisions[name] = (_commit(files), files)
    repos = {}
    for repo_name, gated, private in ((PUBLIC, False, False), (GATED, True, False), (PRIVATE, False, True)):
        repo = Repo(repo_name, gated=gated, private=private)
        for name, (commit, files) in revisions.items():
            repo.commits[commit] = files
            repo.refs[name] = commit
        repo.refs["main"] = repo.refs["v1"]
        repos[repo_name] = repo
    return repos
