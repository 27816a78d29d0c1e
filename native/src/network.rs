//! The simulator's fluid network: `gfaas.sim.network.Network`'s contract and arithmetic.
//!
//! Flows on multi-hop paths share edges max-min fairly (progressive filling, with per-flow caps). A
//! change re-allocates only the component of the flow/edge graph it touches, a flow is advanced only
//! when its own rate changes, finish times sit in a heap and one kernel event fires at the soonest.
//! Every float is computed by the same operations in the same order as the reference (the component
//! sorted by flow, the dirty flows and each edge's flows in insertion order), so runs agree with it
//! bit for bit, not only up to rounding.

use crate::HashSet;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{PyTraverseError, PyVisit};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use crate::config_error;
use crate::kernel::{Event, Kernel};
use crate::{py_max, py_min};

const GB: f64 = 1e9;
const EPS_BYTES: f64 = 1e-6;
/// Finish times within this many seconds after a completion event are checked for being done too.
const SLACK_S: f64 = 1e-9;

/// One fluid flow (`gfaas.sim.network.Flow`): `rate` in bytes per second, `remaining` in bytes at
/// time `t` (`FluidNetwork.left` gives the bytes left now).
#[pyclass(module = "gfaas_native")]
pub struct Flow {
    #[pyo3(get)]
    ident: u64,
    edge_ids: Arc<[usize]>,
    #[pyo3(get)]
    edges: Py<PyTuple>,
    #[pyo3(get)]
    remaining: f64,
    #[pyo3(get)]
    cap: Option<f64>,
    #[pyo3(get)]
    on_done: Py<PyAny>,
    #[pyo3(get)]
    rate: f64,
    #[pyo3(get)]
    pub(crate) done: bool,
    #[pyo3(get)]
    t: f64,
    #[pyo3(get)]
    finish: f64,
}

#[pymethods]
impl Flow {
    // on_done usually refers back to the model that holds the network holding this flow.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.on_done)?;
        visit.call(&self.edges)
    }
}

struct Path {
    edges: Arc<[usize]>,
    keys: Py<PyTuple>,
}

struct Fin {
    t: f64,
    ident: u64,
}

// A min-heap on (finish time, flow): BinaryHeap is a max-heap, so the order is reversed.
impl Ord for Fin {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .t
            .partial_cmp(&self.t)
            .unwrap_or(Ordering::Equal)
            .then(other.ident.cmp(&self.ident))
    }
}
impl PartialOrd for Fin {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Fin {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Fin {}

/// The fluid network of one simulation; every edge of the topology is a shared resource.
#[pyclass(module = "gfaas_native", subclass)]
pub struct FluidNetwork {
    #[pyo3(get)]
    sim: Py<PyAny>,
    native_sim: Option<Py<Kernel>>,
    #[pyo3(get)]
    topology: Py<PyAny>,
    cap: Vec<f64>,
    edge_keys: Vec<Py<PyTuple>>,
    index: Py<PyDict>,
    paths: Py<PyDict>,
    path_list: Vec<Path>,
    flows: BTreeMap<u64, Py<Flow>>,
    seq: u64,
    on: Vec<Vec<u64>>,
    moved: Vec<f64>,
    moved_seen: Vec<bool>,
    moved_order: Vec<usize>,
    dirty: Vec<u64>,
    dirty_set: HashSet<u64>,
    // commit_now's working sets, kept between calls so that a re-allocation allocates nothing
    scratch_seen: HashSet<u64>,
    scratch_comp: Vec<u64>,
    scratch_stack: Vec<u64>,
    depth: u32,
    heap: BinaryHeap<Fin>,
    next: Option<(Py<PyAny>, f64)>,
}

impl FluidNetwork {
    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        match &self.native_sim {
            Some(k) => Ok(k.borrow(py).now),
            None => self.sim.bind(py).getattr("now")?.extract(),
        }
    }

    fn mark_dirty(&mut self, ident: u64) {
        if self.dirty_set.insert(ident) {
            self.dirty.push(ident);
        }
    }

    /// Advance `f` to `now` at its current rate and book the bytes on its edges.
    fn settle(&mut self, f: &mut Flow, now: f64) {
        let dt = now - f.t;
        if dt > 0.0 {
            let moved = f.rate * dt;
            f.remaining -= moved;
            for &e in f.edge_ids.iter() {
                if !self.moved_seen[e] {
                    // The first bytes an edge carries: its place in bytes_moved, as in the reference's dict.
                    self.moved_seen[e] = true;
                    self.moved_order.push(e);
                }
                self.moved[e] += moved;
            }
        }
        f.t = now;
    }

