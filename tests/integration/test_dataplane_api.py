"""The data-plane API against a real daemon process: put/get/allocate/delete and access control."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import gfaas
from gfaas import (
    AccessDenied,
    AuthenticationError,
    ConfigError,
    DaemonUnavailable,
    DataDeleted,
    DataRef,
    InvalidDataRef,
    ObjectStateError,
)
from gfaas.config import KiB, MiB

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DENIED = "access denied: no object with this ID is readable by this function of this invocation"
SLAB = 1 * MiB  # conftest default: objects up to 256 KiB share slabs
SMALL_MAX = SLAB // 4


def run_py(code: str, env: dict[str, str], timeout: float = 30) -> str:
    """Run ``code`` in a fresh Python process with ``env`` added; return its stdout (fail on error)."""
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


# ---- put / get ------------------------------------------------------------------------------
ARRAYS: list[tuple[str, Any]] = [
    ("bool", lambda: np.array([True, False, True])),
    ("int8", lambda: np.arange(-5, 5, dtype=np.int8)),
    ("uint8-3d", lambda: np.arange(60, dtype=np.uint8).reshape(3, 4, 5)),
    ("int16", lambda: np.arange(7, dtype=np.int16) * -300),
    ("uint16", lambda: np.arange(7, dtype=np.uint16)),
    ("int32", lambda: np.arange(12, dtype=np.int32).reshape(3, 4)),
    ("uint32", lambda: np.array([2**32 - 1, 0], dtype=np.uint32)),
    ("int64", lambda: np.array([-(2**63), 2**63 - 1], dtype=np.int64)),
    ("uint64", lambda: np.array([2**64 - 1], dtype=np.uint64)),
    ("float16", lambda: np.linspace(0, 1, 9, dtype=np.float16)),
    ("float32-4d", lambda: np.random.default_rng(0).random((2, 3, 4, 5), dtype=np.float32)),
    ("float64", lambda: np.array([np.pi, -np.inf, np.nan, 0.0])),
    ("complex64", lambda: np.array([1 + 2j, -3j], dtype=np.complex64)),
    ("complex128", lambda: np.array([[1 + 2j], [3 - 4j]])),
    ("big-endian", lambda: np.arange(5, dtype=">f4")),
    ("scalar-0d", lambda: np.array(3.5)),
    ("numpy-scalar", lambda: np.float32(2.5)),
    ("empty-1d", lambda: np.zeros(0, np.float32)),
    ("empty-3d", lambda: np.zeros((3, 0, 2), np.int64)),
    ("non-contiguous", lambda: np.arange(100, dtype=np.int32).reshape(10, 10)[::2, 1::3]),
    ("fortran-order", lambda: np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))),
    ("exactly-small-max", lambda: np.full(SMALL_MAX // 8, 7.0)),
    ("small-max-plus-8", lambda: np.full(SMALL_MAX // 8 + 1, 8.0)),
    ("larger-than-a-slab", lambda: np.arange(3 * MiB // 4, dtype=np.float32)),
]


@pytest.mark.parametrize("make", [a[1] for a in ARRAYS], ids=[a[0] for a in ARRAYS])
def test_put_get_round_trip(shared_node, make) -> None:  # type: ignore[no-untyped-def]
    """put then get (view and copy, by another function) returns equal dtype, shape and values."""
    arr = make()
    f, g = shared_node.connect("f"), shared_node.connect("g")
    ref = f.put(arr)
    view = g.get(ref)
    assert view.dtype == arr.dtype and view.shape == arr.shape
    np.testing.assert_array_equal(view, arr)
    assert not view.flags.writeable
    copy = g.get(str(ref), copy=True)
    assert copy.dtype == arr.dtype and copy.shape == arr.shape and copy.flags.writeable
    np.testing.assert_array_equal(copy, arr)
    f.delete(ref)


def test_bytes_like_objects(shared_node) -> None:  # type: ignore[no-untyped-def]
    """bytes, bytearray and memoryview put as raw objects: get gives a read-only memoryview, copy gives bytes."""
    f, g = shared_node.connect("f"), shared_node.connect("g")
    payloads = [b"hello", bytearray(b"\x00\xff" * 1000), memoryview(b"abcdef")[1:4], b"",
                os.urandom(SMALL_MAX + 1), memoryview(np.arange(6, dtype=np.int32))]
    for p in payloads:
        ref = f.put(p)
        want = bytes(p)
        view = g.get(ref)
        assert isinstance(view, memoryview) and view.readonly and bytes(view) == want
        copy = g.get(ref, copy=True)
        assert type(copy) is bytes and copy == want


def test_non_contiguous_memoryview_is_refused(shared_node) -> None:  # type: ignore[no-untyped-def]
    """A strided memoryview cannot be put (ConfigError says how to fix it)."""
    f = shared_node.connect("f")
    with pytest.raises(ConfigError, match="non-contiguous memoryview"):
        f.put(memoryview(b"abcdefgh")[::2])


@pytest.mark.parametrize(
    ("obj", "named"),
    [([1, 2, 3], "list"), ("text", "str"), (np.array([object()]), "dtype object"),
     (np.zeros(2, dtype=[("a", "<i4")]), "dtype"), (np.array(["x"]), "'<U1'")],
)
def test_unsupported_objects_are_refused(shared_node, obj, named) -> None:  # type: ignore[no-untyped-def]
    """Objects that are not numeric arrays, bytes-like or DLPack tensors are refused naming what they are."""
    f = shared_node.connect("f")
    with pytest.raises((ConfigError, gfaas.ProtocolError), match=named):
        f.put(obj)


def test_zero_copy_views_are_read_only(shared_node) -> None:  # type: ignore[no-untyped-def]
    """Writing into a zero-copy view raises; making it writable is refused by numpy (read-only mapping)."""
    f, g = shared_node.connect("f"), shared_node.connect("g")
    for arr in (np.arange(10.0), np.arange(SLAB, dtype=np.uint8)):  # in a slab, and a segment of its own
        ref = f.put(arr)
        for reader in (f, g):
            view = reader.get(ref)
            with pytest.raises(ValueError, match="read-only"):
                view[0] = 42
            with pytest.raises(ValueError):
                view.setflags(write=True)
            assert view[0] == arr[0]
    raw = g.get(f.put(b"abc"))
    with pytest.raises(TypeError):
        raw[0] = 1  # type: ignore[index]


def test_copy_is_writable_and_private(shared_node) -> None:  # type: ignore[no-untyped-def]
    """copy=True gives a writable array; changing it does not change the stored object."""
    f, g = shared_node.connect("f"), shared_node.connect("g")
    ref = f.put(np.arange(5))
    c = g.get(ref, copy=True)
    c[:] = -1
    np.testing.assert_array_equal(g.get(ref), np.arange(5))


def test_allocate_and_seal(shared_node) -> None:  # type: ignore[no-untyped-def]
    """allocate gives a writable buffer; seal publishes it, freezes the buffer, and a second seal fails."""
    f, g = shared_node.connect("f"), shared_node.connect("g")
    for shape, dtype in (((256, 1024), np.float32), (100, np.uint8), ((0,), np.int16), ((4, 4), np.complex128)):
        buf = f.allocate(shape, dtype, consumers=["g"])
        assert buf.array.flags.writeable and not buf.sealed
        assert buf.array.shape == ((shape,) if isinstance(shape, int) else shape)
        assert buf.array.dtype == np.dtype(dtype)
        buf.array[...] = np.arange(buf.array.size).reshape(buf.array.shape)
        ref = buf.seal()
        assert isinstance(ref, DataRef) and buf.sealed
        with pytest.raises(ValueError, match="read-only"):
            buf.array[...] = 0
        with pytest.raises(ObjectStateError, match="already sealed"):
            buf.seal()
        got = g.get(ref)
        np.testing.assert_array_equal(got, np.arange(got.size).reshape(got.shape).astype(dtype))
        with pytest.raises(DataDeleted):
            g.get(ref)


def test_allocate_default_dtype_is_uint8(shared_node) -> None:  # type: ignore[no-untyped-def]
    """allocate(n) is n bytes of uint8."""
    buf = shared_node.connect("f").allocate(10)
    assert buf.array.dtype == np.uint8 and buf.array.shape == (10,)


def test_unsealed_object_is_not_readable_yet(shared_node) -> None:  # type: ignore[no-untyped-def]
    """A consumer reading an allocated but unsealed object gets ObjectStateError, then the value after seal."""
    f, g = shared_node.connect("f"), shared_node.connect("g")
    buf = f.allocate(1000, np.uint8, consumers=["g"])
    ref = DataRef(buf._id, f.node_id)
    with pytest.raises(ObjectStateError, match="still being written"):
        g.get(ref)
    buf.array[:] = 9
    assert buf.seal() == ref
    assert int(g.get(ref).sum()) == 9000


def test_objects_are_freed_after_all_consumers_read(node) -> None:  # type: ignore[no-untyped-def]
    """With consumers [g, h], the object lives until both read it; then every get raises DataDeleted."""
    f, g, h = node.connect("f"), node.connect("g"), node.connect("h")
    for arr in (np.arange(10), np.zeros(SLAB // 8 + 10)):
        ref = f.put(arr, consumers=["g", "h"])
        g.get(ref)
        g.get(ref)
        f.get(ref)  # the producer is not a consumer
        assert node.stats()["objects"] == 1
        h.get(ref, copy=True)
        assert node.stats()["objects"] == 0
        for c in (f, g, h):
            with pytest.raises(DataDeleted, match="read by all of its consumers"):
                c.get(ref)
        with pytest.raises(DataDeleted):
            f.delete(ref)


def test_views_survive_the_object_being_freed(node) -> None:  # type: ignore[no-untyped-def]
    """A view taken before the object is freed keeps its bytes while new objects are stored."""
    f, g = node.connect("f"), node.connect("g")
    small = np.arange(100, dtype=np.int64)
    big = np.arange(SLAB // 4, dtype=np.int64)  # 2 MiB: a segment of its own
    v_small = g.get(f.put(small, consumers=["g"]))
    v_big = g.get(f.put(big, consumers=["g"]))
    assert node.stats()["objects"] == 0
    for i in range(20):
        f.put(np.full_like(small, -i))
        f.put(np.full_like(big, -i))
        buf = f.allocate(big.shape, big.dtype)
        buf.array[:] = -1000 - i
        buf.seal()
    np.testing.assert_array_equal(v_small, small)
    np.testing.assert_array_equal(v_big, big)


def test_no_consumers_means_until_delete_or_end(node) -> None:  # type: ignore[no-untyped-def]
    """consumers=None: any number of reads by any function; gone only on delete or end_invocation."""
    f, g, h = node.connect("f"), node.connect("g"), node.connect("h")
    a = f.put(np.arange(3))
    b = f.put(np.arange(SLAB, dtype=np.uint8))
    for _ in range(3):
        for c in (f, g, h):
            c.get(a)
            c.get(b)
    assert node.stats()["objects"] == 2
    f.delete(a)
    with pytest.raises(DataDeleted, match="deleted by its producer"):
        g.get(a)
    g.get(b)
    assert node.admin.end_invocation(node.inv) == 1
    st = node.stats()
    # Only the warm segment kept for the workflow's next invocation remains.
    assert (st["objects"], st["writing"], st["segments"], st["bytes_reserved"]) == \
        (0, 0, st["segments_pooled"], st["bytes_pooled"])


def test_delete_by_non_producer_is_denied(node) -> None:  # type: ignore[no-untyped-def]
    """Only the producer may delete: a consumer gets AccessDenied naming the producer; the object stays."""
    f, g = node.connect("f"), node.connect("g")
    ref = f.put(np.arange(3))
    with pytest.raises(AccessDenied, match="only the producer 'f' may delete"):
        g.delete(ref)
    np.testing.assert_array_equal(g.get(ref), np.arange(3))
    f2 = node.connect("f")  # another process of the producer function may delete it
    f2.delete(str(ref))
    with pytest.raises(DataDeleted):
        g.get(ref)


def test_refs_pass_between_processes_as_strings(node) -> None:  # type: ignore[no-untyped-def]
    """str(ref) from one process is readable by a function in another process, both ways, right after put."""
    f = node.connect("f")
    ref = f.put(np.arange(1000, dtype=np.int32), consumers=["g"])
    code_get = (
        "import sys, gfaas, numpy as np\n"
        "c = gfaas.connect()\n"
        "a = c.get(sys.argv[1] if len(sys.argv) > 1 else %r)\n"
        "print(a.dtype.str, a.shape, int(a.sum()))\n"
    )
    out = run_py(code_get % str(ref), node.credentials("g").to_env())
    assert out == f"<i4 (1000,) {sum(range(1000))}"
    assert node.stats()["objects"] == 0
    # The other way: a process puts (asynchronously sealed) and exits; the ref is valid at once.
    code_put = (
        "import gfaas, numpy as np\n"
        "c = gfaas.connect()\n"
        "print(c.put(np.arange(10, dtype=np.float64) * 2, consumers=['f']))\n"
        "print(c.put(b'x' * 300000, consumers=['f']))\n"
    )
    small, big = run_py(code_put, node.credentials("g").to_env()).split()
    np.testing.assert_array_equal(f.get(small), np.arange(10) * 2.0)
    assert bytes(f.get(big)) == b"x" * 300000
    assert DataRef.parse(small).node == "n0"


def test_connect_from_environment(node, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """connect() without arguments reads GFAAS_SOCKET and GFAAS_TOKEN; without a token it refuses."""
    for k, v in node.credentials("h").to_env().items():
        monkeypatch.setenv(k, v)
    c = gfaas.connect()
    assert (c.function, c.invocation_id, c.node_id) == ("h", node.inv.id, "n0")
    assert c.functions == ("f", "g", "h")
    c.close()
    monkeypatch.delenv("GFAAS_TOKEN")
    with pytest.raises(AuthenticationError, match="no function credentials"):
        gfaas.connect()


def test_closed_client_and_missing_daemon(node, run_dir) -> None:  # type: ignore[no-untyped-def]
    """Calls on a closed client, and connecting to a socket with no daemon, raise DaemonUnavailable."""
    c = node.connect("f")
    ref = c.put(b"x")
    c.close()
    with pytest.raises(DaemonUnavailable, match="closed"):
        c.get(ref)
    with pytest.raises(DaemonUnavailable, match="no node daemon at"):
        gfaas.connect(socket_path=os.path.join(run_dir, "nothing.sock"), token="0" * 32)


def test_unknown_consumers_and_bad_refs_are_refused(node) -> None:  # type: ignore[no-untyped-def]
    """put with consumers outside the invocation is a ConfigError; a malformed ref string InvalidDataRef."""
    f = node.connect("f")
    with pytest.raises(ConfigError, match=r"consumers \['zz'\] are not functions"):
        f.put(b"x", consumers=["g", "zz"])
    with pytest.raises(ConfigError, match=r"consumers \['zz'\]"):
        f.allocate(4, consumers=["zz"])
    with pytest.raises(InvalidDataRef, match="'gfaas://n0/xyz'"):
        f.get("gfaas://n0/xyz")
    assert node.stats()["objects"] == 0


def test_torch_tensors_via_dlpack(node) -> None:  # type: ignore[no-untyped-def]
    """A torch CPU tensor is stored through DLPack and read back equal."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gfaas[torch]')")
    f, g = node.connect("f"), node.connect("g")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    got = g.get(f.put(t))
    np.testing.assert_array_equal(got, t.numpy())
    assert torch.from_dlpack(got.copy()).shape == (3, 4)


