"""The README's "Your own workflow" runs as written: its command block, line by line, in a copy of
``examples/thumbs`` (a gateway, the package's model, deploy with code, invoke, logs, the list), with the
outputs checked against onnxruntime run directly on the same model and photo; the gateway's address
leads to the dashboard; and the spec shown in the README is the example's."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from gfaas.runtime.spec import loads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from serve_proc import Served, env_with  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LABELS = ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

pytestmark = pytest.mark.timeout(300)


def walkthrough() -> list[str]:
    """The command lines of the README's walk-through block, comments dropped."""
    m = re.search(r"<!-- walkthrough.*?-->\s*```\n(.*?)```", README, re.S)
    assert m, "README.md has no walk-through block (<!-- walkthrough ... --> then a fenced block)"
    return [re.split(r"\s+#", ln, maxsplit=1)[0].strip() for ln in m.group(1).splitlines() if ln.strip()]


def oracle(photo: np.ndarray, model: Path) -> np.ndarray:
    """The classifier's probabilities, computed here without gfaas: mean of 32 x 32 blocks by a loop,
    then onnxruntime on the file, then a softmax."""
    import onnxruntime as ort

    h, w = photo.shape[0] // 32, photo.shape[1] // 32
    small = np.zeros((32, 32, 3), np.float64)
    for i in range(32):
        for j in range(32):
            small[i, j] = photo[i * h:(i + 1) * h, j * w:(j + 1) * w].reshape(-1, 3).mean(axis=0)
    x = (small / 255.0).astype(np.float32).transpose(2, 0, 1)[None]
    logits = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0][0]
    p = np.exp(logits.astype(np.float64) - logits.max())
    return p / p.sum()


def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    lines = walkthrough()
    assert lines[0].startswith("gfaas serve") and any(ln.startswith("gfaas invoke") for ln in lines)
    shutil.copytree(ROOT / "examples" / "thumbs", tmp_path / "examples" / "thumbs",
                    ignore=shutil.ignore_patterns("out", "photo.npy", "models", "__pycache__"))
    env = env_with(GFAAS_RUN_DIR=str(tmp_path / "run"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    cwd = tmp_path
    out: dict[str, str] = {}
    served: Served | None = None
    try:
        for line in lines:
            argv = shlex.split(line)
            if argv[:2] == ["gfaas", "serve"]:  # in the background, on a free port (8080 may be taken here)
                served = Served([*argv[2:], "--port", "0"], env=env, cwd=cwd).__enter__()
                env["GFAAS_URL"] = served.url
                continue
            if argv[0] == "cd":
                cwd = cwd / argv[1]
                continue
            if argv[0] == "python":
                argv[0] = sys.executable
            r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, f"`{line}` failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
            out[" ".join(argv[1:3]) if "gfaas" in argv[0] else "python"] = r.stdout
        assert served is not None
        assert re.match(r"deployed thumbs version 1, code [0-9a-f]{12} \(\d+ files\)$", out["deploy thumbs.yaml"].strip())
        assert re.match(r"thumbs: done in [\d.]+ ms", out["invoke thumbs"])
        saved = cwd / "out" / "invoke" / "thumbs"
        probs = np.load(saved / "probs.npy")
        label = int(np.load(saved / "label.npy"))
        expect = oracle(np.load(cwd / "photo.npy"), cwd / "package" / "models" / "classifier.onnx")
        np.testing.assert_allclose(probs, expect, rtol=1e-4, atol=1e-6)
        assert label == int(expect.argmax())
        assert f"label        int64    []               -> out/invoke/thumbs/label.npy = {label}" in out["invoke thumbs"]
        inv = re.search(r"invocation ([0-9a-f]{32})", out["invoke thumbs"]).group(1)  # type: ignore[union-attr]
        logs = out["logs thumbs"].splitlines()
        assert any(ln.endswith(f"resize {inv} stdout: resized 320x240 to 32x32") for ln in logs), logs
        assert any(ln.endswith(f"classify {inv} stdout: class {label} ({LABELS[label]}) with p={expect[label]:.3f}")
                   for ln in logs), logs
        assert out["workflows list"].startswith("thumbs       v1   2 functions, inputs image")
        # The gateway's address in a browser: a redirect to the dashboard, served to this user on loopback.
        root = httpx.get(served.url + "/", follow_redirects=False, timeout=30)
        assert root.status_code == 307 and root.headers["location"] == "/dashboard"
        page = httpx.get(served.url + "/", follow_redirects=True, timeout=30)
        assert page.status_code == 200 and "gfaas dashboard" in page.text
    finally:
        if served is not None:
            served.__exit__()


def test_the_readme_shows_the_examples_spec() -> None:
    """The spec in the README is thumbs.yaml (parsed, description aside)."""
    m = re.search(r"```yaml\n(name: thumbs\n.*?)```", README, re.S)
    assert m, "README.md shows no thumbs spec"
    shown = loads(m.group(1), check_handlers=False).describe()
    real = loads((ROOT / "examples" / "thumbs" / "thumbs.yaml").read_text(), check_handlers=False).describe()
    shown.pop("description")
    real.pop("description")
    assert shown == real