    /// Take a finished or cancelled flow out; the flows it shared edges with need new rates.
    fn drop_flow(&mut self, f: &mut Flow) {
        self.flows.remove(&f.ident);
        for &e in f.edge_ids.iter() {
            let users = &mut self.on[e];
            if let Some(pos) = users.iter().position(|&h| h == f.ident) {
                users.remove(pos);
            }
            for i in 0..self.on[e].len() {
                let h = self.on[e][i];
                self.mark_dirty(h);
            }
        }
        f.finish = f64::INFINITY;
    }

    /// Max-min fair rates with per-flow caps (progressive filling) over one component, sorted by flow.
    fn allocate(&self, py: Python<'_>, comp: &[u64]) {
        let capacity = &self.cap;
        if comp.len() == 1 {
            let mut f = self.flows[&comp[0]].borrow_mut(py);
            let mut share = f64::INFINITY;
            let mut first = true;
            for &e in f.edge_ids.iter() {
                share = if first { capacity[e] } else { py_min(share, capacity[e]) };
                first = false;
            }
            if let Some(c) = f.cap {
                share = py_min(share, c);
            }
            f.rate = py_max(share, 0.0);
            return;
        }
        // Per edge of the component: its index among `users`, its flow count and what is left.
        let mut slot: Vec<usize> = Vec::new();
        let mut count: Vec<i64> = Vec::new();
        let mut left: Vec<f64> = Vec::new();
        let mut local: crate::HashMap<usize, usize> = crate::HashMap::default();
        struct A {
            ident: u64,
            cap: Option<f64>,
            rate: f64,
            edges: std::ops::Range<usize>, // its edges' indices into slot/count/left, in `flat`
        }
        let mut flat: Vec<usize> = Vec::new(); // every flow's edge indices, one after another
        let mut active: Vec<A> = Vec::with_capacity(comp.len());
        for &id in comp {
            let f = self.flows[&id].borrow(py);
            let lo = flat.len();
            for &e in f.edge_ids.iter() {
                let i = *local.entry(e).or_insert_with(|| {
                    slot.push(e);
                    count.push(0);
                    left.push(capacity[e]);
                    slot.len() - 1
                });
                count[i] += 1;
                flat.push(i);
            }
            active.push(A {
                ident: id,
                cap: f.cap,
                rate: 0.0,
                edges: lo..flat.len(),
            });
        }
        let mut rates: Vec<(u64, f64)> = Vec::with_capacity(comp.len());
        while !active.is_empty() {
            // The tightest constraint: an edge's equal share, or a flow's own cap.
            let mut share = f64::INFINITY;
            let mut first = true;
            for i in 0..slot.len() {
                if count[i] != 0 {
                    let s = left[i] / count[i] as f64;
                    share = if first { s } else { py_min(share, s) };
                    first = false;
                }
            }
            for a in &active {
                if let Some(c) = a.cap {
                    share = py_min(share, c - a.rate);
                }
            }
            share = py_max(share, 0.0);
            for a in active.iter_mut() {
                a.rate += share;
            }
            for i in 0..slot.len() {
                left[i] -= share * count[i] as f64;
            }
            // The frozen flows leave, in order (whether a flow is frozen reads `left`, which
            // leaving does not change, so deciding as they go is deciding first).
            let before = active.len();
            active.retain(|a| {
                let frozen = (a.cap.is_some() && a.rate >= a.cap.unwrap_or(0.0) * (1.0 - 1e-12))
                    || flat[a.edges.clone()]
                        .iter()
                        .any(|&i| left[i] <= capacity[slot[i]] * 1e-12);
                if frozen {
                    for &i in &flat[a.edges.clone()] {
                        count[i] -= 1;
                    }
                    rates.push((a.ident, a.rate));
                }
                !frozen
            });
            if active.len() == before {
                break; // numerical safety: nothing binds (cannot happen with finite capacities)
            }
        }
        for a in &active {
            rates.push((a.ident, a.rate));
        }
        for (id, rate) in rates {
            self.flows[&id].borrow_mut(py).rate = rate;
        }
    }

