"""Workflows that bring their own code (issue 22, item 3): packages deployed with the spec, imported
by the workers from their version alone (after the sandbox closes, as root), versions that replace each
other without losing an invocation, rollback, and refusals that leave the current version as it was."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gfaas.errors import CodePackageError, NotFound
from gfaas.runtime.codepkg import pack_dir
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

SPEC = """
name: {name}
inputs: {{x: {{dtype: float64, shape: [-1]}}}}
outputs: {{y: f.y, uid: f.uid}}
functions:
  - {{name: f, kind: cpu, handler: "{handler}", params: {{sleep: {sleep}}}, inputs: {{x: input.x}},
     outputs: {{y: null, uid: {{shape: []}}}}}}
"""

HANDLER = """
import os
import time

VERSION = {version}
IMPORTED_AS = os.getuid()  # who ran this module's code: the tenant, never root


def run(ctx, inputs):
    x = ctx.get(inputs["x"])
    time.sleep(float(ctx.params.get("sleep", 0)))
    return {{"y": x * 0 + VERSION, "uid": IMPORTED_AS}}
"""


def package(tmp: Path, version: int, module: str = "mymod") -> bytes:
    d = tmp / f"pkg-{module}-{version}"
    (d / module).mkdir(parents=True, exist_ok=True)
    (d / module / "__init__.py").write_text("")
    (d / module / "handlers.py").write_text(HANDLER.format(version=version))
    return pack_dir(d)


def spec(name: str, sleep: float = 0.0, handler: str = "mymod.handlers:run") -> str:
    return SPEC.format(name=name, handler=handler, sleep=sleep)


@pytest.fixture
def rt() -> Iterator[LocalRuntime]:
    with LocalRuntime(RuntimeConfig(queue_hints=False, drain_timeout_s=30)) as r:
        yield r


def _y(rt: LocalRuntime, name: str) -> float:
    res = rt.invoke(name, {"x": np.zeros(2)}, timeout=60)
    assert res.ok, res.error
    return float(res.outputs["y"][0])


def test_a_package_deploys_and_two_workflows_keep_their_own_module(rt: LocalRuntime, tmp_path: Path) -> None:
    rt.deploy(spec("one"), code=package(tmp_path, 1))
    rt.deploy(spec("seven"), code=package(tmp_path, 7))  # the same module name, other code
    assert (_y(rt, "one"), _y(rt, "seven")) == (1.0, 7.0)
    [v] = rt.versions("one")
    assert v["version"] == 1 and v["current"] and v["code"]["files"] == 2
    if os.geteuid() == 0:  # the sandbox is on: the package's code never ran as root
        res = rt.invoke("one", {"x": np.zeros(1)}, timeout=60)
        assert int(res.outputs["uid"]) == rt.tenant_identity("one").uid != 0  # type: ignore[union-attr]
        assert rt.deployments.code is not None
        for name in ("one", "seven"):  # each tenant's packages: its group only, nothing for the others
            st = (rt.deployments.code.root / name).stat()
            assert st.st_gid == rt.tenant_identity(name).gid and st.st_mode & 0o007 == 0  # type: ignore[union-attr]


def test_an_update_under_load_loses_nothing_and_old_invocations_finish_on_their_version(
        rt: LocalRuntime, tmp_path: Path) -> None:
    rt.deploy(spec("live", sleep=0.2), code=package(tmp_path, 1))
    before = [rt.submit("live", {"x": np.zeros(1)}) for _ in range(5)]  # one worker: they queue
    rt.deploy(spec("live", sleep=0.2), code=package(tmp_path, 2))
    after = [rt.submit("live", {"x": np.zeros(1)}) for _ in range(3)]
    got_before = [rt.result(i, timeout=60) for i in before]
    got_after = [rt.result(i, timeout=60) for i in after]
    assert all(r.ok for r in got_before + got_after), [r.error for r in got_before + got_after if not r.ok]
    assert [float(r.outputs["y"][0]) for r in got_before] == [1.0] * 5
    assert [float(r.outputs["y"][0]) for r in got_after] == [2.0] * 3
    assert [(v["version"], v["current"]) for v in rt.versions("live")] == [(1, False), (2, True)]
    deadline = time.monotonic() + 10
    while any(k.startswith("live/") for k in rt.queue_depths()) and time.monotonic() < deadline:
        time.sleep(0.05)  # version 1's workers stop once its invocations are done
    assert sorted(rt.queue_depths()) == ["live@2/f"]


def test_rollback_makes_an_old_version_current_as_a_new_one(rt: LocalRuntime, tmp_path: Path) -> None:
    rt.deploy(spec("rb"), code=package(tmp_path, 1))
    rt.deploy(spec("rb"), code=package(tmp_path, 2))
    assert _y(rt, "rb") == 2.0
    assert rt.rollback("rb", 1) == 3
    assert _y(rt, "rb") == 1.0
    v = rt.versions("rb")
    assert [(x["version"], x["note"]) for x in v] == [(1, ""), (2, ""), (3, "rollback to 1")]
    assert v[0]["code"]["digest"] == v[2]["code"]["digest"]
    assert rt.deploy(spec("rb"), code=package(tmp_path, 1)) == "rb"  # the current content again: no version
    assert len(rt.versions("rb")) == 3
    with pytest.raises(NotFound, match="has no version 9"):
        rt.rollback("rb", 9)


def test_refused_packages_leave_the_current_version_as_it_was(rt: LocalRuntime, tmp_path: Path) -> None:
    rt.deploy(spec("keep"), code=package(tmp_path, 1))
    with pytest.raises(CodePackageError, match="not a readable tar archive"):
        rt.deploy(spec("keep"), code=b"this is not an archive")
    with pytest.raises(CodePackageError, match=r"names module 'othermod.handlers', which the code package does not "
                                               r"hold \(its top-level modules: \['mymod'\]\)"):
        rt.deploy(spec("keep", handler="othermod.handlers:run"), code=package(tmp_path, 2))
    with pytest.raises(CodePackageError, match=r"could not start.*has no handler 'nothere'.*inside the package"):
        rt.deploy(spec("fresh", handler="mymod.handlers:nothere"), code=package(tmp_path, 3))
    assert rt.workflows() == ["keep"] and [v["version"] for v in rt.versions("keep")] == [1]
    assert _y(rt, "keep") == 1.0


def test_undeploy_removes_every_version_and_its_code(rt: LocalRuntime, tmp_path: Path) -> None:
    rt.deploy(spec("gone"), code=package(tmp_path, 1))
    rt.deploy(spec("gone"), code=package(tmp_path, 2))
    store = rt.deployments.code
    assert store is not None and (store.root / "gone").is_dir()
    rt.undeploy("gone")
    assert not (store.root / "gone").exists() and rt.workflows() == []
    with pytest.raises(NotFound):
        rt.versions("gone")


MODEL_SPEC = """
name: {name}
inputs: {{x: {{dtype: float32, shape: [-1, 32]}}}}
outputs: {{p: f.p}}
functions:
  - {{name: f, kind: cpu, handler: "scorer:predict", model: {{file: {path}}}, inputs: {{x: input.x}},
     outputs: {{p: {{dtype: float32}}}}}}
