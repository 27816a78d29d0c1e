"""What a sandboxed CUDA function keeps of the descriptors its root phase opened: the GPU driver's.

The first H200 run found every GPU workflow failing under the uid sandbox with 'unspecified launch
failure': the root phase's close (``worker._close_others``) shut the descriptors the model load's
CUDA initialisation had opened (/dev/nvidia*, the pipes and event descriptors of CUDA's threads).
``worker.driver_descriptors`` names the ones to keep; files still go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfaas.runtime import worker


@pytest.mark.parametrize(("target", "kept"), [
    ("/dev/nvidiactl", True), ("/dev/nvidia0", True), ("/dev/nvidia-uvm", True),
    ("pipe:[4242]", True), ("anon_inode:[eventfd]", True),
    ("/root/.cache/gfaas/models/fcn.onnx", False), ("socket:[77]", False), ("/dev/null", False),
    ("/dev/nvme0n1", False),
])
def test_only_the_drivers_kinds_of_descriptor_are_kept(target: str, kept: bool) -> None:
    assert worker.driver_target(target) is kept


def test_the_descriptors_a_load_opened_are_kept_only_if_the_driver_may_own_them(tmp_path: Path) -> None:
    before = set(worker.own_descriptors())
    earlier_r, earlier_w = os.pipe()  # opened before the snapshot below: the close decides those
    before2 = set(worker.own_descriptors())
    r, w = os.pipe()
    ev = os.eventfd(0)
    model = os.open(tmp_path / "model.onnx", os.O_CREAT | os.O_RDONLY)  # what the load read, as root
    try:
        got = worker.driver_descriptors(before2)
        assert got == {r, w, ev}
        assert earlier_r not in got and model not in got
        assert worker.driver_descriptors(before) == {earlier_r, earlier_w, r, w, ev}
    finally:
        for fd in (earlier_r, earlier_w, r, w, ev, model):
            os.close(fd)


def test_the_close_spares_what_it_is_told_to_keep(tmp_path: Path) -> None:
    """``_close_others`` with the driver's descriptors in ``keep``, as the sandbox calls it: a pipe the
    'driver' opened survives, the model file does not. Run in a child: it closes the process's
    descriptors."""
    r0, w0 = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            before = set(worker.own_descriptors())
            r, w = os.pipe()
            model = os.open(tmp_path / "model.onnx", os.O_CREAT | os.O_RDONLY)
            worker._close_others({w0} | worker.driver_descriptors(before))
            alive = {fd for fd in (r, w, model) if _is_open(fd)}
            code = 0 if alive == {r, w} and _is_open(w0) and not _is_open(r0) else 3
        finally:
            os._exit(code)
    os.close(w0)
    _, status = os.waitpid(pid, 0)
    os.close(r0)
    assert os.waitstatus_to_exitcode(status) == 0


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
