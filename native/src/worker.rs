//! The warm worker's per-task path for the common case (`gfaas.runtime.worker_native`): a lazy task
//! whose inputs all travel in the task itself, on a CPU function. Why native: at a few microseconds of
//! handler per task, the framework's Python around it (getter closures, the output checks, building
//! `Value`s and the `Done`) was most of a warm worker's time.
//!
//! The Python `FunctionHost` stays the reference and the fallback: every decision here is "is this the
//! common case?", and whatever is not (a stored input, a scalar or array that fails its declaration,
//! an output to store, a handler that asked for the data plane) goes to the host's Python methods with
//! nothing observable done yet, so they give the same reply, error messages included
//! (tests/unit/test_worker_native.py replays the same tasks into both).
//!
//! It only calls Python objects (the handler, numpy, msgspec structs) and reads clocks: no system call
//! of its own, so the worker's sandbox (runtime.seccomp) sees what the Python path makes.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple};
use std::time::Instant;

/// A carried input's reference: `inline:NAME` (worker.INLINE).
const INLINE: &str = "inline:";

/// The getter behind a native task's `Context`: carried values directly, anything else through the
/// host's Python getter over a lazy transport, made on first use (a NeedData then, as in Python).
#[pyclass(module = "gfaas_native")]
pub struct CarriedGetter {
    core: Py<WorkerCore>,
    values: Py<PyDict>,
    host: Py<PyAny>,
    task: Py<PyAny>,
    need: Py<PyAny>,
    started: f64,
    /// (getter, transport, host_get) from `FunctionHost._native_slow`, once a stored input was read.
    slow: Option<Py<PyTuple>>,
}

impl CarriedGetter {
    fn slow_getter(slf: &Bound<'_, Self>) -> PyResult<Py<PyTuple>> {
        let py = slf.py();
        if let Some(s) = &slf.borrow().slow {
            return Ok(s.clone_ref(py));
        }
        let made = {
            let me = slf.borrow();
            me.host.bind(py).call_method1(
                intern!(py, "_native_slow"),
                (me.task.bind(py), me.need.bind(py), me.started),
            )?
        };
        let made = made.cast_into::<PyTuple>()?.unbind();
        slf.borrow_mut().slow = Some(made.clone_ref(py));
        Ok(made)
    }
}

#[pymethods]
impl CarriedGetter {
    fn __call__(slf: &Bound<'_, Self>, r: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if r.is_exact_instance_of::<PyString>() {
            let s = r.cast::<PyString>()?.to_str()?;
            if let Some(name) = s.strip_prefix(INLINE) {
                let (v, core) = {
                    let me = slf.borrow();
                    (me.values.bind(py).get_item(name)?, me.core.clone_ref(py))
                };
                if let Some(v) = v {
                    let core = core.get();
                    if let Some(arr) = core.value_array(&v)? {
                        return Ok(arr.unbind());
                    }
                    return Ok(core.carried_array.bind(py).call1((v, r))?.unbind());
                }
            }
        }
        let slow = Self::slow_getter(slf)?;
        Ok(slow.bind(py).get_item(0)?.call1((r,))?.unbind())
    }
}

/// One function's native task path: what `FunctionHost._call` would look up per task, looked up once.
#[pyclass(module = "gfaas_native", frozen)]
pub struct WorkerCore {
    host: Py<PyAny>,
    handler: Py<PyAny>,
    /// `object.__new__` and the `Context` class: a task's context is made without its `__init__`'s
    /// keyword call, its slots set here as that `__init__` sets them (`ctx_slots`, `params`).
    new: Py<PyAny>,
    context: Py<PyAny>,
    /// (slot, value) of the context's slots that are the same for every task of this function.
    ctx_slots: Vec<(Py<PyString>, Py<PyAny>)>,
    /// the function's params, as a dict: each context gets its own copy (as `Context.__init__`).
    params: Py<PyDict>,
    /// output name -> (numpy dtype or None, shape tuple or None): its declaration (spec.TypeDecl),
    /// checked here as `TypeDecl.fits` does.
    decls: Py<PyDict>,
    /// worker._DTYPES: the dtype names a Value may carry, each checked once by `worker._value_dtype`.
    dtypes: Py<PyDict>,
    frombuffer: Py<PyAny>,
    ndarray: Py<PyAny>,
    scalars: Py<PyAny>,
    asarray: Py<PyAny>,
    value: Py<PyAny>,
    done: Py<PyAny>,
    carried_array: Py<PyAny>,
    monotonic: Py<PyAny>,
    /// worker._need_data and msgspec.structs.replace, for `follow`
    need_data: Py<PyAny>,
    replace: Py<PyAny>,
}