@pytest.mark.gpu
def test_cupy_arrays_via_dlpack(node) -> None:  # type: ignore[no-untyped-def]
    """A CuPy device array is staged to host and read back equal."""
    cp = pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'gfaas[gpu]')")
    f, g = node.connect("f"), node.connect("g")
    a = cp.arange(1000, dtype=cp.float32)
    np.testing.assert_array_equal(g.get(f.put(a)), cp.asnumpy(a))


# ---- access control -------------------------------------------------------------------------
def test_function_of_another_invocation_is_denied_like_a_random_id(node) -> None:  # type: ignore[no-untyped-def]
    """An existing object of another invocation and a random ID give AccessDenied with the same message."""
    other = node.open()
    f_other = node.connect("f", other)
    f, g = node.connect("f"), node.connect("g")
    ref = f.put(np.arange(3))  # readable by every function of node.inv
    big = f.put(np.zeros(SLAB))
    random_ref = DataRef(os.urandom(16), "n0")
    messages = []
    for r in (ref, big, random_ref):
        for call in (f_other.get, f_other.delete):
            with pytest.raises(AccessDenied) as ei:
                call(r)
            messages.append(str(ei.value))
    assert messages == [DENIED] * 6
    g.get(ref)  # still there for its own invocation
    assert node.stats()["objects"] == 2


