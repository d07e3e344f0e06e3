"""The artifacts' config: a preset's `hub:` (each key overridable by the stack), the stack's `images:` and the registry
password, checked once, each refusal one sentence."""

from __future__ import annotations

import pytest

from components.config import loader
from components.config.artifacts_config import HubSpec, ImagesSpec, registry_of
from components.config.schema import ConfigError
from fixtures import models_with, stack_config, write_catalog
from harness import ROOT

REPO = "Qwen/Qwen3-30B-A3B-FP8"


def load(tmp_path, hub=None, secret_keys=(), models=None, **extra):
    models = models or models_with(lambda m: m["big"].update(hub=hub) if hub is not None else None)
    cfg = stack_config(write_catalog(tmp_path / "catalog", models=models), preflight={"enabled": True}, **extra)
    return loader.load("test", cfg, {f"spark-vllm:{k}" for k in secret_keys}, ROOT)


def refused(tmp_path, **kwargs) -> str:
    """The refusal, the catalog's folder shown as `catalog`."""
    with pytest.raises(ConfigError) as err:
        load(tmp_path, **kwargs)
    return str(err.value).replace(f"{tmp_path / 'catalog'}/", "catalog/")


def test_a_preset_names_a_hub_repo_and_the_sync_turns_on(tmp_path):
    d = load(tmp_path, hub={"repo": REPO})
    assert d.serve.hub == HubSpec(repo=REPO, revision="main")
    assert d.preflight.sync_weights is True
    assert d.source == d.cluster.head
    assert load(tmp_path / "none").serve.hub is None and load(tmp_path / "none").preflight.sync_weights is False


def test_every_hub_key_is_read_and_the_stack_overrides_each_alone(tmp_path):
    hub = {"repo": REPO, "revision": "v1.0", "endpoint": "http://172.29.87.1:18180", "node": "spark2",
           "include": ["*.safetensors", "*.json"], "exclude": ["original/*"], "stallSeconds": 60}
    d = load(tmp_path, hub=hub, serve={"hub": {"revision": "0123456789abcdef0123456789abcdef01234567"}})
    assert d.serve.hub == HubSpec(repo=REPO, revision="0123456789abcdef0123456789abcdef01234567",
                                  endpoint="http://172.29.87.1:18180", node="spark2",
                                  include=("*.safetensors", "*.json"), exclude=("original/*",), stall_s=60)
    assert d.serve.hub.pinned and d.source.name == "spark2"
    # A stack may name the whole source itself, for a preset that has none.
    assert load(tmp_path / "s", serve={"hub": {"repo": REPO}}).serve.hub == HubSpec(repo=REPO, revision="main")


@pytest.mark.parametrize("hub,serve,message", [
    ({"repo": "not a repo"}, None,
     "catalog/models.yaml: big.hub.repo is 'not a repo'; expected a Hub repo id such as Qwen/Qwen3-30B-A3B-FP8."),
    ({"revision": "main"}, None, "catalog/models.yaml: big.hub.repo is missing; expected a Hub repo id such as "
                                 "Qwen/Qwen3-30B-A3B-FP8."),
    ({"repo": REPO}, {"hub": {"revision": "../x"}},
     "Pulumi.test.yaml: spark-vllm:serve.hub.revision is '../x'; expected a branch, tag or commit of the repo, such "
     "as main or v1.0."),
    ({"repo": REPO, "endpoint": "https://huggingface.co/models"}, None,
     "catalog/models.yaml: big.hub.endpoint is 'https://huggingface.co/models'; expected the Hub's URL, such as "
     "https://huggingface.co (http:// or https://, no path after the host)."),
    ({"repo": REPO, "node": "spark9"}, None,
     "catalog/models.yaml: big.hub.node is 'spark9'; expected one of the stack's nodes: spark1, spark2, spark3."),
    ({"repo": REPO, "include": []}, None,
     "catalog/models.yaml: big.hub.include is []; expected a list of glob patterns of paths in the repo, such as "
     "['*.safetensors', '*.json'], none empty or with surrounding spaces."),
    ({"repo": REPO, "stallSeconds": 1}, None,
     "catalog/models.yaml: big.hub.stallSeconds is 1; expected a whole number from 10 to 86400."),
    ({"repo": REPO, "revsion": "v2"}, None,
     "catalog/models.yaml: big.hub.revsion ('v2') is not a known key (did you mean revision?); expected one of the "
     "known keys: endpoint, exclude, include, node, repo, revision, stallSeconds."),
    ({"repo": REPO}, {"hub": {"mirror": "x"}},
     "Pulumi.test.yaml: spark-vllm:serve.hub.mirror ('x') is not a known key; expected one of the known keys: "
     "endpoint, exclude, include, node, repo, revision, stallSeconds."),
])
def test_a_bad_hub_key_is_one_sentence_blaming_its_file(tmp_path, hub, serve, message):
    assert refused(tmp_path, hub=hub, **({"serve": serve} if serve else {})) == message