/// What a task's outputs came to on the native path, or None: the Python path decides.
struct Settled {
    scalars: Py<PyDict>,
    inline: Py<PyDict>,
    held: Py<PyDict>,
}

#[pymethods]
impl WorkerCore {
    /// `host`: the FunctionHost (its fallbacks); `kw`: what `worker_native.core_for` looked up.
    #[new]
    fn new(host: Py<PyAny>, kw: &Bound<'_, PyDict>) -> PyResult<Self> {
        let py = kw.py();
        let item = |k: &str| -> PyResult<Py<PyAny>> {
            kw.get_item(k)?
                .map(|v| v.unbind())
                .ok_or_else(|| crate::config_error(py, format!("WorkerCore: {k} missing")))
        };
        let mut ctx_slots = Vec::new();
        for (k, v) in item("ctx_slots")?.bind(py).cast::<PyDict>()?.iter() {
            ctx_slots.push((k.cast_into::<PyString>()?.unbind(), v.unbind()));
        }
        Ok(WorkerCore {
            host,
            handler: item("handler")?,
            new: item("new")?,
            context: item("context")?,
            ctx_slots,
            params: item("params")?.bind(py).cast::<PyDict>()?.clone().unbind(),
            decls: item("decls")?.bind(py).cast::<PyDict>()?.clone().unbind(),
            dtypes: item("dtypes")?.bind(py).cast::<PyDict>()?.clone().unbind(),
            frombuffer: item("frombuffer")?,
            ndarray: item("ndarray")?,
            scalars: item("scalars")?,
            asarray: item("asarray")?,
            value: item("value")?,
            done: item("done")?,
            carried_array: item("carried_array")?,
            monotonic: item("monotonic")?,
            need_data: item("need_data")?,
            replace: item("replace")?,
        })
    }

    /// `worker._follow(reply, task, hosts, sock, cap, asked, held)`, step for step: the chain after
    /// `task` run in this worker, each next task on the last reply's values (or what its function
    /// held), each reply in the last one's `next`, and the values that only the functions which ran
    /// here read dropped from the replies. `_follow` stays the reference (GFAAS_WORKER_CORE=python;
    /// tests/unit/test_worker_native.py replays chains into both). Why native: its bookkeeping per
    /// step (`_carried`, `_holdable`, `_keep_outside`, the loop) was about 3 us of Python per chain.
    #[allow(clippy::too_many_arguments)]
    fn follow(
        slf: &Bound<'_, Self>,
        reply: &Bound<'_, PyAny>,
        task: &Bound<'_, PyAny>,
        hosts: &Bound<'_, PyDict>,
        sock: &Bound<'_, PyAny>,
        cap: &Bound<'_, PyAny>,
        asked: &Bound<'_, PyAny>,
        held: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let me = slf.get();
        let done_cls = me.done.bind(py);
        let mut last = reply.clone();
        let mut t = task.getattr(intern!(py, "then"))?;
        let mut held = held.clone();
        let mut ran = vec![(reply.clone(), task.getattr(intern!(py, "consumers"))?)];
        let done = PySet::empty(py)?; // the chain's functions that ran here, to the end
        while !t.is_none() && !asked.get_item(0)?.is_truthy()? && !last.getattr(intern!(py, "outputs"))?.is_truthy()? {
            let function = t.getattr(intern!(py, "function"))?;
            let host = hosts.get_item(&function)?;
            let values = carried(&last, &t, &held)?;
            let (Some(host), Some(values)) = (host, values) else {
                break; // stored, or not made: the runtime schedules the rest
            };
            if !cap.is_none() {
                cap.call_method0(intern!(py, "resume"))?; // the last reply's take() drained the pipes
            }
            let kw = PyDict::new(py);
            kw.set_item(intern!(py, "values"), values)?;
            kw.set_item(intern!(py, "then"), py.None())?;
            let step = me.replace.bind(py).call((&t,), Some(&kw))?;
            let invocation = t.getattr(intern!(py, "invocation"))?;
            let need = me.need_data.bind(py).call1((sock, invocation, &function, asked))?;
            let hold = holdable(&t, hosts)?;
            let r = serve(&host, &step, &need, &hold, asked)?;
            held = host.call_method0(intern!(py, "take_held"))?;
            if !cap.is_none() {
                r.setattr(intern!(py, "logs"), cap.call_method0(intern!(py, "take"))?)?;
            }
            last.setattr(intern!(py, "next"), &r)?;
            if !r.get_type().is(done_cls) {
                break;
            }
            ran.push((r.clone(), t.getattr(intern!(py, "consumers"))?));
            done.add(&function)?;
            t = t.getattr(intern!(py, "then"))?;
            last = r;
        }
        if !done.is_empty() {
            keep_outside(&ran, &done)?;
        }
        Ok(())
    }

