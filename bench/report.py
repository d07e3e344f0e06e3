"""The results as one Markdown report: the figures table, then where the time of an up from empty goes."""

from __future__ import annotations


def _s(stat: dict | None) -> str:
    if not stat:
        return "—"
    return f"{stat['median']:.2f} s [{stat['min']:.2f}–{stat['max']:.2f}]"


def _x(stat: dict | None) -> str:
    if not stat:
        return "—"
    return f"{stat['median']:.2f}× [{stat['min']:.2f}–{stat['max']:.2f}]"


def markdown(r: dict) -> str:
    f = r["figures"]
    rows = [
        ("1", "no-op `pulumi preview`", _s(f["noop_preview"]["spark_vllm_s"]),
         "empty program: " + _s(f["noop_preview"]["empty_program_s"]), _x(f["noop_preview"]["ratio"]), "≤ 1.5×"),
        ("1", "… the same with `preflight.enabled: false`", _s(f["noop_preview"]["without_preflight_s"]),
         "empty program (same repetition)", _x(f["noop_preview"]["without_preflight_ratio"]), "—"),
        ("1", "… against the providers' floor", "",
         "both plugins, one resource each: " + _s(f["noop_preview"].get("providers_floor_s")),
         _x(f["noop_preview"].get("providers_ratio")), "≤ 1.3× (real plugins)"),
        ("2", "no-op `pulumi up`", _s(f["noop_up"]["spark_vllm_s"]), "none (the seed restarts everything)", "—", "—"),
        ("3", "serve-only change → `/v1/models` answers", _s(f["serve_change"]["spark_vllm_s"]),
         "seed full restart: " + _s(f["serve_change"]["seed_s"]), _x(f["serve_change"]["ratio"]), "≤ 0.3×"),
        ("3", "… containers restarted", _counts(f["serve_change"]["containers_restarted"]["spark_vllm"]),
         _counts(f["serve_change"]["containers_restarted"]["seed"]), "—", "0 vs all"),
        ("3", "… with `executor: mp` → `/v1/models` answers", _s(f["mp"]["serve_change"]["spark_vllm_s"]),
         "seed full restart (same repetition)", _x(f["mp"]["serve_change"]["ratio"]), "—"),
        ("3", "… mp containers restarted", _counts(f["mp"]["serve_change"]["containers_restarted"]), "", "—",
         "all (one torch.distributed group)"),
        ("4", "up from empty → `/v1/models` answers", _s(f["cold_start"]["spark_vllm_s"]),
         "seed cold start: " + _s(f["cold_start"]["seed_s"]), _x(f["cold_start"]["ratio"]), "≤ 1.2×"),
        ("4", "… with `executor: mp` (no Ray) → `/v1/models` answers", _s(f["mp"]["cold_start"]["spark_vllm_s"]),
         "seed cold start (same repetition)", _x(f["mp"]["cold_start"]["ratio"]), "≤ 1.0×"),
        ("4", "… mp against Ray", "", "spark-vllm with Ray (same repetition)",
         _x(f["mp"]["cold_start"]["vs_ray_ratio"]), "—"),
        ("4", "… seed's `sleep 5` too short", "— (waits for Ray)",
         f"{f['seed_sleep']['too_short']} of {f['seed_sleep']['runs']} runs; the worker registered "
         + _s(f["seed_sleep"]["worker_late_s"]) + " after serve was launched"
         + (f"; {f['seed_sleep']['never_served']} more runs never served (their serve exited) and were run again"
            " with the sleep doubled" if f["seed_sleep"].get("never_served") else ""), "—", "—"),
    ]
    for n, s in sorted(f["scaling"].items(), key=lambda kv: int(kv[0])):
        for key, label in (("preview_s", "preview from empty"), ("up_s", "up from empty → `/v1/models`")):
            ratio = s.get(key.replace("_s", "_ratio_vs_2"))
            cpu = f"; CPU {_s(s['up_cpu_s'])}" if key == "up_s" and s.get("up_cpu_s") else ""
            rows.append(("5", f"N={n}: {label}", _s(s[key]) + cpu, "vs N=2 in the same run" if ratio else "",
                         _x(ratio), "≤ 1.2× at N=4" if ratio else ""))
    for n, mp in sorted(f["mp"]["scaling"].items(), key=lambda kv: int(kv[0])):
        for key, label in (("up", "mp up from empty → `/v1/models`"), ("preview", "mp no-op preview"),
                           ("repair", "mp repair of one dead worker → `/v1/models`")):
            ratio = mp.get(f"{key}_ratio_vs_2")
            cpu = f"CPU {_s(mp.get(f'{key}_cpu_s'))}" + (
                f" (the nodes {_s(mp[f'{key}_nodes_cpu_s'])}, `pulumi` and its plugins {_s(mp[f'{key}_pulumi_cpu_s'])})"
                if f"{key}_pulumi_cpu_s" in mp else "")
            rows.append(("5", f"N={n}: {label}", f"{_s(mp.get(f'{key}_s'))}; {cpu}",
                         "vs mp N=2 in the same run" if ratio else "", _x(ratio), "≤ 1.2× at N=8" if ratio else ""))
    out = [f"Lab benchmark, {r['date']}, {r['reps']} repetitions (median [min–max]); `{r['command']}`", "",
           "| # | figure | spark-vllm | baseline or floor | ratio | goal |", "|---|---|---|---|---|---|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    b = f["breakdown"]
    for title, steps in (("an up from empty", b["steps"]), ("a serve-only change", b["serve_change_steps"]),
                         ("an up from empty with `executor: mp`", f["mp"]["steps"])):
        out += ["", f"Where {title} (N=2) spends its time: engine steps from the event log, median of the"
                    " repetitions, seconds since `pulumi up` started:", "",
                "| step | start | end | took |", "|---|---|---|---|"]
        out += [f"| {s['name']} ({s['op']}) | {s['start_s']:.2f} | {s['end_s']:.2f} | {s['end_s'] - s['start_s']:.2f} |"
                for s in steps]
    out += _by_size("Up from empty by cluster size", f["scaling"], "containers created by", "cluster-ready gate",
                    "cluster-ready-")
    out += _by_size("Up from empty with `executor: mp` by cluster size", f["mp"]["scaling"],
                    "rank containers created by", "slowest ranks-ready gate", "ranks-ready-")
    out += ["", "The engine's own cost: a no-op preview of a deployed program of as many resources (remote commands"
                " that do nothing), against mp's no-op preview", "",
            "| N | resources | engine alone | mp no-op preview | ratio |", "|---|---|---|---|---|"]
    out += [f"| {n} | {mp['resources']} | {_s(mp['engine_floor_preview_s'])} | {_s(mp['preview_s'])} |"
            f" {_x(mp['preview_ratio_vs_engine_floor'])} |"
            for n, mp in sorted(f["mp"]["scaling"].items(), key=lambda kv: int(kv[0])) if "resources" in mp]
    out += [f"mp at N={n}: rank containers after up {_counts(mp['ranks_after_up'])}, after the repair "
            f"{_counts(mp['ranks_after_repair'])}; spark-vllm containers left after destroy "
            f"{_counts(mp['containers_left_after_destroy'])}"
            for n, mp in sorted(f["mp"]["scaling"].items(), key=lambda kv: int(kv[0])) if "ranks_after_up" in mp]
    out.append(f"\nUp from empty: the first resource step began {_s(b['first_step_s'])} after `pulumi up` started"
               " (CLI, language host, program, preflight).")
    fl = b["floors"]
    out += ["", "| floor | time |", "|---|---|",
            f"| ssh round trip, node1 (direct) | {_s(fl['ssh_direct_s'])} |",
            f"| ssh round trip, node2 (through node1) | {_s(fl['ssh_jump_s'])} |",
            f"| Ray join: worker container started → raylet registered (seed runs) | {_s(fl['ray_join_s'])} |",
            f"| stand-in load (`Loading weights took`), spark-vllm / seed | {_s(fl['load_s']['spark_vllm'])} /"
            f" {_s(fl['load_s']['seed'])} |"]
    if r["parity"]:
        out += ["", "Seed vs spark-vllm containers and serve command: " + ("identical" if r["parity"] == "identical"
                                                                            else "DIFFERENT: " + r["parity"])]
    return "\n".join(out)


def _by_size(title: str, scaling: dict, made_label: str, gate_label: str, gate_prefix: str) -> list[str]:
    """A row a cluster size: when the first step began and the containers were made, what the slowest gate whose
    name starts with `gate_prefix` and the serve-ready gate took, and the whole up."""
    out = ["", f"{title}: engine steps (median, seconds)", "",
           f"| N | first step at | {made_label} | {gate_label} | serve-ready gate | whole up |",
           "|---|---|---|---|---|---|"]
    for n, s in sorted(scaling.items(), key=lambda kv: int(kv[0])):
        took = {st["name"]: st["end_s"] - st["start_s"] for st in s["steps"]}
        made = max(st["end_s"] for st in s["steps"] if st["name"].endswith("-container"))
        gate = max(t for name, t in took.items() if name.startswith(gate_prefix))
        out.append(f"| {n} | {s['steps'][0]['start_s']:.2f} | {made:.2f} | {gate:.2f} |"
                   f" {took['serve-ready-gate']:.2f} | {s['up_s']['median']:.2f} |")
    return out


def _counts(values: list[int]) -> str:
    return ", ".join(str(v) for v in sorted(set(values)))


# The headline figures a change must not make worse: (label, path in the figures, lower is better).
HEADLINES = [
    ("no-op preview (s)", ("noop_preview", "spark_vllm_s")),
    ("no-op preview ÷ empty program", ("noop_preview", "ratio")),
    ("no-op preview ÷ providers' floor", ("noop_preview", "providers_ratio")),
    ("up from empty, Ray (s)", ("cold_start", "spark_vllm_s")),
    ("up from empty, Ray ÷ seed", ("cold_start", "ratio")),
    ("serve-only change, Ray ÷ seed", ("serve_change", "ratio")),
    ("up from empty, mp ÷ seed", ("mp", "cold_start", "ratio")),
    ("serve-only change, mp ÷ seed", ("mp", "serve_change", "ratio")),
]


def _at(figures: dict, path: tuple) -> dict | None:
    for key in path:
        if not isinstance(figures, dict) or key not in figures:
            return None
        figures = figures[key]
    return figures


def compare(now: dict, saved: dict) -> str:
    """Every headline figure of this run against a saved run's: a regression is a range wholly above the saved
    range (beyond the noise of both), an improvement one wholly below."""
    paths = list(HEADLINES)
    for n in sorted(now["figures"]["mp"]["scaling"], key=int):
        if n != "2":
            paths += [(f"mp at N={n}: {key} ÷ N=2", ("mp", "scaling", n, f"{key}_ratio_vs_2"))
                      for key in ("up", "preview", "repair")]
    out = ["", f"Against {saved['date']} (`{saved['command']}`):", "",
           "| figure | saved | now | now ÷ saved | verdict |", "|---|---|---|---|---|"]
    for label, path in paths:
        a, b = _at(saved["figures"], path), _at(now["figures"], path)
        if not a or not b:
            out.append(f"| {label} | {_v(a)} | {_v(b)} | — | not in both runs |")
            continue
        verdict = ("worse: a regression" if b["min"] > a["max"] else "better" if b["max"] < a["min"]
                   else "within the noise")
        out.append(f"| {label} | {_v(a)} | {_v(b)} | {b['median'] / a['median']:.2f} | {verdict} |")
    return "\n".join(out)


def _v(stat: dict | None) -> str:
    return "—" if not stat else f"{stat['median']:.2f} [{stat['min']:.2f}–{stat['max']:.2f}]"