def test_a_hub_model_needs_preflight_and_the_sync(tmp_path):
    hub = {"repo": REPO}
    models = models_with(lambda m: m["big"].update(hub=hub))
    off = stack_config(write_catalog(tmp_path / "a", models=models), preflight={"enabled": False})
    with pytest.raises(ConfigError) as err:
        loader.load("test", off, set(), ROOT)
    assert str(err.value) == (
        "Pulumi.test.yaml: spark-vllm:preflight.enabled is false, but the download acts on what preflight finds on "
        "the node and asks the Hub; expected true with a model whose weights come from the Hub (serve.hub).")
    no_sync = stack_config(write_catalog(tmp_path / "b", models=models), preflight={"enabled": True,
                                                                                      "syncWeights": False})
    with pytest.raises(ConfigError) as err:
        loader.load("test", no_sync, set(), ROOT)
    assert str(err.value) == (
        "Pulumi.test.yaml: spark-vllm:preflight.syncWeights is false, but the other nodes get the download by the "
        "sync; expected true (or left out) with a model whose weights come from the Hub (serve.hub).")


def test_images_pull_and_the_registry_login(tmp_path):
    assert load(tmp_path).images == ImagesSpec()
    d = load(tmp_path / "b", images={"pull": "head", "registryUser": "$oauthtoken", "stallSeconds": 120},
             registryPassword="nvapi-secret", secret_keys=("registryPassword",))
    assert d.images == ImagesSpec(pull="head", registry_user="$oauthtoken", registry_password=True, stall_s=120)
    assert "registryPassword" not in d.secrets  # the serve never gets it


@pytest.mark.parametrize("extra,secret_keys,message", [
    ({"images": {"pull": "some"}}, (),
     "Pulumi.test.yaml: spark-vllm:images.pull is 'some'; expected one of 'none', 'head', 'all'."),
    ({"images": {"registryUser": "$oauthtoken"}}, (),
     "Pulumi.test.yaml: spark-vllm:images.registryUser is set, but spark-vllm:registryPassword is not; expected a "
     "user with its password: run `pulumi config set --secret spark-vllm:registryPassword <password>` too."),
    ({"registryPassword": "nvapi-plain"}, (),
     "Pulumi.test.yaml: spark-vllm:registryPassword is stored in plain text; expected a secret: run `pulumi config "
     "set --secret spark-vllm:registryPassword <value>`."),
    ({"images": {"pull": "all", "registryUser": "u", "copy": True}, "registryPassword": "p"}, ("registryPassword",),
     "Pulumi.test.yaml: spark-vllm:images.copy (True) is not a known key; expected one of the known keys: pull, "
     "registryUser, stallSeconds."),
])
def test_a_bad_images_key_is_one_sentence(tmp_path, extra, secret_keys, message):
    assert refused(tmp_path, secret_keys=secret_keys, **extra) == message


def test_the_registry_password_is_never_shown(tmp_path):
    message = refused(tmp_path, registryPassword=" nvapi-padded ", secret_keys=("registryPassword",))
    assert message == ("Pulumi.test.yaml: spark-vllm:registryPassword starts or ends with a space; expected a value "
                       "without them: HTTP drops them from a header, so no client could send it.")
    assert "nvapi" not in refused(tmp_path / "b", registryPassword=["nvapi-list"], secret_keys=("registryPassword",))


def test_pulling_needs_preflight(tmp_path):
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": False}, images={"pull": "head"})
    with pytest.raises(ConfigError) as err:
        loader.load("test", cfg, set(), ROOT)
    assert str(err.value) == ("Pulumi.test.yaml: spark-vllm:images.pull is 'head', but which nodes pull is what "
                              "preflight finds, and preflight is off; expected none while preflight.enabled is false.")


@pytest.mark.parametrize("image,registry", [
    ("nvcr.io/nvidia/vllm:26.10-py3", "nvcr.io"), ("172.29.87.1:5000/lab/vllm:1", "172.29.87.1:5000"),
    ("localhost/vllm:1", "localhost"), ("vllm/vllm-openai:v0.20.1", "docker.io"), ("vllm:a", "docker.io"),
])
def test_the_registry_is_the_images_first_part_when_it_names_a_host(image, registry):
    assert registry_of(image) == registry