"""

SCORER = """
import numpy as np


def predict(ctx, inputs):
    x = np.ascontiguousarray(ctx.get(inputs["x"]))
    return {"p": ctx.model(**{next(iter(ctx.model.info.inputs)): x})[ctx.model.output_names[0]]}
"""


def model_package(tmp: Path, onnx_bytes: bytes, path: str = "models/net.onnx") -> bytes:
    d = tmp / "modelpkg"
    (d / "models").mkdir(parents=True, exist_ok=True)
    (d / "scorer.py").write_text(SCORER)
    (d / path).parent.mkdir(parents=True, exist_ok=True)
    (d / path).write_bytes(onnx_bytes)
    return pack_dir(d)


def test_a_model_file_from_the_package_matches_onnxruntime_on_the_same_file(rt: LocalRuntime, tmp_path: Path) -> None:
    import onnxruntime as ort

    from gfaas import models

    data = models.path("logreg").read_bytes()  # any ONNX file of the user's: the zoo's logistic regression here
    rt.deploy(MODEL_SPEC.format(name="mine", path="models/net.onnx"), code=model_package(tmp_path, data))
    x = np.random.default_rng(1).standard_normal((5, 32), dtype=np.float32)
    res = rt.invoke("mine", {"x": x}, timeout=60)
    assert res.ok, res.error
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(res.outputs["p"], want, rtol=1e-6, atol=1e-7)
    assert rt.describe("mine")["functions"][0]["model"] == {"file": "models/net.onnx"}


def test_model_files_are_checked_at_deploy(rt: LocalRuntime, tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    from gfaas import models

    good = models.path("logreg").read_bytes()
    with pytest.raises(CodePackageError, match="'models/other.onnx' is not in the code package"):
        rt.deploy(MODEL_SPEC.format(name="m1", path="models/other.onnx"), code=model_package(tmp_path, good))
    with pytest.raises(CodePackageError, match="is not a valid ONNX model"):
        rt.deploy(MODEL_SPEC.format(name="m2", path="models/net.onnx"), code=model_package(tmp_path, b"\x08garbage"))
    g = helper.make_graph([helper.make_node("Identity", ["img"], ["out"])], "g",
                          [helper.make_tensor_value_info("img", TensorProto.UINT8, [1, 4])],
                          [helper.make_tensor_value_info("out", TensorProto.UINT8, [1, 4])])
    u8 = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(CodePackageError, match="input 'img' is uint8; gfaas feeds models float32 or int64"):
        rt.deploy(MODEL_SPEC.format(name="m3", path="models/net.onnx"), code=model_package(tmp_path, u8))
    with pytest.raises(CodePackageError, match="comes in the workflow's code package"):
        rt.deploy(MODEL_SPEC.format(name="m4", path="models/net.onnx").replace("scorer:predict",
                                                                               "gfaas.workflows.image:classify"))
    assert rt.workflows() == []


CHAIN = """
name: {name}
inputs: {{x: {{dtype: float64, shape: [-1]}}}}
outputs: {{y: g.y, uid_f: f.uid, uid_g: g.uid}}
functions:
  - {{name: f, kind: cpu, handler: "mymod.handlers:run", inputs: {{x: input.x}},
     outputs: {{y: null, uid: {{shape: []}}}}}}
  - {{name: g, kind: cpu, handler: "mymod.handlers:run", inputs: {{x: f.y}},
     outputs: {{y: null, uid: {{shape: []}}}}}}
"""


def test_a_chain_from_a_package_runs_in_one_worker_with_the_tenants_rights(rt: LocalRuntime, tmp_path: Path) -> None:
    """g follows f in f's worker (gfaas.policy.fusion): its handler comes from the package too, imported
    after the sandbox closed, as f's was (as root: the tenant's uid, never 0)."""
    rt.deploy(CHAIN.format(name="chained"), code=package(tmp_path, 3))
    res = rt.invoke("chained", {"x": np.zeros(2)}, timeout=60)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["y"], np.full(2, 3.0))
    workers = {r.function: r.worker for r in res.functions}
    assert workers["f"] == workers["g"], workers
    uids = {float(res.outputs["uid_f"]), float(res.outputs["uid_g"])}
    assert len(uids) == 1, uids
    if os.geteuid() == 0:  # the sandbox drops to the workflow's uid before the package is imported
        assert uids != {0.0}
