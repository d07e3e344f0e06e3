"""bench/run --compare: each headline figure against a saved run's, a regression only beyond both runs' noise."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import report  # noqa: E402
import timing  # noqa: E402


def run(preview: list[float], mp_up_8: list[float] | None = None) -> dict:
    stat = timing.stats(preview)
    mp = {"2": {}, **({"8": {"up_ratio_vs_2": timing.stats(mp_up_8)}} if mp_up_8 else {})}
    return {"date": "2026-12-07 16:00 UTC", "command": "bench/run", "figures": {
        "noop_preview": {"spark_vllm_s": stat}, "mp": {"scaling": mp}}}


def rows(text: str) -> dict[str, list[str]]:
    return {cells[1].strip(): [c.strip() for c in cells[2:-1]] for cells in
            (line.split("|") for line in text.splitlines() if line.startswith("| ") and "---" not in line)}


def test_a_range_wholly_above_the_saved_one_is_a_regression_and_overlap_is_noise():
    saved = run([2.0, 2.1, 2.2], [1.5, 1.6, 1.7])
    worse = rows(report.compare(run([2.3, 2.4, 2.5], [1.4, 1.55, 1.8]), saved))
    assert worse["no-op preview (s)"] == ["2.10 [2.00–2.20]", "2.40 [2.30–2.50]", "1.14", "worse: a regression"]
    assert worse["mp at N=8: up ÷ N=2"] == ["1.60 [1.50–1.70]", "1.55 [1.40–1.80]", "0.97", "within the noise"]
    better = rows(report.compare(run([1.5, 1.6, 1.7]), saved))
    assert better["no-op preview (s)"][3] == "better"
    noise = rows(report.compare(run([2.15, 2.25, 2.3]), saved))
    assert noise["no-op preview (s)"][3] == "within the noise"
    assert noise["up from empty, Ray (s)"] == ["—", "—", "—", "not in both runs"]


def test_the_cpu_of_a_command_is_what_the_machine_spent_while_it_ran(tmp_path):
    busy = timing.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                       "while time.process_time() - t < 0.5: pass"], tmp_path, {})
    idle = timing.run(["sleep", "0.5"], tmp_path, {})
    assert busy.returncode == 0 and busy.cpu_s >= 0.4
    assert idle.cpu_s < busy.cpu_s
