"""Each load format's progress bar, as the double prints it, read by the serve gate's own parser
(components/remote/serve_ready.py): shards for the default loader, batches for fastsafetensors, bytes for
InstantTensor."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_double_support import DOUBLE_SRC, Double, write_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "components" / "remote"))
import serve_ready  # noqa: E402  (the gate runs as a script on the node: no package to import it from)

SHARD_BYTES = 256 << 10


@pytest.mark.parametrize("load_format, desc, unit", [
    ("auto", "Loading safetensors checkpoint shards", "shards"),
    ("fastsafetensors", "Loading fastsafetensors checkpoint shards", "shard batches"),
    ("instanttensor", "Loading safetensors using InstantTensor loader", "bytes"),
])
def test_the_bar_of_each_loader_is_read_by_the_gate(tmp_path, load_format, desc, unit):
    model = write_model(tmp_path / "lab-tiny", shard_bytes=SHARD_BYTES)
    double = Double([str(model), "--served-model-name", "lab-tiny", "--max-model-len", "64", "--load-format",
                     load_format], tmp_path / "double.log", VLLM_DOUBLE_SHARD_DELAY_S="0.1")
    try:
        double.wait_ready(timeout=60)
        bars = [line for line in double.log().splitlines() if re.match(rf"{re.escape(desc)}: +\d+% Completed", line)]
    finally:
        double.stop()
    read = [serve_ready.load_progress(line) for line in bars]
    total = 4 * SHARD_BYTES if unit == "bytes" else 4
    step = SHARD_BYTES if unit == "bytes" else 1
    # tqdm's first line, one a shard, and the last again on close; bytes in 1024-scaled units ("256k/1.00M").
    assert [(u, round(done / step), round(t / step)) for u, done, t in read] == \
        [(unit, k, total // step) for k in (0, 1, 2, 3, 4, 4)], bars


def test_a_loader_whose_package_the_image_lacks_fails_the_load_as_vllm_does(tmp_path):
    """As in the lab's mp image, which has no `instanttensor`: the load stops with the import's own error."""
    model = write_model(tmp_path / "lab-tiny", shard_bytes=SHARD_BYTES)
    double = Double([str(model), "--served-model-name", "lab-tiny", "--max-model-len", "64", "--load-format",
                     "instanttensor"], tmp_path / "double.log", PYTHONPATH=str(DOUBLE_SRC))
    assert double.wait_exit(timeout=60) == 1, double.log()
    assert "ModuleNotFoundError: No module named 'instanttensor'" in double.log()
    assert "Loading safetensors using InstantTensor loader" not in double.log()


def test_every_read_pattern_reads_each_shard_byte_for_byte(tmp_path):
    """Sizes that are no multiple of O_DIRECT's block, nor of the reads' chunk: each pattern counts every byte once."""
    sizes = [0, 1, 4095, 4097, (16 << 20) + 3, (40 << 20) + 4096]
    for i, n in enumerate(sizes):
        (tmp_path / f"s{i}").write_bytes(bytes(n))
    script = ("import sys; from vllm.loader import read_shard; "
              "print([read_shard(p, f) for f in ('auto', 'fastsafetensors', 'instanttensor') for p in sys.argv[1:]])")
    done = subprocess.run([sys.executable, "-c", script, *[str(tmp_path / f"s{i}") for i in range(len(sizes))]],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(DOUBLE_SRC)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sizes * 3)
