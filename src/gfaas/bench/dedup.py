"""``gfaas bench dedup``: page merging of warm function processes against KSM, in one run (root).

For each workload (ResNet-50 and AlexNet at full scale, and 8 x 100 MB of identical random bytes)
and N processes, each system starts N fresh worker processes (:mod:`gfaas.bench.dedup_child`) that
load the same thing, then the bench measures what they use:

* ``none``: each process keeps its own copy (the reference every other row is compared with);
* ``ksm-default``: the processes mark what they loaded mergeable and KSM scans at its default
  settings (100 pages every 20 ms) for the same wall-clock time ``gfaas-merge`` needed;
* ``gfaas-merge``: the same hint, merged by :class:`~gfaas.dedup.controller.MergeController`'s KSM
  burst; ``merge_seconds`` is from the hint until 99% of the pages that end up merged are merged
  (sampled from each process's ``/proc/PID/ksm_stat`` every 10 ms);
* ``gfaas-shared``: the processes map the content from the content-addressed store
  (:func:`gfaas.dedup.shared.load_shared`; models through :func:`gfaas.models.load` ``shared=True``);
* ``gfaas-remap`` (the synthetic row): :func:`gfaas.dedup.remap.remap_shared` remaps each buffer
  onto the store's copy; ``merge_seconds`` is until the last process finished (all run at once on
  the machine's cores).

Every process of a row loads first; then all hint at the same moment, and times count from there.
Definitions: ``pss_mib_per_process`` is the mean proportional set size; ``system_used_mib`` the sum of
the N processes' PSS, i.e. their memory with each shared page (store file or KSM page) counted once
(a machine-wide MemAvailable difference was tried and is too noisy at these sizes);
``reclaimed_fraction`` = (sum of PSS under ``none`` - sum under the system) / ((N - 1) x M), where M
is the private memory one ``none`` process's load added: the share of the duplicate copies given back
(above 1 where a system also drops copies one default onnxruntime session makes);
``density_vs_none`` = ``system_used`` of ``none`` / that of the system: how many more such functions
fit in the same memory. UPM's published figures are listed beside (``../shared/design/anchors.md``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

log = logging.getLogger("gfaas.bench")

SYSTEMS = ("none", "gfaas-merge", "ksm-default", "gfaas-shared")
SYNTHETIC_SYSTEMS = (*SYSTEMS, "gfaas-remap")
MODELS = ("resnet50", "alexnet")
COUNTS = (2, 8, 16)
KSM_DEFAULT = {"pages_to_scan": "100", "sleep_millisecs": "20"}

#: UPM (Qiu, Copik et al.), from its public artifact, 16 containers (anchors.md): PSS per function
#: before -> after, system-memory change, merge speed, warm-start time the madvise adds.
UPM_PUBLISHED = {
    "resnet50": {"pss_mib_none": 293.6, "pss_mib_upm": 224.7, "system_memory_change": -0.21, "madvise_s": 0.17},
    "alexnet": {"pss_mib_none": 388.3, "pss_mib_upm": 164.9, "system_memory_change": -0.55, "madvise_s": 0.44,
                "density": 2.2},
    "merge_gb_per_s": 0.58,
    "source": "spcl/UPM artifact, 16 containers",
}
MIB = 1 << 20


class _Child:
    def __init__(self, job: dict[str, Any]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "gfaas.bench.dedup_child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self._send(json.dumps(job))
        self.info: dict[str, Any] = {}

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _read(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench worker {self.proc.pid} exited ({self.proc.wait()}) before it {what}")
        out: dict[str, Any] = json.loads(line)
        return out

    def loaded(self) -> None:
        self._read("loaded")

    def go(self) -> None:
        self._send("hint")

    def ready(self) -> dict[str, Any]:
        self.info = self._read("hinted")
        return self.info

    def calls(self, n: int) -> list[float]:
        self._send(f"calls {n}")
        return list(self._read("answered")["call_ms"])

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("exit\n")
            self.proc.stdin.close()
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


@contextmanager
def _ksm_default(ksm: Any) -> Any:
    """KSM running at its default scan rate; the previous settings come back even on failure."""
    saved = ksm.read_settings()
    try:
        ksm.write_settings({**KSM_DEFAULT, "run": "1"})
        yield
    finally:
        ksm.write_settings(saved)


def _merged_pages(pids: list[int]) -> int:
    from ..dedup.procstat import ksm_stat

    total = 0
    for pid in pids:
        st = ksm_stat(pid)
        total += st.merging_pages if st else 0
    return total


def _watch_merge(pids: list[int], until: Any, deadline_s: float, t0: float) -> tuple[list[tuple[float, int]], float]:
    """Samples (seconds since ``t0``, merged pages of ``pids``) every 10 ms until ``until()`` or the deadline."""
    samples = [(time.monotonic() - t0, _merged_pages(pids))]
    while time.monotonic() - t0 < deadline_s:
        time.sleep(0.01)
        samples.append((time.monotonic() - t0, _merged_pages(pids)))
        if until():
            break
    return samples, time.monotonic() - t0


def _time_to(samples: list[tuple[float, int]], fraction: float) -> float | None:
    final = samples[-1][1]
    if final <= 0:
        return None
    return next(t for t, v in samples if v >= fraction * final)


def _one(job: dict[str, Any], n: int, system: str, ctx: dict[str, Any]) -> dict[str, Any]:
    from ..dedup.procstat import mem_usage

    kids = [_Child({**job, "system": system}) for _ in range(n)]
    try:
        for k in kids:
            k.loaded()
        # Every process hints at once, after all have loaded: times count from here.
        t_go = time.monotonic()
        for k in kids:
            k.go()
        infos = [k.ready() for k in kids]
        pids = [i["pid"] for i in infos]
        merge_s = merge85 = None
        if system == "gfaas-merge":
            ctl = ctx["controller"]
            for i in infos:
                ctl.hint(i["pid"], domain="bench", workflow="bench", function=job.get("model", "bytes"),
                         nbytes=int(i["hinted_bytes"]))
            samples, took = _watch_merge(pids, lambda: ctl.wait_idle(0.0), 120.0, t_go)
            merge_s, merge85 = _time_to(samples, 0.99), _time_to(samples, 0.85)
            ctx["budget_s"] = max(took, 1.0)
        elif system == "ksm-default":
            with _ksm_default(ctx["ksm"]):
                _watch_merge(pids, lambda: False, ctx.get("budget_s", 5.0), t_go)
        elif system == "gfaas-remap":
            done = sorted(i["hint_t1"] - t_go for i in infos)
            merge_s, merge85 = done[-1], done[max(0, -(-85 * n // 100) - 1)]
        usage = [mem_usage(p) for p in pids]
        call_ms: list[float] = []
        if job["kind"] == "model":
            for k in kids[:2]:
                call_ms += k.calls(5)
    finally:
        for k in kids:
            k.close()
        if system in ("gfaas-shared", "gfaas-remap"):
            from ..dedup.shared import clear_store

            clear_store(Path(job["store_dir"]))
    live = [(u, i) for u, i in zip(usage, infos, strict=True) if u is not None]
    pss = sum(u.pss for u, _ in live)
    what = job["model"] if job["kind"] == "model" else f"{job['nbytes'] // 10**6} MB random bytes"
    row = {"system": system, "model": what, "processes": n, "merge_seconds": merge_s, "merge_seconds_85": merge85,
           "pss_mib_per_process": pss / len(live) / MIB,
           "rss_mib_per_process": sum(u.rss for u, _ in live) / len(live) / MIB,
           # What the N processes hold together: PSS counts each shared page (store file or KSM page)
           # once across its sharers, so the sum is their memory with every copy counted once.
           "system_used_mib": pss / MIB, "sum_pss": pss,
           "added_private_mib": sum(u.private - i["before_private"] for u, i in live) / len(live) / MIB,
           "load_s": sum(i["load_s"] for i in infos) / n, "hint_s": sum(i["hint_s"] for i in infos) / n,
           "hinted_mib": sum(i["hinted_bytes"] for i in infos) / n / MIB,
           "first_call_ms": median(i["first_call_ms"] for i in infos) if job["kind"] == "model" else None,
           "call_ms": median(call_ms) if call_ms else None}
    if system == "ksm-default":
        row["ksm_budget_s"] = ctx.get("budget_s")
    return row


def _relative(rows: list[dict[str, Any]]) -> None:
    """Fill reclaimed_fraction and density_vs_none from each group's ``none`` row."""
    ref = {(r["model"], r["processes"]): r for r in rows if r["system"] == "none"}
    for r in rows:
        base = ref[(r["model"], r["processes"])]
        dup = (r["processes"] - 1) * base["added_private_mib"] * MIB
        r["reclaimed_fraction"] = (base["sum_pss"] - r["sum_pss"]) / dup if dup > 0 else None
        r["density_vs_none"] = base["system_used_mib"] / r["system_used_mib"] if r["system_used_mib"] > 0 else None
        r["pss_ratio_vs_none"] = base["pss_mib_per_process"] / r["pss_mib_per_process"]
        r["call_ms_vs_none"] = (r["call_ms"] / base["call_ms"]) if r["call_ms"] and base["call_ms"] else None
    for r in rows:
        del r["sum_pss"]


