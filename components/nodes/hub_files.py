"""Which files of a Hub repo a download fetches: what vLLM reads, and nothing it never reads (docs/artifacts.md).

Patterns are matched as huggingface_hub matches them (`fnmatchcase`, where `*` also crosses `/`), on the file's path
in the repo. A stack's `hub.include` or `hub.exclude` replaces the default list it names, and turns off the two
rules about duplicates below, which only make sense with the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Optional, Sequence

# The weights, the configs (config, generation, tokenizer, quantization, preprocessor, the shard index), the chat
# template, the tokenizer's own files and a model's remote code.
DEFAULT_INCLUDE = ("*.safetensors", "*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py", "tokenizer*")
# Other frameworks' copies of the weights, and the original checkpoints some repos carry beside the converted ones
# (gpt-oss's `original/` and `metal/`, Llama's `original/consolidated.00.pth`): vLLM reads none of them.
DEFAULT_EXCLUDE = ("original/*", "metal/*", "*.pth", "*.pt", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot",
                   "*.ckpt", "*.tflite")
WEIGHTS = ("*.safetensors",)
# A repo with safetensors weights may also carry Mistral's consolidated copy of them, which vLLM loads only in
# Mistral's format; and PyTorch .bin files, which vLLM falls back to only when there are no safetensors.
CONSOLIDATED = "consolidated*.safetensors"
PYTORCH_BIN = "*.bin"


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int
    etag: str  # the LFS sha256, or the git blob id of a small file: what huggingface_hub compares


@dataclass(frozen=True)
class Selection:
    fetched: tuple[RepoFile, ...]
    skipped: tuple[tuple[RepoFile, str], ...]  # each with the reason, as preflight prints it

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.fetched)


def select(files: Sequence[RepoFile], include: Optional[Sequence[str]] = None,
           exclude: Optional[Sequence[str]] = None) -> Selection:
    """The files a download fetches, and those it skips with why."""
    defaults = include is None and exclude is None
    include = DEFAULT_INCLUDE if include is None else tuple(include)
    exclude = DEFAULT_EXCLUDE if exclude is None else tuple(exclude)
    weights = [f for f in files if _matches(f.path, WEIGHTS) and not _matches(f.path, exclude)]
    plain_weights = [f for f in weights if not fnmatchcase(_name(f.path), CONSOLIDATED)]
    fetched, skipped = [], []
    for f in sorted(files, key=lambda f: f.path):
        excluded = next((p for p in exclude if fnmatchcase(f.path, p)), None)
        if excluded is not None:
            skipped.append((f, f"excluded ({excluded})"))
        elif defaults and fnmatchcase(_name(f.path), CONSOLIDATED) and plain_weights:
            skipped.append((f, "a consolidated copy of the safetensors weights"))
        elif defaults and fnmatchcase(f.path, PYTORCH_BIN) and weights:
            skipped.append((f, "PyTorch weights beside safetensors ones"))
        elif defaults and fnmatchcase(f.path, PYTORCH_BIN):
            fetched.append(f)  # no safetensors: vLLM loads these
        elif _matches(f.path, include):
            fetched.append(f)
        else:
            skipped.append((f, "not a file vLLM reads" if defaults else "not included"))
    return Selection(tuple(fetched), tuple(skipped))


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(path, p) for p in patterns)


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]
