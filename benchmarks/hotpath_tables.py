"""The generated blocks of docs/performance.md that are not the overload rows: the embedded invocation's
profile (``make profile-results``: blocks ``profile-after``, ``control-path``, ``timeline`` and ``lean``,
the numbers the native-code decision rests on) and the pipeline against Ray Serve (``make ray-serve-results``).

    .venv/bin/python benchmarks/hotpath_tables.py benchmarks/results/profile-after-cpu.json --block profile-after
    .venv/bin/python benchmarks/hotpath_tables.py benchmarks/results/profile-after-cpu.json --block control-path
    .venv/bin/python benchmarks/hotpath_tables.py benchmarks/results/ray-serve.json --block ray-serve --write docs/performance.md
    .venv/bin/python benchmarks/hotpath_tables.py benchmarks/results/profile-timeline-cpu.json --block timeline --write docs/performance.md
    .venv/bin/python benchmarks/hotpath_tables.py benchmarks/results/profile-lean-cpu.json --block lean --write docs/performance.md
"""

from __future__ import annotations

from typing import Any

from doc_blocks import table_main


def _opt(x: Any, spec: str, unit: str = "") -> str:
    return "-" if x is None else f"{format(x, spec)}{unit}"


def _origin(doc: dict[str, Any]) -> str:
    p = doc.get("provenance", {})
    m = p.get("machine") or {}
    return (f"`{p.get('command', '?')}` at commit `{str(p.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} "
            f"({m.get('cores', '?')} CPUs, load average {(m.get('loadavg') or ['?'])[0]} at the start)")


