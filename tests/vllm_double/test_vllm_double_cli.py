"""The double's package surface and `vllm serve` flag parsing (no Ray, no model needed)."""

import shutil
import subprocess
import sys

from vllm_double_support import DOUBLE_SRC, double_env

EXPECTED_ARCHS = {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM",
                  "MistralForCausalLM", "Qwen2ForCausalLM", "GptOssForCausalLM"}


def python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], env=double_env(), check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_module_reports_double_version_and_real_arch_names():
    assert python("import vllm; print(vllm.__version__)") == "0.0.0+double"
    archs = python("from vllm import ModelRegistry; print(*ModelRegistry.get_supported_archs())").split()
    assert EXPECTED_ARCHS <= set(archs)
    assert not any(arch.startswith("Qwen3_5") for arch in archs)


def test_unknown_flag_is_refused_like_argparse(run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--no-such-flag", "3"])
    assert result.returncode == 2
    assert "error: unrecognized arguments: --no-such-flag 3" in result.stdout


def test_bad_flag_value_is_refused(run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--tensor-parallel-size", "two"])
    assert result.returncode == 2
    assert "argument --tensor-parallel-size/-tp: invalid int value: 'two'" in result.stdout
    result = run_double(["serve", str(tiny_model), "--kv-cache-dtype", "int3"])
    assert result.returncode == 2
    assert "invalid choice: 'int3'" in result.stdout


def test_abbreviated_flag_is_refused(run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--tensor-parallel", "1"])
    assert result.returncode == 2
    assert "unrecognized arguments: --tensor-parallel 1" in result.stdout


def test_serve_needs_a_model(run_double):
    result = run_double(["serve"])
    assert result.returncode == 2
    assert "the following arguments are required: model_tag" in result.stdout


def test_flags_the_program_uses_are_parsed(run_double, tmp_path):
    """Every flag spark-vllm passes parses; the run then fails on the missing model, not on flags."""
    missing = tmp_path / "absent"
    result = run_double([
        "serve", str(missing), "--served-model-name", "tiny", "-tp", "1", "-pp", "1",
        "--distributed-executor-backend", "uni", "--gpu-memory-utilization", "0.8",
        "--max_model_len", "32k", "--enforce-eager", "--load-format", "fastsafetensors",
        "--max-num-seqs", "8", "--kv-cache-dtype", "fp8", "--trust-remote-code",
        "--dtype", "bfloat16", "--api-key", "k", "--uvicorn-log-level", "warning",
        "--disable-log-requests", "--enable-prefix-caching",
    ])
    assert result.returncode == 1, result.stdout
    assert "'max_model_len': 32000" in result.stdout  # underscore spelling and 32k both accepted
    assert "'load_format': 'fastsafetensors'" in result.stdout
    assert f"Invalid repository ID or local directory specified: '{missing}'" in result.stdout


def test_version_flag(run_double):
    result = run_double(["--version"])
    assert result.returncode == 0
    assert result.stdout.strip() == "0.0.0+double"


def test_package_installs_with_console_script(tmp_path):
    """pip builds the pyproject (offline, no build isolation) and installs the `vllm` entry point."""
    source = tmp_path / "src"
    shutil.copytree(DOUBLE_SRC, source, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                      "__pycache__"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(source)],
                   check=True, timeout=300, capture_output=True)
    script = target / "bin" / "vllm"
    assert script.exists()
    env = double_env(PYTHONPATH=str(target))
    result = subprocess.run([str(script), "--version"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0.0.0+double"
