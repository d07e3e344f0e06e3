"""Which files of a Hub repo the download fetches: the files vLLM reads, never the copies it never reads."""

from __future__ import annotations

from components.nodes.hub_files import RepoFile, select

GB = 10**9


def repo(*entries) -> list[RepoFile]:
    return [RepoFile(path, size, f"etag-{i}") for i, (path, size) in enumerate(entries)]


# The shape of openai/gpt-oss-120b's repo: the converted checkpoint at the top, the original one in original/ and a
# Metal one in metal/, each about 65 GB (sparkrun 142: 65 GB fetched instead of 196 GB).
GPT_OSS = repo(*[(f"model-{k:05d}-of-00014.safetensors", int(4.6 * GB)) for k in range(15)],
               ("model.safetensors.index.json", 55_000), ("config.json", 1_800), ("generation_config.json", 180),
               ("tokenizer.json", 27_000_000), ("tokenizer_config.json", 4_200), ("special_tokens_map.json", 100),
               ("chat_template.jinja", 16_000), ("README.md", 7_000), ("LICENSE", 11_000), ("USAGE_POLICY", 200),
               ("original/config.json", 400), ("original/dtypes.json", 14_000),
               *[(f"original/model--{k:05d}-of-00007.safetensors", int(9.3 * GB)) for k in range(1, 8)],
               ("metal/model.bin", 65 * GB))


def test_gpt_oss_fetches_the_converted_checkpoint_alone():
    chosen = select(GPT_OSS)
    names = [f.path for f in chosen.fetched]
    assert names == sorted(["chat_template.jinja", "config.json", "generation_config.json",
                            "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.json",
                            "tokenizer_config.json", *[f"model-{k:05d}-of-00014.safetensors" for k in range(15)]])
    assert 69 * GB < chosen.bytes < 70 * GB  # of about 196 GB in all
    reasons = {f.path: why for f, why in chosen.skipped}
    assert reasons["original/model--00001-of-00007.safetensors"] == "excluded (original/*)"
    assert reasons["original/config.json"] == "excluded (original/*)"
    assert reasons["metal/model.bin"] == "excluded (metal/*)"
    assert reasons["README.md"] == reasons["LICENSE"] == "not a file vLLM reads"


def test_other_frameworks_weights_and_a_consolidated_copy_are_skipped():
    files = repo(("model-00001-of-00002.safetensors", 10), ("model-00002-of-00002.safetensors", 10),
                 ("consolidated.safetensors", 20), ("pytorch_model.bin", 20), ("model.gguf", 5), ("tf_model.h5", 5),
                 ("flax_model.msgpack", 5), ("consolidated.00.pth", 5), ("tokenizer.model", 1), ("params.json", 1),
                 ("merges.txt", 1), ("vocab.json", 1), ("modeling_custom.py", 1))
    chosen = select(files)
    assert [f.path for f in chosen.fetched] == ["merges.txt", "model-00001-of-00002.safetensors",
                                                 "model-00002-of-00002.safetensors", "modeling_custom.py",
                                                 "params.json", "tokenizer.model", "vocab.json"]
    assert {f.path: why for f, why in chosen.skipped} == {
        "consolidated.safetensors": "a consolidated copy of the safetensors weights",
        "pytorch_model.bin": "PyTorch weights beside safetensors ones",
        "model.gguf": "excluded (*.gguf)", "tf_model.h5": "excluded (*.h5)",
        "flax_model.msgpack": "excluded (*.msgpack)", "consolidated.00.pth": "excluded (*.pth)"}


def test_pytorch_weights_are_fetched_when_there_are_no_safetensors():
    files = repo(("pytorch_model-00001-of-00002.bin", 10), ("pytorch_model-00002-of-00002.bin", 10),
                 ("config.json", 1))
    assert [f.path for f in select(files).fetched] == ["config.json", "pytorch_model-00001-of-00002.bin",
                                                        "pytorch_model-00002-of-00002.bin"]


def test_a_consolidated_checkpoint_alone_is_the_weights():
    files = repo(("consolidated.safetensors", 10), ("params.json", 1), ("tekken.json", 1))
    assert [f.path for f in select(files).fetched] == ["consolidated.safetensors", "params.json", "tekken.json"]


def test_a_stacks_patterns_replace_the_defaults_and_their_rules():
    files = repo(("model.safetensors", 10), ("consolidated.safetensors", 10), ("original/x.pth", 3),
                 ("README.md", 1))
    include = select(files, include=["*"])
    assert [f.path for f in include.fetched] == ["README.md", "consolidated.safetensors", "model.safetensors"]
    assert [(f.path, why) for f, why in include.skipped] == [("original/x.pth", "excluded (original/*)")]
    # The default inclusions still hold: a .pth is no file vLLM reads; a consolidated copy is no longer a duplicate.
    exclude = select(files, exclude=["README.md"])
    assert [f.path for f in exclude.fetched] == ["consolidated.safetensors", "model.safetensors"]
    assert [(f.path, why) for f, why in exclude.skipped] == [("README.md", "excluded (README.md)"),
                                                              ("original/x.pth", "not included")]