def test_function_not_in_consumers_is_denied(node) -> None:  # type: ignore[no-untyped-def]
    """A function of the same invocation that is not a declared consumer gets the generic denial."""
    f, g, h = node.connect("f"), node.connect("g"), node.connect("h")
    ref = f.put(np.arange(3), consumers=["g"])
    with pytest.raises(AccessDenied) as ei:
        h.get(ref)
    assert str(ei.value) == DENIED
    with pytest.raises(AccessDenied) as ei:
        h.delete(ref)
    assert str(ei.value) == DENIED
    g.get(ref)


def test_forged_ids_are_denied(node) -> None:  # type: ignore[no-untyped-def]
    """1000 random IDs are all denied with the same message, and none is found."""
    f = node.connect("f")
    f.put(b"something")
    for _ in range(1000):
        with pytest.raises(AccessDenied) as ei:
            f.get(DataRef(os.urandom(16), "n0"))
        assert str(ei.value) == DENIED


@pytest.mark.parametrize("token", ["0" * 32, "f" * 32, "not-hex", "", "x" * 5000])
def test_bad_tokens_are_refused(node, token) -> None:  # type: ignore[no-untyped-def]
    """Unknown or malformed function tokens fail connect() with AuthenticationError."""
    with pytest.raises(AuthenticationError):
        gfaas.connect(socket_path=node.config.socket_path, token=token or "?")