def profile_after(doc: dict[str, Any]) -> str:
    cpu = doc["cpu_ms_per_invocation"]
    lines = [f"{_origin(doc)}: {doc['invocations']:,} invocations one after another, p50 {doc['p50_ms']:.2f} ms, "
             f"p99 {doc['p99_ms']:.2f} ms, wall {doc['wall_ms_per_invocation']:.2f} ms per invocation.", "",
             "| process | CPU ms per invocation |", "|---|---:|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in sorted(cpu.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def _waking(sleeping_us: float, polling_us: float) -> str:
    """What the echo round trips say about waking a process, in the words the numbers support (the
    VMs this ran on differ: halted vCPUs made a wake-up several hops long on one, a few us on another)."""
    if sleeping_us >= 2 * polling_us:
        return "on this machine, waking a sleeping process is most of a hop"
    return f"on this machine, waking the two sleeping ends adds {sleeping_us - polling_us:.1f} us to a round trip"


def control_path(doc: dict[str, Any]) -> str:
    """Where the CPU of one tiny invocation goes, thread by thread and process by process, with the
    Python calls behind it, and what that bounds (the decision on native code)."""
    cpu = doc["cpu_us_per_invocation"]
    calls = doc["python_calls_per_invocation"]
    floor = doc["pipe_floor_us"]
    p50_us = doc["p50_ms"] * 1e3
    lines = [f"{_origin(doc)}: p50 {p50_us:.0f} us, {p50_us / floor:.0f}x the two-hop pipe floor of the same run "
             f"({floor:.1f} us).", "",
             "| thread or process | user us | system us |", "|---|---:|---:|"]
    for name, v in sorted(cpu.items(), key=lambda kv: -(kv[1]["user"] + kv[1]["system"])):
        lines.append(f"| {name} | {v['user']:.0f} | {v['system']:.0f} |")
    workers = [v for k, v in cpu.items() if k.startswith("worker")]
    runtime = [v for k, v in cpu.items() if k.startswith("runtime")]
    w_us = sum(v["user"] + v["system"] for v in workers)
    r_us = sum(v["user"] + v["system"] for v in runtime)
    th = calls["runtime_threads"]
    lines += ["", "| Python function calls per invocation | |", "|---|---:|"]
    lines += [f"| runtime, {name} thread | {n:.0f} |" for name, n in sorted(th.items(), key=lambda kv: -kv[1])]
    lines += [f"| {name}, per task (its hosts alone: no socket, no log capture) | {n:.0f} |"
              for name, n in sorted(calls["workers"].items())]
    what = "the worker" if len(workers) == 1 else f"the {len(workers)} workers"
    off, wake = doc.get("without_polling"), doc.get("wake")
    cpu = f"The runtime's threads take {r_us:.0f} us of CPU per invocation and {what} {w_us:.0f} us"
    if not (off and wake):  # a profile from before the waiters polled
        lines += ["", f"{cpu}. The workers' share is on the critical path, so even a runtime that cost nothing "
                  f"would leave at least {w_us:.0f} us, {w_us / floor:.0f}x the floor."]
    else:
        lines += ["", f"{cpu}, both counting the time they poll, which is off the critical path (the timeline "
                  f"below follows it).", "", f"Waiting without sleeping (`RuntimeConfig.poll_us` = {doc['poll_us']}): the same loop with nobody "
                  f"polling (`poll_us=0`), in the same run, takes p50 {off['p50_ms'] * 1e3:.0f} us and "
                  f"{off['cpu_ms_per_invocation'] * 1e3:.0f} us of CPU per invocation, against "
                  f"{p50_us:.0f} us and {sum(doc['cpu_ms_per_invocation'].values()) * 1e3:.0f} us polling. "
                  f"A 64-byte round trip to an echo process takes {wake['sleeping_p50_us']:.1f} us when both ends "
                  f"sleep in `recv` and {wake['polling_p50_us']:.1f} us when both poll ({wake['think_us']:.0f} us of "
                  f"work between round trips): {_waking(wake['sleeping_p50_us'], wake['polling_p50_us'])}."]
    return "\n".join(lines)


def timeline(doc: dict[str, Any]) -> str:
    """The embedded invocation's critical path, moment by moment, against the pipe floor."""
    floor = doc["pipe_floor_us"]
    wall = doc["wall_ms"]["p50"] * 1e3
    lines = [f"{_origin(doc)}: {doc['invocations']:,} invocations, p50 {wall:.0f} us, {wall / floor:.0f}x the least "
             f"two-hop pipe floor of the same run ({floor:.1f} us; bursts "
             f"{', '.join(f'{x:.1f}' for x in doc['pipe_floor_bursts_us'])} us).", "",
             "| moment | what happened since the one before | p50 us |", "|---|---|---:|"]
    lines += [f"| {st['step']} | {st['what']} | {st['p50_ms'] * 1e3:.0f} |" for st in doc["steps"]]
    worker = doc.get("worker_reported_p50_ms") or {}
    handlers = sum(v for k, v in worker.items()) * 1e3
    trip = next((st["p50_ms"] * 1e3 for st in doc["steps"] if st["step"].endswith("_reply")), None)
    if trip is not None:
        split = doc.get("round_trip_split") or {}
        if split:  # the worker's own loop time came back in its Done (busy_s)
            lines += ["", f"The worker's round trip takes {trip:.0f} us at p50. Inside the worker, from the task's "
                      f"arrival to the reply's encoding, {split['worker_loop_p50_ms'] * 1e3:.0f} us: the handlers "
                      f"report {split['handlers_p50_ms'] * 1e3:.0f} us (get, compute and put), and the worker's "
                      f"framework around them (checks, contexts, values, log capture, the chain) takes "
                      f"{split['worker_framework_p50_ms'] * 1e3:.0f} us. The two process hops with their encoding "
                      f"and decoding take the rest, {split['hops_p50_ms'] * 1e3:.0f} us (medians of per-invocation "
                      "differences)."]
        else:
            lines += ["", f"The worker's round trip takes {trip:.0f} us at p50, of which its handlers report "
                      f"{handlers:.0f} us (get, compute and put, medians summed): the other {trip - handlers:.0f} us "
                      f"are two process hops and the worker's own framework, {(trip - handlers) / floor:.1f}x the "
                      "floor by themselves."]
    replay = (doc.get("replay") or {}).get("p50_ms")
    if replay is not None:
        alone = replay * 1e3
        lines += ["", f"The same task sent again to the same warm worker by a caller that does nothing else "
                  f"(`replay`) comes back in {alone:.0f} us at p50, {alone / floor:.1f}x the floor: about what the "
                  f"invocation would take if the runtime's work on the caller's side cost nothing. The invocation "
                  f"takes {wall - alone:.0f} us more: the caller's steps above (with this run's timing wrappers) and "
                  f"the difference between the worker's round trip in an invocation and the replayed one. With the "
                  f"replay's round trip, 10 times the floor leaves the caller's side "
                  f"{max(0.0, 10 * floor - alone):.0f} us."]
    readers = doc.get("reply_threads") or {}
    if readers:
        total = sum(readers.values())
        lines += ["", "Replies handled, by thread: " + ", ".join(
            f"{name} {n / total:.0%}" for name, n in sorted(readers.items(), key=lambda kv: -kv[1])) +
            " (the caller: it read its own replies, ReplyLoop.drive)."]
    return "\n".join(lines)


def lean(doc: dict[str, Any]) -> str:
    """The invocation against the essential work of one (profile_invoke.py lean)."""
    floor = doc["pipe_floor_us"]
    inv, ess = doc["invoke_p50_us"], doc["essential_p50_us"]
    n, k = doc["calls_per_block"], doc["blocks"]
    return "\n".join([
        f"{_origin(doc)}: {k} alternating blocks of {n:,} calls each. The least two-hop pipe floor of the run: "
        f"{floor:.1f} us.", "",
        "| | p50 us (median of the blocks) | blocks | x the floor |", "|---|---:|---|---:|",
        f"| `LocalRuntime.invoke` | {inv:.0f} | {', '.join(f'{x:.0f}' for x in doc['invoke_p50_us_blocks'])} | "
        f"{inv / floor:.1f} |",
        f"| the essential work alone | {ess:.0f} | {', '.join(f'{x:.0f}' for x in doc['essential_p50_us_blocks'])} | "
        f"{ess / floor:.1f} |", "",
        f"Per block, the invocation took {doc['invoke_over_essential']:.2f}x the essential work "
        f"({doc['bookkeeping_us']:.0f} us more; medians over the blocks): that difference is the runtime's "
        "bookkeeping around one invocation."])


def ray_serve(doc: dict[str, Any]) -> str:
    lines = [f"{_origin(doc)}, Ray {doc['ray_version']}, {doc['samples']} requests per size after "
             f"{doc['warmup']} warm-up ones, one at a time:", "",
             "| array | gfaas p50 ms | of it: compute / function passing / host passing | Ray Serve p50 ms | "
             "Ray Serve / gfaas | the work alone, ms | what Ray Serve adds / what gfaas adds |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        size = r["size_bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        b = r.get("gfaas_breakdown_p50_ms") or {}
        parts = " / ".join("-" if b.get(k) is None else f"{b[k]:.2f}" for k in ("compute", "fn_pass", "host_pass"))
        added = r.get("ray_serve_added_over_gfaas_added")
        lines.append(f"| {label} | {r['gfaas_p50_ms']:.2f} | {parts} | {r['ray_serve_p50_ms']:.2f} | "
                     f"{r['ray_serve_over_gfaas']:.1f}x | {_opt(r.get('bare_p50_ms'), '.2f')} | "
                     f"{_opt(added, '.1f', 'x')} |")
    for t in doc.get("targets") or [doc["target"]]:  # (one target in files before the 64 KiB one)
        state = "not measured" if t["met"] is None else "met" if t["met"] else "**not met**"
        lines += ["", f"Target: {t['what']}: {t['value']}x, {state}."]
    return "\n".join(lines)


def main() -> None:
    import sys

    block = sys.argv[sys.argv.index("--block") + 1] if "--block" in sys.argv else "profile-after"
    render = {"profile-after": profile_after, "control-path": control_path, "ray-serve": ray_serve,
              "timeline": timeline, "lean": lean}[block]
    table_main(__doc__ or "", block, render)


if __name__ == "__main__":
    main()