    /// Run `task` if it is the common case (a lazy task on carried values alone): its `Done` or
    /// `Failed`; None, having done nothing, when it is not (the caller runs `FunctionHost.run`).
    fn run(
        slf: &Bound<'_, Self>,
        task: &Bound<'_, PyAny>,
        need: &Bound<'_, PyAny>,
        hold: &Bound<'_, PyAny>,
        asked: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<PyAny>>> {
        if need.is_none() || !eligible(task)? {
            return Ok(None);
        }
        let py = slf.py();
        let me = slf.get();
        let host = me.host.bind(py);
        let values = task.getattr(intern!(py, "values"))?.cast_into::<PyDict>()?;
        let started: f64 = me.monotonic.bind(py).call0()?.extract()?;
        let getter = Bound::new(
            py,
            CarriedGetter {
                core: slf.clone().unbind(),
                values: values.unbind(),
                host: me.host.clone_ref(py),
                task: task.clone().unbind(),
                need: need.clone().unbind(),
                started,
                slow: None,
            },
        )?;
        let ctx = me.context(py, task.getattr(intern!(py, "invocation"))?, getter.as_any())?;
        let inputs = task.getattr(intern!(py, "inputs"))?;
        let t0 = Instant::now();
        let called = me.handler.bind(py).call1((&ctx, inputs));
        let handler_s = t0.elapsed().as_secs_f64();
        let out = match called {
            Ok(out) => out,
            Err(err) => {
                let failed = host.call_method1(intern!(py, "_failed"), (task, err.into_value(py)))?;
                return Ok(Some(failed.unbind()));
            }
        };
        let slow = getter.borrow().slow.as_ref().map(|s| s.clone_ref(py));
        // Any error here (a `get_s` the handler set to something else, say) leaves the outputs to the
        // Python path, which raises it where the reference does: the task's Failed, not the worker's.
        let settled = match slow {
            None => me.settle(py, task, &out, hold).and_then(|s| match s {
                Some(s) => Ok(Some((s, ctx.getattr(intern!(py, "get_s"))?.extract::<f64>()?))),
                None => Ok(None),
            }),
            Some(_) => Ok(None), // the data plane was bound: the Python path stores and closes
        };
        let Ok(Some((s, get_s))) = settled else {
            let slow: Py<PyAny> = match slow {
                Some(s) => s.into_any(),
                None => py.None(),
            };
            let reply = host.call_method1(
                intern!(py, "_native_settle"),
                (task, out, ctx, handler_s, need, hold, asked, slow),
            )?;
            return Ok(Some(reply.unbind()));
        };
        host.setattr(intern!(py, "held"), s.held.bind(py))?;
        let kw = PyDict::new(py);
        kw.set_item(intern!(py, "values"), s.inline.bind(py))?;
        let done = me.done.bind(py).call(
            (
                task.getattr(intern!(py, "invocation"))?,
                PyDict::new(py),
                s.scalars.bind(py),
                0.0,
                get_s,
                handler_s - get_s,
                0.0,
                0.0,
            ),
            Some(&kw),
        )?;
        Ok(Some(done.unbind()))
    }
}

/// `FunctionHost.serve(step, None, need, hold=hold, asked=asked)`: the host's native core, where it
/// has one and the task is its common case, else its Python `run`.
fn serve<'py>(
    host: &Bound<'py, PyAny>,
    step: &Bound<'py, PyAny>,
    need: &Bound<'py, PyAny>,
    hold: &Bound<'py, PyAny>,
    asked: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = host.py();
    let core = host.getattr(intern!(py, "core"))?;
    if !core.is_none() {
        let reply = match core.cast::<WorkerCore>() {
            Ok(c) => WorkerCore::run(c, step, need, hold, asked)?.map(|r| r.into_bound(py)),
            Err(_) => {
                let r = core.call_method1(intern!(py, "run"), (step, need, hold, asked))?;
                (!r.is_none()).then_some(r)
            }
        };
        if let Some(r) = reply {
            return Ok(r);
        }
    }
    let kw = PyDict::new(py);
    kw.set_item(intern!(py, "hold"), hold)?;
    kw.set_item(intern!(py, "asked"), asked)?;
    host.call_method(intern!(py, "run"), (step, py.None(), need), Some(&kw))
}