    /// New rates for every component a change touched; then the completion event at the soonest finish.
    fn commit_now(&mut self, slf_obj: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf_obj.py();
        if !self.dirty.is_empty() {
            let mut dirty = std::mem::take(&mut self.dirty);
            self.dirty_set.clear();
            let now = self.now(py)?;
            let mut seen = std::mem::take(&mut self.scratch_seen);
            let mut comp = std::mem::take(&mut self.scratch_comp);
            let mut stack = std::mem::take(&mut self.scratch_stack);
            seen.clear();
            for &f in dirty.iter() {
                if !self.flows.contains_key(&f) || seen.contains(&f) {
                    continue;
                }
                // The component of f in the flow/edge graph.
                seen.insert(f);
                comp.clear();
                comp.push(f);
                stack.clear();
                stack.push(f);
                while let Some(g) = stack.pop() {
                    // Read in place: the walk only touches locals and `on` (no Vec per flow).
                    let fl = self.flows[&g].borrow(py);
                    for &e in fl.edge_ids.iter() {
                        for &h in &self.on[e] {
                            if seen.insert(h) {
                                comp.push(h);
                                stack.push(h);
                            }
                        }
                    }
                }
                if comp.len() > 1 {
                    comp.sort_unstable(); // start order, so float sums (and runs) are reproducible
                }
                for &g in &comp {
                    let flow = self.flows[&g].clone_ref(py);
                    let mut fm = flow.borrow_mut(py);
                    if now > fm.t {
                        self.settle(&mut fm, now);
                    }
                }
                self.allocate(py, &comp);
                for &g in &comp {
                    let mut fm = self.flows[&g].borrow_mut(py);
                    let rate = fm.rate;
                    if rate > 0.0 {
                        let rem = fm.remaining;
                        fm.finish = now + (if rem > 0.0 { rem } else { 0.0 }) / rate;
                        self.heap.push(Fin { t: fm.finish, ident: g });
                    } else {
                        fm.finish = f64::INFINITY;
                    }
                }
            }
            // The buffers go back for the next call (flows marked during this one stay marked).
            (self.scratch_seen, self.scratch_comp, self.scratch_stack) = (seen, comp, stack);
            if self.dirty.is_empty() {
                dirty.clear();
                self.dirty = dirty;
            }
            if self.heap.len() > 64 + 4 * self.flows.len() {
                // Drop stale entries now and then.
                let mut v = Vec::with_capacity(self.flows.len());
                for (&id, f) in &self.flows {
                    let fin = f.borrow(py).finish;
                    if fin < f64::INFINITY {
                        v.push(Fin { t: fin, ident: id });
                    }
                }
                self.heap = BinaryHeap::from(v);
            }
        }
        self.reschedule(slf_obj)
    }

    fn soonest(&mut self, py: Python<'_>) -> f64 {
        while let Some(top) = self.heap.peek() {
            if let Some(f) = self.flows.get(&top.ident) {
                let f = f.borrow(py);
                if !f.done && f.finish == top.t {
                    return top.t;
                }
            }
            self.heap.pop();
        }
        f64::INFINITY
    }

    fn reschedule(&mut self, slf_obj: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf_obj.py();
        let t = self.soonest(py);
        if let Some((ev, when)) = self.next.take() {
            if when == t {
                self.next = Some((ev, when)); // already due then: keep the event
                return Ok(());
            }
            match &self.native_sim {
                // The native kernel directly: the same cancel, without a Python call.
                Some(k) => k.borrow_mut(py).cancel(ev.bind(py).cast::<Event>()?),
                None => {
                    self.sim.bind(py).call_method1("cancel", (ev,))?;
                }
            }
        }
        if t < f64::INFINITY {
            let complete = slf_obj.getattr("_complete")?;
            let ev = match &self.native_sim {
                Some(k) => k.borrow_mut(py).at(py, t, complete, PyTuple::empty(py), -1)?.into_any(),
                None => {
                    let kwargs = PyDict::new(py);
                    kwargs.set_item("priority", -1)?;
                    self.sim
                        .bind(py)
                        .call_method("at", (t, complete), Some(&kwargs))?
                        .unbind()
                }
            };
            self.next = Some((ev, t));
        }
        Ok(())
    }