def test_admin_token_is_required(node) -> None:  # type: ignore[no-untyped-def]
    """A wrong admin token, or a function token used as one, is refused; no admin token file is an error too."""
    for tok in ("0" * 32, node.inv.tokens["f"]):
        with pytest.raises(AuthenticationError, match="wrong admin token"):
            gfaas.Admin(node.config.socket_path, admin_token=tok)
    with pytest.raises(AuthenticationError, match="no admin token at"):
        gfaas.Admin(node.config.socket_path, state_dir=os.path.join(node.config.state_dir, "nope"))
    with open(os.path.join(node.config.state_dir, "admin.token")) as fh:
        admin_token = fh.read().strip()
    with pytest.raises(AuthenticationError):
        gfaas.connect(socket_path=node.config.socket_path, token=admin_token)


def test_ended_invocation_credentials_are_revoked(node) -> None:  # type: ignore[no-untyped-def]
    """After end_invocation, new connections and calls on old ones raise AuthenticationError."""
    f = node.connect("f")
    ref = f.put(np.arange(3))
    node.admin.end_invocation(node.inv)
    with pytest.raises(AuthenticationError, match="has ended"):
        f.get(ref)
    with pytest.raises(AuthenticationError, match="has ended"):
        f.put(np.zeros(SLAB))  # a large put allocates
    with pytest.raises(AuthenticationError, match="has ended"):
        f.allocate(10)
    for fn in ("f", "g"):
        with pytest.raises(AuthenticationError, match="unknown or revoked"):
            gfaas.connect(node.credentials(fn))
    with pytest.raises(AuthenticationError, match="is not open on this node"):
        node.admin.end_invocation(node.inv)
    st = node.stats()
    assert (st["objects"], st["invocations"], st["bytes_reserved"]) == (0, 0, 0)


