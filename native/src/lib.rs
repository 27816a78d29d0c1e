//! Native parts of gfaas, loaded by the Python package when built (`make setup` builds them): the
//! simulator's event kernel (`kernel.rs`, `gfaas.sim.kernel`), its fluid network (`network.rs`,
//! `gfaas.sim.network`), the router's planning (`router.rs`, `gfaas.policy.routing`) and the data
//! plane's transfer lifecycle (`dataplane.rs`, `gfaas.sim.dataplane`), and the warm worker's per-task
//! path for tasks on carried values (`worker.rs`, `gfaas.runtime.worker_native`; cross-checked by
//! tests/unit/test_worker_native.py). The pure-Python classes stay the reference: the native ones give the same
//! events in the same order, with the same floats (tests/unit/test_sim_kernel.py,
//! tests/unit/test_sim_network*.py, tests/unit/test_sim_dataplane_native.py,
//! tests/integration/test_sim_native_core.py). Why native: at cluster
//! scale a run is millions of heap operations and rate re-allocations, each a few Python-level
//! operations in the reference (docs/design/simulator.md, "A native core").

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyFloat;

mod dag;
mod dataplane;
mod kernel;
mod network;
mod router;
mod worker;

// The simulator's maps and sets hash with FxHash (rustc's hasher, from the rustc-hash crate): they are
// keyed by small integers and device names inside one process, so SipHash's protection against chosen
// keys buys nothing there, and it cost about a twentieth of a cluster-scale simulation. Nothing
// iterates one where the order could show (std's RandomState already gave a new order per process).
pub(crate) use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

static CONFIG_ERROR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// gfaas's own `ConfigError` (gfaas.errors), with `msg`: what the reference raises for bad input.
pub(crate) fn config_error(py: Python<'_>, msg: String) -> PyErr {
    match CONFIG_ERROR.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py.import("gfaas.errors")?.getattr("ConfigError")?.unbind())
    }) {
        Ok(cls) => match cls.bind(py).call1((msg,)) {
            Ok(err) => PyErr::from_value(err),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

/// Python's `min(a, b)` of two floats: the first of two equal values (the sign of a zero included),
/// as the references' `min` gives it, so the native parts' floats agree to the bit.
pub(crate) fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// Python's `max(a, b)` of two floats (the first of two equal values).
pub(crate) fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// Python's `repr` of a float (error messages read as the reference's).
pub(crate) fn float_repr(py: Python<'_>, v: f64) -> String {
    PyFloat::new(py, v)
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| v.to_string())
}

/// `getattr(fn, "__qualname__", None) or repr(fn)`, as the reference names a callback in errors.
pub(crate) fn callable_name(func: &Bound<'_, PyAny>) -> String {
    if let Ok(q) = func.getattr("__qualname__") {
        if q.is_truthy().unwrap_or(false) {
            return q.to_string();
        }
    }
    func.repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<callback>".into())
}

#[pymodule]
fn gfaas_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<kernel::Kernel>()?;
    m.add_class::<kernel::Event>()?;
    m.add_class::<network::FluidNetwork>()?;
    m.add_class::<network::Flow>()?;
    m.add_class::<router::RouterCore>()?;
    m.add_class::<dag::DagPlan>()?;
    m.add_class::<dag::DagCore>()?;
    m.add_class::<dataplane::DataPlaneCore>()?;
    m.add_class::<dataplane::FlowDone>()?;
    m.add_class::<worker::WorkerCore>()?;
    m.add_class::<worker::CarriedGetter>()?;
    Ok(())
}