    /// The index of the path `hops` (checked against the topology the first time it is seen).
    pub(crate) fn path_index(slf: &Bound<'_, Self>, hops: &Bound<'_, PyAny>) -> PyResult<usize> {
        let py = slf.py();
        let key = PyTuple::new(py, hops.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
        let mut net = slf.borrow_mut();
        if let Some(i) = net.paths.bind(py).get_item(&key)? {
            return i.extract::<usize>();
        }
        // A path seen for the first time: check its links once.
        let n = key.len();
        let mut ids = Vec::with_capacity(n.saturating_sub(1));
        let mut keys = Vec::with_capacity(n.saturating_sub(1));
        for j in 1..n {
            let (a, b) = (key.get_item(j - 1)?, key.get_item(j)?);
            let e = PyTuple::new(py, [&a, &b])?;
            match net.index.bind(py).get_item(&e)? {
                Some(i) => ids.push(i.extract::<usize>()?),
                None => {
                    let joined: Vec<String> = key.iter().map(|h| h.to_string()).collect();
                    let name = net.topology.bind(py).getattr("name")?.repr()?.to_string();
                    return Err(config_error(
                        py,
                        format!(
                            "path {} uses {}->{}, which is not a link of topology {}",
                            joined.join("->"),
                            a,
                            b,
                            name
                        ),
                    ));
                }
            }
            keys.push(e);
        }
        let i = net.path_list.len();
        net.path_list.push(Path {
            edges: ids.into(),
            keys: PyTuple::new(py, keys)?.unbind(),
        });
        net.paths.bind(py).set_item(&key, i)?;
        Ok(i)
    }

    /// `start` on a path `path_index` gave, with a size already checked to be >= 0.
    pub(crate) fn start_path(
        slf: &Bound<'_, Self>,
        path: usize,
        size: f64,
        on_done: Bound<'_, PyAny>,
        cap_gbps: Option<f64>,
    ) -> PyResult<Py<Flow>> {
        let py = slf.py();
        let mut net = slf.borrow_mut();
        net.seq += 1;
        let ident = net.seq;
        let now = net.now(py)?;
        let (edge_ids, edges) = {
            let p = &net.path_list[path];
            (p.edges.clone(), p.keys.clone_ref(py))
        };
        let empty = edge_ids.is_empty();
        let flow = Py::new(
            py,
            Flow {
                ident,
                edge_ids: edge_ids.clone(),
                edges,
                remaining: size,
                cap: cap_gbps.map(|c| c * GB),
                on_done: on_done.clone().unbind(),
                rate: 0.0,
                done: false,
                t: now,
                finish: f64::INFINITY,
            },
        )?;
        if empty || size <= EPS_BYTES {
            flow.borrow_mut(py).done = true;
            let sim = net.sim.clone_ref(py);
            drop(net);
            sim.bind(py).call_method1("schedule", (0.0, on_done))?;
            return Ok(flow);
        }
        net.flows.insert(ident, flow.clone_ref(py));
        for &e in edge_ids.iter() {
            net.on[e].push(ident);
        }
        net.mark_dirty(ident);
        if net.depth == 0 {
            net.commit_now(slf.as_any())?;
        }
        Ok(flow)
    }

    /// `set_caps` for caps computed natively (every one a number).
    pub(crate) fn set_caps_of(slf: &Bound<'_, Self>, caps: &[(Py<Flow>, f64)]) -> PyResult<()> {
        let py = slf.py();
        let mut net = slf.borrow_mut();
        for (flow, cap_gbps) in caps {
            let mut f = flow.borrow_mut(py);
            if !f.done {
                f.cap = Some(cap_gbps * GB);
                net.mark_dirty(f.ident);
            }
        }
        if net.depth == 0 {
            net.commit_now(slf.as_any())?;
        }
        Ok(())
    }

    /// Bytes `flow` has still to move at `now` (`left`, with the time already read).
    pub(crate) fn left_at(f: &Flow, now: f64) -> f64 {
        if f.done {
            return 0.0;
        }
        if now > f.t {
            f.remaining - f.rate * (now - f.t)
        } else {
            f.remaining
        }
    }

    pub(crate) fn begin_batch(&mut self) {
        self.begin_now();
    }

    fn begin_now(&mut self) {
        self.depth += 1;
    }

    /// `commit()`: end a batch, or apply pending changes outside one.
    fn commit_or_close(&mut self, slf_obj: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.depth > 0 {
            self.depth -= 1;
            if self.depth > 0 {
                return Ok(());
            }
        }
        self.commit_now(slf_obj)
    }
}

#[pymethods]
impl FluidNetwork {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.sim)?;
        visit.call(&self.native_sim)?;
        visit.call(&self.topology)?;
        visit.call(&self.index)?;
        visit.call(&self.paths)?;
        for k in &self.edge_keys {
            visit.call(k)?;
        }
        for p in &self.path_list {
            visit.call(&p.keys)?;
        }
        for f in self.flows.values() {
            visit.call(f)?;
        }
        if let Some((ev, _)) = &self.next {
            visit.call(ev)?;
        }
        Ok(())
    }