/// worker._carried: `t`'s values, its own and what it reads from the step before (that step's
/// reply's values, or what its function held here); None if one of them is neither.
fn carried<'py>(
    last: &Bound<'py, PyAny>,
    t: &Bound<'py, PyAny>,
    held: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let py = t.py();
    let values = t.getattr(intern!(py, "values"))?.cast_into::<PyDict>()?.copy()?;
    let made = last.getattr(intern!(py, "values"))?.cast_into::<PyDict>()?;
    let held = held.cast::<PyDict>()?;
    for (name, out) in t.getattr(intern!(py, "carry"))?.cast::<PyDict>()?.iter() {
        // `.get(out)`: a missing key and a None value are alike
        let v = match made.get_item(&out)?.filter(|v| !v.is_none()) {
            Some(v) => v,
            None => match held.get_item(&out)?.filter(|v| !v.is_none()) {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        values.set_item(name, v)?;
    }
    Ok(Some(values))
}

/// worker._holdable: the outputs of `task` that only the chain's next function reads, through its
/// carry, when that function runs in this worker.
fn holdable<'py>(task: &Bound<'py, PyAny>, hosts: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyAny>> {
    let py = task.py();
    let nxt = task.getattr(intern!(py, "then"))?;
    if nxt.is_none() || !task.getattr(intern!(py, "lazy"))?.is_truthy()? {
        return Ok(PyFrozenSet::empty(py)?.into_any());
    }
    let function = nxt.getattr(intern!(py, "function"))?;
    if !hosts.contains(&function)? {
        return Ok(PyFrozenSet::empty(py)?.into_any());
    }
    let carry = nxt.getattr(intern!(py, "carry"))?.cast_into::<PyDict>()?;
    let carried = PySet::new(py, carry.values().iter())?;
    let only = PyList::new(py, [&function])?;
    let mut names = Vec::new();
    for (name, readers) in task.getattr(intern!(py, "consumers"))?.cast::<PyDict>()?.iter() {
        if readers.eq(&only)? && carried.contains(&name)? {
            names.push(name);
        }
    }
    Ok(PyFrozenSet::new(py, names.iter())?.into_any())
}

/// worker._keep_outside: drop from each reply of the chain the values that only functions which ran
/// here (`done`) read.
fn keep_outside(ran: &[(Bound<'_, PyAny>, Bound<'_, PyAny>)], done: &Bound<'_, PySet>) -> PyResult<()> {
    for (reply, consumers) in ran {
        let py = reply.py();
        let values = reply.getattr(intern!(py, "values"))?.cast_into::<PyDict>()?;
        let consumers = consumers.cast::<PyDict>()?;
        let mut gone = Vec::new();
        for (name, _) in values.iter() {
            let Some(readers) = consumers.get_item(&name)? else {
                continue;
            };
            if !readers.is_truthy()? {
                continue;
            }
            let mut all = true; // set(readers) <= done
            for r in readers.try_iter()? {
                if !done.contains(r?)? {
                    all = false;
                    break;
                }
            }
            if all {
                gone.push(name);
            }
        }
        for name in gone {
            values.del_item(name)?;
        }
    }
    Ok(())
}

/// A lazy task, not bound, on no accelerator, every input carried in it (`inline:NAME` in its values).
fn eligible(task: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = task.py();
    if !task.getattr(intern!(py, "lazy"))?.is_truthy()?
        || task.getattr(intern!(py, "bound"))?.is_truthy()?
        || task.getattr(intern!(py, "accel"))?.is_truthy()?
    {
        return Ok(false);
    }
    let values = task.getattr(intern!(py, "values"))?;
    let values = values.cast::<PyDict>()?;
    let inputs = task.getattr(intern!(py, "inputs"))?;
    for (_, r) in inputs.cast::<PyDict>()?.iter() {
        if !r.is_exact_instance_of::<PyString>() {
            return Ok(false);
        }
        match r.cast::<PyString>()?.to_str()?.strip_prefix(INLINE) {
            Some(name) if values.contains(name)? => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

impl WorkerCore {
    /// A task's `Context`: made as `Context(workflow=..., invocation=..., getter=..., ...)` would make
    /// it, without the keyword call: its slots set to what that `__init__` sets them to
    /// (tests/unit/test_worker_native.py compares the two, slot by slot).
    fn context<'py>(
        &self,
        py: Python<'py>,
        invocation: Bound<'py, PyAny>,
        getter: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ctx = self.new.bind(py).call1((self.context.bind(py),))?;
        for (k, v) in &self.ctx_slots {
            ctx.setattr(k.bind(py), v.bind(py))?;
        }
        ctx.setattr(intern!(py, "invocation"), invocation)?;
        // `dict(params or {})`: a dict of its own, which the handler may change (a copy of `params`,
        // itself a copy of the function's read-only params, made once)
        let params = self.params.bind(py).copy()?;
        ctx.setattr(intern!(py, "params"), params)?;
        ctx.setattr(intern!(py, "_getter"), getter)?;
        Ok(ctx)
    }

    /// `worker.from_value(v)` where `v` is a `Value` that needs no error: a dtype that
    /// `worker._value_dtype` accepted before, sizes >= 0 whose product fits its bytes. None for anything
    /// else (the Python path checks it, and raises what it raises).
    fn value_array<'py>(&self, v: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = v.py();
        if !v.get_type().is(self.value.bind(py)) {
            return Ok(None);
        }
        let Some(dt) = self.dtypes.bind(py).get_item(v.getattr(intern!(py, "dtype"))?)? else {
            return Ok(None);
        };
        let shape = v.getattr(intern!(py, "shape"))?;
        let Ok(dims) = shape.cast::<PyList>() else {
            return Ok(None);
        };
        if dims.len() > 32 {
            return Ok(None);
        }
        let mut n: usize = dt.getattr(intern!(py, "itemsize"))?.extract()?;
        for d in dims.iter() {
            if !d.is_exact_instance_of::<PyInt>() {
                return Ok(None);
            }
            let Some(m) = d
                .extract::<u64>()
                .ok()
                .and_then(|d| n.checked_mul(usize::try_from(d).ok()?))
            else {
                return Ok(None); // negative, or more bytes than any message holds
            };
            n = m;
        }
        let data = v.getattr(intern!(py, "data"))?;
        if !data.is_exact_instance_of::<PyBytes>() || data.len()? != n {
            return Ok(None);
        }
        let flat = self.frombuffer.bind(py).call1((data, dt))?;
        Ok(Some(flat.call_method1(intern!(py, "reshape"), (shape,))?))
    }

    /// The outputs checked and placed as `FunctionHost._check` and `_settle` would, when each is a
    /// numeric array (or scalar) that fits its declaration and goes back as a value or is held for
    /// the chain's next function; None when the Python path must decide (an error, a store).
    fn settle(
        &self,
        py: Python<'_>,
        task: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        hold: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Settled>> {
        let Some((arrays, scalars)) = self.checked(py, out)? else {
            return Ok(None);
        };
        let limit: usize = task.getattr(intern!(py, "inline_max"))?.extract()?;
        let inline = PyDict::new(py);
        let held = PyDict::new(py);
        let consumers = task.getattr(intern!(py, "consumers"))?;
        for (name, _) in consumers.cast::<PyDict>()?.iter() {
            // `values[name]`: both are exact str (checked, and decoded from the task)
            let Ok(key) = name.cast::<PyString>() else {
                return Ok(None);
            };
            let key = key.to_str()?;
            let Some(a) = arrays.iter().find(|a| a.name == key) else {
                return Ok(None);
            };
            let nbytes: usize = a.v.getattr(intern!(py, "nbytes"))?.extract()?;
            if limit > 0 && nbytes <= limit {
                inline.set_item(&name, self.to_value(a)?)?;
            } else if hold.contains(&name)? {
                let view = a.v.call_method0(intern!(py, "view"))?;
                view.getattr(intern!(py, "flags"))?
                    .setattr(intern!(py, "writeable"), false)?;
                held.set_item(&name, view)?;
            } else {
                return Ok(None); // stored: the lazy transport's NeedData and put are Python's
            }
        }
        Ok(Some(Settled {
            scalars: scalars.unbind(),
            inline: inline.unbind(),
            held: held.unbind(),
        }))
    }

    /// The handler's outputs as arrays, when it returned exactly the declared names, each a numeric
    /// array (or a scalar, made one) fitting its declaration: `_check`'s common case; and the
    /// scalars among them as `_settle` reports them (a 0-d array of a real kind, as a float).
    fn checked<'py>(
        &self,
        py: Python<'py>,
        out: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Vec<Output<'py>>, Bound<'py, PyDict>)>> {
        if !out.is_exact_instance_of::<PyDict>() {
            return Ok(None);
        }
        let out = out.cast::<PyDict>()?;
        let decls = self.decls.bind(py);
        if out.len() != decls.len() {
            return Ok(None);
        }
        let mut arrays = Vec::with_capacity(out.len());
        let scalars = PyDict::new(py);
        for (name, v) in out.iter() {
            let Ok(key) = name.cast::<PyString>() else {
                return Ok(None);
            };
            if !key.is_exact_instance_of::<PyString>() {
                return Ok(None);
            }
            let Some(decl) = decls.get_item(&name)? else {
                return Ok(None);
            };
            let v = if v.is_instance(self.scalars.bind(py))? {
                self.asarray.bind(py).call1((v,))?
            } else {
                v
            };
            if !v.get_type().is(self.ndarray.bind(py)) {
                return Ok(None);
            }
            let dtype = v.getattr(intern!(py, "dtype"))?;
            let shape = v.getattr(intern!(py, "shape"))?.cast_into::<PyTuple>()?;
            let k = kind(&dtype)?;
            if !"biufc".contains(k) || !fits(&dtype, &shape, decl.cast::<PyTuple>()?)? {
                return Ok(None);
            }
            if "biuf".contains(k) && shape.is_empty() {
                let f: f64 = v.extract()?;
                scalars.set_item(&name, f)?;
            }
            arrays.push(Output {
                name: key.to_str()?.to_owned(),
                v,
                dtype,
                shape,
            });
        }
        Ok(Some((arrays, scalars)))
    }

    /// worker.to_value: dtype string, shape as a list, C-order bytes (`tobytes` copies in C order).
    fn to_value<'py>(&self, a: &Output<'py>) -> PyResult<Bound<'py, PyAny>> {
        let py = a.v.py();
        let dtype = a.dtype.getattr(intern!(py, "str"))?;
        let shape = PyList::new(py, a.shape.iter())?;
        let data = a.v.call_method0(intern!(py, "tobytes"))?;
        self.value.bind(py).call1((dtype, shape, data))
    }
}

