//! `gfaas.runtime.dag.DagState`'s stepping, natively, for the simulator's requests.
//!
//! `DagPlan` is one workflow spec compiled once (per function: its sources, whether a `when:`
//! condition gates it, its inputs with their conditions); `DagCore` is one request's state over a
//! plan, with `DagState`'s contract as the simulator uses it: `start`, `finished`, `readers`,
//! `complete` and, when asked for, `events`. Every decision is the reference's rule restated, in the
//! same order; the Python class stays the reference and the runtime's
//! (tests/unit/test_sim_dag_native.py compares the two on random DAGs with conditions and skips).

use crate::HashMap;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyFloat, PyList, PyString, PyTuple};
use std::sync::Arc;

const WAITING: u8 = 0;
const READY: u8 = 1;
const DONE: u8 = 2;
const SKIPPED: u8 = 3;

static FUNCTION_FAILED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// gfaas's own `FunctionFailed` (gfaas.errors) with `msg`, as `DagState` raises it.
fn function_failed(py: Python<'_>, msg: String) -> PyErr {
    match FUNCTION_FAILED.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py.import("gfaas.errors")?.getattr("FunctionFailed")?.unbind())
    }) {
        Ok(cls) => match cls.bind(py).call1((msg,)) {
            Ok(err) => PyErr::from_value(err),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

struct Cond {
    function: usize,
    output: Py<PyString>,
    op: u8,
    value: f64,
    /// The spec's `Condition`, for the reference's error message (its `str`).
    text: Py<PyAny>,
}

impl Cond {
    /// `Condition.holds`: `_OPS[op](float(observed), value)`.
    fn holds(&self, observed: &Bound<'_, PyAny>) -> PyResult<bool> {
        let x = match observed.cast::<PyFloat>() {
            Ok(f) => f.value(),
            Err(_) => observed
                .py()
                .get_type::<PyFloat>()
                .call1((observed,))?
                .extract::<f64>()?,
        };
        let v = self.value;
        Ok(match self.op {
            0 => x > v,
            1 => x >= v,
            2 => x < v,
            3 => x <= v,
            4 => x == v,
            _ => x != v,
        })
    }
}

struct Input {
    /// The function it reads from; `None` for the workflow's own input.
    source: Option<usize>,
    when: Option<Cond>,
}

struct Func {
    name: Py<PyString>,
    sources: Vec<usize>,
    gated: bool,
    inputs: Vec<Input>,
}

struct Plan {
    fns: Vec<Func>,
    index: HashMap<String, usize>,
}

/// One workflow spec's plan, compiled once (``DagPlan(functions)``, see `gfaas.sim.cluster`).
#[pyclass(module = "gfaas_native", frozen)]
pub struct DagPlan {
    plan: Arc<Plan>,
}

fn op_code(op: &str) -> Option<u8> {
    Some(match op {
        ">" => 0,
        ">=" => 1,
        "<" => 2,
        "<=" => 3,
        "==" => 4,
        "!=" => 5,
        _ => return None,
    })
}

#[pymethods]
impl DagPlan {
    /// `functions`: per function in spec order, `(name, sources, gated, inputs)`, each input
    /// `(source or None, None or (function, output, op, value, condition))`; `sources` and `gated`
    /// as `WorkflowSpec.dag_plan` has them.
    #[new]
    #[allow(clippy::type_complexity)]
    fn new(
        py: Python<'_>,
        functions: Vec<(
            Bound<'_, PyString>,
            Vec<String>,
            bool,
            Vec<(
                Option<String>,
                Option<(String, Bound<'_, PyString>, String, f64, Py<PyAny>)>,
            )>,
        )>,
    ) -> PyResult<Self> {
        let mut index = HashMap::default();
        for (k, (name, _, _, _)) in functions.iter().enumerate() {
            index.insert(name.to_str()?.to_owned(), k);
        }
        let find = |n: &str| -> PyResult<usize> {
            index
                .get(n)
                .copied()
                .ok_or_else(|| crate::config_error(py, format!("DagPlan: no function {n:?}")))
        };
        let mut fns = Vec::with_capacity(functions.len());
        for (name, sources, gated, inputs) in &functions {
            let sources = sources.iter().map(|s| find(s)).collect::<PyResult<Vec<_>>>()?;
            let mut ins = Vec::with_capacity(inputs.len());
            for (source, when) in inputs {
                let source = match source {
                    Some(s) => Some(find(s)?),
                    None => None,
                };
                let when = match when {
                    Some((f, output, op, value, text)) => Some(Cond {
                        function: find(f)?,
                        output: output.clone().unbind(),
                        op: op_code(op)
                            .ok_or_else(|| crate::config_error(py, format!("DagPlan: unknown operator {op:?}")))?,
                        value: *value,
                        text: text.clone_ref(py),
                    }),
                    None => None,
                };
                ins.push(Input { source, when });
            }
            fns.push(Func {
                name: name.clone().unbind(),
                sources,
                gated: *gated,
                inputs: ins,
            });
        }
        Ok(DagPlan {
            plan: Arc::new(Plan { fns, index }),
        })
    }
}

/// One request's DAG state over a plan: `DagState`'s contract as the simulator uses it.
#[pyclass(module = "gfaas_native")]
pub struct DagCore {
    plan: Arc<Plan>,
    state: Vec<u8>,
    scalars: Vec<Option<Py<PyDict>>>,
    undecided: usize,
    events: Option<Py<PyList>>,
}

/// `mapping.get(key)` (a dict's without a Python call).
fn mapping_get<'py>(m: &Bound<'py, PyAny>, key: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let v = match m.cast::<PyDict>() {
        Ok(d) => d.get_item(key)?,
        Err(_) => Some(m.call_method1("get", (key,))?),
    };
    Ok(v.filter(|v| !v.is_none()))
}

impl DagCore {
    fn state_name(s: u8) -> &'static str {
        match s {
            WAITING => "waiting",
            READY => "ready",
            DONE => "done",
            _ => "skipped",
        }
    }

    fn advance<'py>(&mut self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        let ready = PyList::empty(py);
        let skipped = PyList::empty(py);
        let plan = self.plan.clone();
        let mut changed = true;
        while changed {
            changed = false;
            for (k, f) in plan.fns.iter().enumerate() {
                if self.state[k] != WAITING {
                    continue;
                }
                let mut lost = false;
                let mut open = false;
                for &s in &f.sources {
                    let st = self.state[s];
                    if st == WAITING || st == READY {
                        open = true;
                        break;
                    }
                    lost = lost || st == SKIPPED;
                }
                if open {
                    continue;
                }
                let runs = if f.gated || lost { self.runs(py, k)? } else { true };
                if runs {
                    self.state[k] = READY;
                    ready.append(f.name.bind(py))?;
                } else {
                    self.state[k] = SKIPPED;
                    self.undecided -= 1;
                    skipped.append(f.name.bind(py))?;
                    changed = true;
                }
                if let Some(ev) = &self.events {
                    let t = PyTuple::new(
                        py,
                        [
                            f.name.bind(py).clone().into_any(),
                            PyString::new(py, Self::state_name(self.state[k])).into_any(),
                        ],
                    )?;
                    ev.bind(py).append(t)?;
                }
            }
        }
        Ok((ready, skipped))
    }

    fn runs(&self, py: Python<'_>, k: usize) -> PyResult<bool> {
        let f = &self.plan.fns[k];
        for i in &f.inputs {
            if let Some(s) = i.source {
                if self.state[s] == SKIPPED {
                    return Ok(false);
                }
            }
            let Some(c) = &i.when else { continue };
            if self.state[c.function] == SKIPPED {
                return Ok(false);
            }
            let values = match &self.scalars[c.function] {
                Some(d) => d.bind(py).clone(),
                None => PyDict::new(py),
            };
            let Some(v) = values.get_item(c.output.bind(py))? else {
                let keys = values.keys();
                keys.sort()?;
                return Err(function_failed(
                    py,
                    format!(
                        "condition '{}' of function {}: {} returned no scalar {} (scalars it returned: {}); return a number for it",
                        c.text.bind(py).str()?,
                        f.name.bind(py).repr()?,
                        self.plan.fns[c.function].name.bind(py).repr()?,
                        c.output.bind(py).repr()?,
                        keys.repr()?,
                    ),
                ));
            };
            if !c.holds(&v)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[pymethods]
impl DagCore {
    /// A request's state over `plan`; `events`: a list to log every decision in, as `DagState.events`.
    #[new]
    #[pyo3(signature = (plan, events = None))]
    fn new(plan: &Bound<'_, DagPlan>, events: Option<Py<PyList>>) -> Self {
        let plan = plan.get().plan.clone();
        let n = plan.fns.len();
        DagCore {
            plan,
            state: vec![WAITING; n],
            scalars: (0..n).map(|_| None).collect(),
            undecided: n,
            events,
        }
    }

    fn start<'py>(&mut self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        self.advance(py)
    }

    fn finished<'py>(
        &mut self,
        py: Python<'py>,
        function: &Bound<'py, PyString>,
        scalars: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        let k = self.plan.index.get(function.to_str()?).copied();
        let st = k.map(|k| self.state[k]);
        if st != Some(READY) {
            let was = match st {
                Some(s) => format!("'{}'", Self::state_name(s)),
                None => "None".to_owned(),
            };
            return Err(function_failed(
                py,
                format!("function {} reported done but was {was}", function.repr()?),
            ));
        }
        let k = k.unwrap_or_default();
        self.state[k] = DONE;
        self.undecided -= 1;
        let copy = match scalars.cast::<PyDict>() {
            Ok(d) => d.copy()?,
            Err(_) => py.get_type::<PyDict>().call1((scalars,))?.cast_into::<PyDict>()?,
        };
        self.scalars[k] = Some(copy.unbind());
        self.advance(py)
    }

    /// `DagState.readers`: who reads `function`'s output and may still run once it finished with `scalars`.
    fn readers<'py>(
        &self,
        py: Python<'py>,
        function: &Bound<'py, PyString>,
        scalars: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let Some(&me) = self.plan.index.get(function.to_str()?) else {
            return Ok(out);
        };
        for (k, f) in self.plan.fns.iter().enumerate() {
            if !f.inputs.iter().any(|i| i.source == Some(me)) || self.state[k] == SKIPPED {
                continue;
            }
            let mut ok = true;
            for i in &f.inputs {
                let Some(c) = &i.when else { continue };
                let value = if c.function == me {
                    mapping_get(scalars, c.output.bind(py))?
                } else if self.state[c.function] == DONE {
                    match &self.scalars[c.function] {
                        Some(d) => d.bind(py).get_item(c.output.bind(py))?.filter(|v| !v.is_none()),
                        None => None,
                    }
                } else {
                    continue;
                };
                match value {
                    Some(v) if c.holds(&v)? => {}
                    _ => ok = false,
                }
            }
            if ok {
                out.append(f.name.bind(py))?;
            }
        }
        Ok(out)
    }

    #[getter]
    fn complete(&self) -> bool {
        self.undecided == 0
    }

    /// The decisions logged so far (the list given at construction; empty without one).
    #[getter]
    fn events<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        match &self.events {
            Some(e) => e.bind(py).clone(),
            None => PyList::empty(py),
        }
    }
}