    /// Drops the live flows and the completion event (to break a cycle through them).
    fn __clear__(&mut self) {
        self.flows.clear();
        self.next = None;
        self.native_sim = None;
    }

    #[new]
    fn new(py: Python<'_>, sim: Bound<'_, PyAny>, topology: Bound<'_, PyAny>) -> PyResult<Self> {
        let index = PyDict::new(py);
        let mut cap = Vec::new();
        let mut edge_keys = Vec::new();
        for e in topology.call_method0("edges")?.try_iter()? {
            let e = e?;
            let key = PyTuple::new(py, [e.getattr("src")?, e.getattr("dst")?])?;
            let gbps: f64 = e.getattr("gbps")?.extract()?;
            // A repeated edge keeps its first position and takes the last capacity, as the
            // reference's dict comprehension does.
            match index.get_item(&key)? {
                Some(i) => {
                    let i: usize = i.extract()?;
                    cap[i] = gbps * GB;
                }
                None => {
                    index.set_item(&key, cap.len())?;
                    cap.push(gbps * GB);
                    edge_keys.push(key.unbind());
                }
            }
        }
        let n = cap.len();
        let native_sim = sim.cast::<Kernel>().ok().map(|k| k.clone().unbind());
        Ok(FluidNetwork {
            sim: sim.unbind(),
            native_sim,
            topology: topology.unbind(),
            cap,
            edge_keys,
            index: index.unbind(),
            paths: PyDict::new(py).unbind(),
            path_list: Vec::new(),
            flows: BTreeMap::new(),
            seq: 0,
            on: vec![Vec::new(); n],
            moved: vec![0.0; n],
            moved_seen: vec![false; n],
            moved_order: Vec::new(),
            dirty: Vec::new(),
            scratch_seen: HashSet::default(),
            scratch_comp: Vec::new(),
            scratch_stack: Vec::new(),
            dirty_set: HashSet::default(),
            depth: 0,
            heap: BinaryHeap::new(),
            next: None,
        })
    }

    /// Start moving `nbytes` along `hops`; `on_done()` runs when the last byte arrives.
    #[pyo3(signature = (hops, nbytes, on_done, cap_gbps = None))]
    fn start(
        slf: &Bound<'_, Self>,
        hops: Bound<'_, PyAny>,
        nbytes: Bound<'_, PyAny>,
        on_done: Bound<'_, PyAny>,
        cap_gbps: Option<f64>,
    ) -> PyResult<Py<Flow>> {
        let py = slf.py();
        let path = Self::path_index(slf, &hops)?;
        let size: f64 = nbytes.extract()?;
        if size < 0.0 {
            return Err(config_error(
                py,
                format!("a flow cannot carry {} bytes; give a size >= 0", nbytes.str()?),
            ));
        }
        Self::start_path(slf, path, size, on_done, cap_gbps)
    }

    /// Change a flow's rate cap (a new SLO share); takes effect now.
    #[pyo3(signature = (flow, cap_gbps))]
    fn set_cap(slf: &Bound<'_, Self>, flow: Bound<'_, Flow>, cap_gbps: Option<f64>) -> PyResult<()> {
        let mut net = slf.borrow_mut();
        let mut f = flow.borrow_mut();
        if !f.done {
            f.cap = cap_gbps.map(|c| c * GB);
            net.mark_dirty(f.ident);
        }
        drop(f);
        if net.depth == 0 {
            net.commit_now(slf.as_any())?;
        }
        Ok(())
    }

    /// Change several caps with one re-allocation of rates.
    fn set_caps(slf: &Bound<'_, Self>, caps: Bound<'_, PyAny>) -> PyResult<()> {
        let mut net = slf.borrow_mut();
        for item in caps.try_iter()? {
            let item = item?;
            let flow = item.get_item(0)?;
            let flow = flow.cast::<Flow>()?;
            let cap_gbps: Option<f64> = item.get_item(1)?.extract()?;
            let mut f = flow.borrow_mut();
            if !f.done {
                f.cap = cap_gbps.map(|c| c * GB);
                net.mark_dirty(f.ident);
            }
        }
        if net.depth == 0 {
            net.commit_now(slf.as_any())?;
        }
        Ok(())
    }