/// A checked output: its name, the array, and its dtype and shape (read once).
struct Output<'py> {
    name: String,
    v: Bound<'py, PyAny>,
    dtype: Bound<'py, PyAny>,
    shape: Bound<'py, PyTuple>,
}

/// `TypeDecl.fits(v)` for a declaration given as (numpy dtype or None, shape tuple or None): the same
/// comparisons, in the same order (`dtype !=`, then `shape ==`, then `spec._shape_fits`).
fn fits(dtype: &Bound<'_, PyAny>, shape: &Bound<'_, PyTuple>, decl: &Bound<'_, PyTuple>) -> PyResult<bool> {
    let want = decl.get_item(0)?;
    if !want.is_none() && dtype.ne(&want)? {
        return Ok(false);
    }
    let want = decl.get_item(1)?;
    if want.is_none() {
        return Ok(true);
    }
    if shape.eq(&want)? {
        return Ok(true);
    }
    let want = want.cast::<PyTuple>()?;
    if shape.len() != want.len() {
        return Ok(false);
    }
    for (s, d) in shape.iter().zip(want.iter()) {
        if !(d.eq(-1)? || d.eq(&s)?) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The one-character kind of a numpy dtype.
fn kind(dtype: &Bound<'_, PyAny>) -> PyResult<char> {
    let py = dtype.py();
    let k = dtype.getattr(intern!(py, "kind"))?;
    Ok(k.cast::<PyString>()?.to_str()?.chars().next().unwrap_or('O'))
}