def test_invocation_handle_credentials(node) -> None:  # type: ignore[no-untyped-def]
    """credentials() of an unknown function is a ConfigError listing the functions."""
    with pytest.raises(ConfigError, match=r"'zz' is not a function of this invocation.*\['f', 'g', 'h'\]"):
        node.inv.credentials("zz")
    c = node.inv.credentials("g")
    assert (c.socket_path, c.invocation_id, c.function) == (node.config.socket_path, node.inv.id, "g")


def test_multi_node_style_open_with_explicit_tokens(node) -> None:  # type: ignore[no-untyped-def]
    """open_invocation with an explicit ID and tokens registers exactly those; a second open of the ID fails."""
    inv_id, toks = "ab" * 16, {"x": "01" * 16, "y": "02" * 16}
    h = node.admin.open_invocation("wf2", ["x", "y"], invocation_id=inv_id, tokens=toks)
    assert h.id == inv_id and h.tokens == toks
    c = gfaas.connect(socket_path=node.config.socket_path, token="02" * 16)
    assert (c.invocation_id, c.function) == (inv_id, "y")
    c.close()
    with pytest.raises(ConfigError, match="already open"):
        node.admin.open_invocation("wf2", ["x", "y"], invocation_id=inv_id)


def test_released_views_do_not_leak(node) -> None:  # type: ignore[no-untyped-def]
    """Dropping views lets the daemon retire segments: after end_invocation nothing is reserved."""
    f, g = node.connect("f"), node.connect("g")
    views = [g.get(f.put(np.full(SLAB // 8, i, np.float64), consumers=["g"])) for i in range(5)]
    del views
    gc.collect()
    g.put(b"x")  # any request carries the releases
    node.admin.end_invocation(node.inv)
    st = node.stats()
    assert (st["objects"], st["segments"], st["bytes_reserved"]) == (0, st["segments_pooled"], st["bytes_pooled"])


def test_node_stats_shape(node) -> None:  # type: ignore[no-untyped-def]
    """Admin.stats reports the node's counters; capacity is the configured one."""
    f = node.connect("f")
    f.put(np.arange(4, dtype=np.int64))
    st = node.stats()
    assert st["node_id"] == "n0" and st["capacity_bytes"] == 256 * MiB
    assert st["objects"] == 1 and st["bytes_live"] == 32 and st["connections"] == 1
    assert st["bytes_reserved"] == SLAB and st["segments"] == 1 and st["invocations"] == 1
    assert st["bytes_reserved"] >= 64 * KiB


def test_socket_and_state_are_private(node) -> None:  # type: ignore[no-untyped-def]
    """The socket and the admin token are mode 0600 and the state directory 0700 (only the owner connects)."""
    import stat

    assert stat.S_IMODE(os.stat(node.config.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(node.config.state_dir).st_mode) == 0o700
    for name in ("admin.token", "invocations.journal"):
        assert stat.S_IMODE(os.stat(os.path.join(node.config.state_dir, name)).st_mode) == 0o600, name