def _idle_check(ctx: dict[str, Any], model: str, scale: str, store_dir: Path) -> dict[str, Any]:
    """No hint: the controller must leave KSM alone (no scans) and add no latency to a warm process."""
    ksm, ctl = ctx["ksm"], ctx["controller"]
    before, c0 = ksm.read_settings(), ksm.counters()
    kid = _Child({"kind": "model", "model": model, "scale": scale, "system": "none", "store_dir": str(store_dir)})
    try:
        kid.loaded()
        kid.go()
        kid.ready()
        kid.calls(3)
        with_ctl = kid.calls(15)
        ctl.stop()
        without = kid.calls(15)
        ctl.start()
        with_ctl += kid.calls(15)
    finally:
        kid.close()
    c1 = ksm.counters()
    return {"model": model, "settings_unchanged": ksm.read_settings() == before,
            "ksm_full_scans_delta": c1.full_scans - c0.full_scans,
            "ksm_pages_scanned_delta": c1.pages_scanned - c0.pages_scanned,
            "call_ms_controller_idle": median(with_ctl), "call_ms_no_controller": median(without),
            "latency_ratio": median(with_ctl) / median(without)}


def run(*, models: tuple[str, ...] = MODELS, counts: tuple[int, ...] = COUNTS, scale: str = "full",
        synthetic_procs: int = 8, synthetic_bytes: int = 100 * 10**6, quick: bool = False,
        progress: Any = None) -> dict[str, Any]:
    from ..dedup.controller import MergeController
    from ..dedup.ksm import KsmSysfs

    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if quick:
        models, counts, scale, synthetic_procs, synthetic_bytes = ("resnet50",), (2,), "small", 2, 16 * 10**6
    ksm = KsmSysfs()
    if os.geteuid() != 0 or not ksm.writable():
        raise PermissionError("gfaas bench dedup needs root and a writable /sys/kernel/mm/ksm (it bursts KSM and "
                              "measures other processes' memory); run it with sudo")
    work = Path(tempfile.mkdtemp(prefix="gfaas-bench-dedup-"))
    store_dir = Path(tempfile.mkdtemp(prefix="gfaas-bench-store-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                      else None))
    ctl = MergeController(work / "ksm.saved")
    ctl.start()
    ctx: dict[str, Any] = {"ksm": ksm, "controller": ctl}
    rows: list[dict[str, Any]] = []
    prep: dict[str, float] = {}
    try:
        from ..dedup.ort import prepare
        from ..models import cache

        for m in models:  # built and prepared once, so no row pays for the cache
            t0 = time.perf_counter()
            prepare(cache.path(m, scale))
            prep[m] = time.perf_counter() - t0
        import numpy as np

        blob = work / "synthetic.bin"
        blob.write_bytes(np.random.default_rng(17).integers(0, 256, synthetic_bytes, dtype=np.uint8).tobytes())
        groups: list[tuple[dict[str, Any], int, tuple[str, ...]]] = [
            ({"kind": "bytes", "path": str(blob), "nbytes": synthetic_bytes, "store_dir": str(store_dir)},
             synthetic_procs, SYNTHETIC_SYSTEMS)]
        groups += [({"kind": "model", "model": m, "scale": scale, "store_dir": str(store_dir)}, n, SYSTEMS)
                   for m in models for n in counts]
        for job, n, systems in groups:
            for system in systems:
                t0 = time.perf_counter()
                row = _one(job, n, system, ctx)
                rows.append(row)
                say(f"  {row['model']:<22} x{n:<3} {system:<13} PSS {row['pss_mib_per_process']:7.1f} MiB/process  "
                    f"used {row['system_used_mib']:8.1f} MiB  merge {_fmt(row['merge_seconds'])} s  "
                    f"({time.perf_counter() - t0:.1f} s)")
        _relative(rows)
        idle = _idle_check(ctx, models[0], scale, store_dir)
    finally:
        ctl.stop()
        from ..dedup.shared import clear_store

        clear_store(store_dir)
        for p in (store_dir, work):
            import shutil

            shutil.rmtree(p, ignore_errors=True)
    return {"rows": rows, "idle": idle, "prepare_s": prep, "scale": scale, "upm_published": UPM_PUBLISHED,
            "ksm_default": KSM_DEFAULT, "targets": _targets(rows, idle)}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _targets(rows: list[dict[str, Any]], idle: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the measured value and whether it is met."""
    out: dict[str, Any] = {}
    synth = [r for r in rows if "random bytes" in r["model"] and r["system"] in ("gfaas-merge", "gfaas-remap")]
    for r in synth:
        ok = r["merge_seconds"] is not None and r["merge_seconds"] <= 1.0 and (r["reclaimed_fraction"] or 0) >= 0.85
        out[f"synthetic_{r['system']}"] = {"processes": r["processes"], "merge_seconds": r["merge_seconds"],
                                           "merge_seconds_85": r["merge_seconds_85"],
                                           "reclaimed_fraction": r["reclaimed_fraction"],
                                           "target": "merged within 1 s, >= 85% reclaimed", "met": ok}
    dens = {r["system"]: r["density_vs_none"] for r in rows if r["model"] == "alexnet" and r["processes"] == 16}
    if dens:
        out["alexnet_density_16"] = {"by_system": dens, "target": ">= 2x (UPM 2.2x)",
                                     "met": max(v or 0 for v in dens.values()) >= 2.0}
    out["idle"] = {"ksm_scans": idle["ksm_full_scans_delta"], "pages_scanned": idle["ksm_pages_scanned_delta"],
                   "latency_ratio": idle["latency_ratio"], "target": "zero ksmd activity, no added latency",
                   "met": idle["ksm_pages_scanned_delta"] == 0 and idle["settings_unchanged"]}
    return out


def print_table(res: dict[str, Any]) -> None:
    print(f"{'workload':<22} {'N':>3} {'system':<13} {'PSS MiB':>8} {'used MiB':>9} {'reclaimed':>9} "
          f"{'density':>7} {'merge s':>8} {'call ms':>8}")
    for r in res["rows"]:
        rec = "-" if r["reclaimed_fraction"] is None else f"{r['reclaimed_fraction']:.0%}"
        den = "-" if r["density_vs_none"] is None else f"{r['density_vs_none']:.2f}x"
        print(f"{r['model']:<22} {r['processes']:>3} {r['system']:<13} {r['pss_mib_per_process']:>8.1f} "
              f"{r['system_used_mib']:>9.1f} {rec:>9} {den:>7} {_fmt(r['merge_seconds']):>8} "
              f"{_fmt(r['call_ms']):>8}")
    i = res["idle"]
    print(f"no hint: KSM pages scanned {i['ksm_pages_scanned_delta']}, full scans {i['ksm_full_scans_delta']}, "
          f"settings unchanged {i['settings_unchanged']}; call latency with the idle controller "
          f"{i['latency_ratio']:.2f}x without")
    for name, t in res["targets"].items():
        print(f"target {name}: {'met' if t['met'] else 'NOT met'} ({t['target']})")


def figure(res: dict[str, Any], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = sorted({r["model"] for r in res["rows"] if "random" not in r["model"]})
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=(5.5 * max(len(models), 1), 4), squeeze=False)
    for ax, m in zip(axes[0], models, strict=False):
        for system in SYSTEMS:
            pts = sorted((r["processes"], r["pss_mib_per_process"]) for r in res["rows"]
                         if r["model"] == m and r["system"] == system)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
        pub = res["upm_published"].get(m)
        if isinstance(pub, dict):
            ax.scatter([16, 16], [pub["pss_mib_none"], pub["pss_mib_upm"]], marker="x", color="black",
                       label="UPM published (none, UPM)", zorder=5)
        ax.set_title(f"{m} (scale {res['scale']})")
        ax.set_xlabel("worker processes")
        ax.set_ylabel("PSS per process (MiB)")
        ax.set_xticks(sorted({r["processes"] for r in res["rows"] if r["model"] == m}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(a: Any) -> int:
    """``gfaas bench dedup [--json] [--out FILE] [--figure PNG] [--quick]``."""
    from ..provenance import provenance

    prov = provenance()
    res = run(quick=a.quick)
    res["provenance"] = prov
    if getattr(a, "figure", None):
        figure(res, a.figure)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0