    /// Stop a flow without calling its callback; returns the bytes it had left.
    pub(crate) fn cancel(slf: &Bound<'_, Self>, flow: Bound<'_, Flow>) -> PyResult<f64> {
        let py = slf.py();
        let mut net = slf.borrow_mut();
        let remaining = {
            let mut f = flow.borrow_mut();
            if f.done {
                return Ok(0.0);
            }
            let now = net.now(py)?;
            net.settle(&mut f, now);
            f.done = true;
            net.drop_flow(&mut f);
            f.remaining
        };
        if net.depth == 0 {
            net.commit_now(slf.as_any())?;
        }
        Ok(remaining)
    }

    /// Bytes `flow` has still to move at the current time.
    fn left(&self, py: Python<'_>, flow: Bound<'_, Flow>) -> PyResult<f64> {
        let f = flow.borrow();
        if f.done {
            return Ok(0.0);
        }
        let now = self.now(py)?;
        Ok(if now > f.t {
            f.remaining - f.rate * (now - f.t)
        } else {
            f.remaining
        })
    }

    /// Bytes each edge has carried so far (edges that carried none are absent).
    #[getter]
    fn bytes_moved<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut out = self.moved.clone();
        let mut order = self.moved_order.clone();
        let mut seen = self.moved_seen.clone();
        let now = self.now(py)?;
        for f in self.flows.values() {
            let f = f.borrow(py);
            let dt = now - f.t;
            if dt > 0.0 {
                let moved = f.rate * dt;
                for &e in f.edge_ids.iter() {
                    if !seen[e] {
                        seen[e] = true;
                        order.push(e);
                    }
                    out[e] += moved;
                }
            }
        }
        let d = PyDict::new(py);
        for e in order {
            d.set_item(self.edge_keys[e].bind(py), out[e])?;
        }
        Ok(d)
    }

    /// Each edge's capacity in bytes per second.
    #[getter]
    fn capacity<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, c) in self.edge_keys.iter().zip(&self.cap) {
            d.set_item(k.bind(py), *c)?;
        }
        Ok(d)
    }

    /// The live flows by their number (a copy).
    #[getter]
    fn flows<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (id, f) in &self.flows {
            d.set_item(*id, f.bind(py))?;
        }
        Ok(d)
    }

    /// Start a batch: changes until the matching `commit` are re-allocated once, at the commit.
    fn begin(&mut self) {
        self.begin_now();
    }

    /// End a batch (or apply pending changes).
    pub(crate) fn commit(slf: &Bound<'_, Self>) -> PyResult<()> {
        slf.borrow_mut().commit_or_close(slf.as_any())
    }

    /// The completion event: flows done by now end (settled, dropped), then their callbacks run in
    /// one batch with what they start, cancel or re-cap.
    fn _complete(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let callbacks = {
            let mut net = slf.borrow_mut();
            net.next = None;
            let now = net.now(py)?;
            let mut finished: Vec<u64> = Vec::new();
            let mut keep: Vec<Fin> = Vec::new();
            while let Some(top) = net.heap.peek() {
                if top.t > now + SLACK_S {
                    break;
                }
                let entry = net.heap.pop().expect("peeked");
                let flow = match net.flows.get(&entry.ident) {
                    Some(f) => f.clone_ref(py),
                    None => continue, // stale
                };
                let mut f = flow.borrow_mut(py);
                if f.done || f.finish != entry.t {
                    continue; // stale
                }
                let rem = if now > f.t {
                    f.remaining - f.rate * (now - f.t)
                } else {
                    f.remaining
                };
                // Done: within rounding of its last byte, or its finish time is here (float residue).
                if rem <= py_max(EPS_BYTES, f.rate * 1e-12) || entry.t <= now {
                    f.finish = f64::INFINITY; // a duplicate entry of it is stale now
                    finished.push(entry.ident);
                } else {
                    keep.push(entry);
                }
            }
            for entry in keep {
                net.heap.push(entry);
            }
            finished.sort_unstable();
            let mut callbacks = Vec::with_capacity(finished.len());
            for id in finished {
                let flow = net.flows[&id].clone_ref(py);
                let mut f = flow.borrow_mut(py);
                net.settle(&mut f, now);
                f.done = true;
                f.remaining = 0.0;
                net.drop_flow(&mut f);
                callbacks.push(f.on_done.clone_ref(py));
            }
            net.begin_now();
            callbacks
        };
        // What the callbacks start, cancel or re-cap at this instant is re-allocated once, with the
        // flows that just ended; a callback's exception propagates after that commit.
        let mut result = Ok(());
        for cb in callbacks {
            if let Err(e) = cb.bind(py).call0() {
                result = Err(e);
                break;
            }
        }
        let committed = slf.borrow_mut().commit_or_close(slf.as_any());
        result.and(committed)
    }
}
