//! The simulator's data plane: `gfaas.sim.dataplane.PyDataPlane`'s transfer lifecycle, natively.
//!
//! `move` -> `_start` (plan, launch, re-route others, SLO shares of host links) -> flows -> `_finish`,
//! calling the router core (`router.rs`) and the fluid network (`network.rs`) directly, with
//! `Plan.split` and `slo_rates` restated here. Python keeps only what is not per transfer: compiling a
//! pair's route set (`NativeRouter._native_cset`, once per pair) and the device facts handed over at
//! construction. Every float comes from the same operations in the same order as the reference
//! (Python's `sum` included: plain before 3.12, Neumaier's compensated sum since), so runs agree with
//! it bit for bit (tests/unit/test_sim_dataplane_native.py).

use crate::HashMap;
use pyo3::exceptions::{PyKeyError, PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::kernel::Kernel;
use crate::network::{Flow, FluidNetwork};
use crate::router::{Picks, RouterCore};
use crate::{config_error, float_repr, py_max, py_min};

const GB: f64 = 1e9;
/// A handle no transfer gets: the direct router's plans are released at once, so one suffices.
const SCRATCH: u64 = u64::MAX;

const HOST: u8 = 1;
const GPU: u8 = 2;
const PCIE: u8 = 3;
const NIC: u8 = 4;

fn kind_code(kind: &str) -> u8 {
    match kind {
        "host" => HOST,
        "gpu" => GPU,
        "pcie" => PCIE,
        "nic" => NIC,
        _ => 0,
    }
}

/// Python's builtin `sum` of floats (start 0): left to right, compensated (Neumaier) since 3.12.
fn py_sum(xs: &[f64], neumaier: bool) -> f64 {
    let Some((&first, rest)) = xs.split_first() else {
        return 0.0;
    };
    let mut f = 0.0 + first; // `0 + x`: an int start turns -0.0 into 0.0
    if !neumaier {
        for &x in rest {
            f += x;
        }
        return f;
    }
    let mut c = 0.0;
    for &x in rest {
        let t = f + x;
        if f.abs() >= x.abs() {
            c += (f - t) + x;
        } else {
            c += (x - t) + f;
        }
        f = t;
    }
    if c != 0.0 && c.is_finite() {
        f += c;
    }
    f
}

/// Python's `int(x)` of a float, with its errors.
fn py_int(x: f64) -> PyResult<i64> {
    if x.is_nan() {
        return Err(PyValueError::new_err("cannot convert float NaN to integer"));
    }
    if x.is_infinite() {
        return Err(PyOverflowError::new_err("cannot convert float infinity to integer"));
    }
    Ok(x.trunc() as i64)
}

/// `Plan.split`: bytes per path, proportional to the rates, in whole chunks (largest remainder, ties
/// to the earlier path); the one short chunk comes off the path with the most.
pub(crate) fn split(nbytes: i64, chunk: i64, gbps: &[f64], neumaier: bool) -> Vec<i64> {
    let n = gbps.len();
    if n == 0 {
        return Vec::new();
    }
    if n == 1 {
        return vec![nbytes];
    }
    let chunks = -((-nbytes).div_euclid(chunk));
    let total = py_sum(gbps, neumaier);
    let quota: Vec<f64> = gbps.iter().map(|&g| chunks as f64 * g / total).collect();
    let mut counts: Vec<i64> = quota.iter().map(|&q| q.trunc() as i64).collect();
    while counts.iter().sum::<i64>() > chunks {
        // max by (counts[i] - quota[i], -i): the first of equal values
        let mut best = 0;
        for i in 1..n {
            if counts[i] as f64 - quota[i] > counts[best] as f64 - quota[best] {
                best = i;
            }
        }
        counts[best] -= 1;
    }
    let spare = chunks - counts.iter().sum::<i64>();
    let mut order: Vec<usize> = (0..n).collect();
    let key = |i: usize| -(quota[i] - counts[i] as f64);
    order.sort_by(|&a, &b| {
        key(a)
            .partial_cmp(&key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    for &i in order.iter().take(spare.max(0) as usize) {
        counts[i] += 1;
    }
    let mut out: Vec<i64> = counts.iter().map(|&c| c * chunk).collect();
    if chunks != 0 {
        let mut biggest = 0;
        for i in 1..n {
            if out[i] > out[biggest] {
                biggest = i;
            }
        }
        out[biggest] -= chunks * chunk - nbytes;
    }
    out
}

/// `rate_least`: GB/s that lands `bytes` by `deadline` (inf when already late).
fn rate_least(bytes: i64, deadline: f64, now: f64) -> f64 {
    if bytes == 0 {
        return 0.0;
    }
    let left = deadline - now;
    if left <= 0.0 {
        return f64::INFINITY;
    }
    bytes as f64 / GB / left
}

/// `slo_rates` over demands already checked: (remaining bytes, deadline) in order -> GB/s each.
pub(crate) fn slo_rates(demands: &[(i64, f64)], capacity: f64, now: f64, neumaier: bool) -> Vec<f64> {
    let need: Vec<f64> = demands.iter().map(|&(b, d)| rate_least(b, d, now)).collect();
    let late: Vec<usize> = (0..need.len()).filter(|&i| need[i].is_infinite()).collect();
    let mut rates;
    let tight;
    if !late.is_empty() {
        rates = vec![0.0; demands.len()];
        let total: i64 = late.iter().map(|&i| demands[i].0).sum();
        for &i in &late {
            rates[i] = capacity * demands[i].0 as f64 / total as f64;
        }
        tight = late[0];
    } else {
        let want = py_sum(&need, neumaier);
        let scale = if want <= capacity { 1.0 } else { capacity / want };
        rates = need.iter().map(|&n| n * scale).collect();
        let mut pending: Vec<usize> = (0..demands.len()).filter(|&i| demands[i].0 > 0).collect();
        if pending.is_empty() {
            pending = (0..demands.len()).collect();
        }
        let mut best = pending[0];
        for &i in &pending[1..] {
            if demands[i].1 < demands[best].1 {
                best = i;
            }
        }
        tight = best;
    }
    // The tightest one takes whatever is left, which also absorbs float rounding.
    let rest = capacity - (py_sum(&rates, neumaier) - rates[tight]);
    rates[tight] = if rest > 0.0 { rest } else { 0.0 };
    rates
}

#[derive(Clone, Copy)]
struct CandInfo {
    path: usize, // the fluid network's path index
    p2p: bool,   // GPU to GPU over PCIe, not through a NIC: capped at the root complex's P2P rate
}

/// One router as the data plane uses it: its core, its Python wrapper (which compiles route sets)
/// and what was learnt of its route sets and candidates.
struct Side {
    core: Py<RouterCore>,
    wrapper: Py<PyAny>,
    sets: HashMap<(usize, usize), usize>,
    cands: Vec<Option<CandInfo>>,
}

struct Transfer {
    src: usize,
    dst: usize,
    nbytes: i64,
    on_done: Py<PyAny>,
    deadline: f64,
    picks: Picks,
    direct: bool, // whose candidates `picks` names: the direct router's or the main one's
    flows: Vec<(Py<Flow>, f64)>,
    pending: i64,
    host: bool,
    managed: bool,
    order: u64, // when it started (the reference's `active` is in start order)
}

/// Calls `FlowDone(plane, transfer)()` when one flow of the transfer lands.
#[pyclass(module = "gfaas_native")]
pub struct FlowDone {
    plane: Py<DataPlaneCore>,
    ident: u64,
}

#[pymethods]
impl FlowDone {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.plane)
    }

    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        DataPlaneCore::flow_done(self.plane.bind(py), self.ident)
    }
}

/// The per-transfer lifecycle of the simulated data plane (see the module docs).
#[pyclass(module = "gfaas_native")]
pub struct DataPlaneCore {
    sim: Py<PyAny>,
    kernel: Option<Py<Kernel>>,
    net: Py<FluidNetwork>,
    topology: Py<PyAny>,
    main: Side,
    direct: Side,
    names: HashMap<String, usize>,
    name_objs: Vec<Py<PyString>>,
    kinds: Vec<u8>,
    nodes: Vec<usize>,
    host_gbps: Vec<Option<f64>>,
    p2p_gbps: f64,
    pageable_gbps: f64,
    alloc: bool,
    pageable: bool,
    slo_control: bool,
    chunk: i64,
    setup_s: f64,
    pin_s_per_byte: f64,
    neumaier: bool,
    next_id: u64,
    started: u64,
    waiting: HashMap<u64, Transfer>,
    active: HashMap<u64, Transfer>,
    host_active: Vec<Vec<u64>>,
}

impl DataPlaneCore {
    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        match &self.kernel {
            Some(k) => Ok(k.borrow(py).now),
            None => self.sim.bind(py).getattr("now")?.extract(),
        }
    }

    fn schedule(&self, py: Python<'_>, delay: f64, func: Bound<'_, PyAny>, args: Bound<'_, PyTuple>) -> PyResult<()> {
        match &self.kernel {
            Some(k) => {
                k.borrow_mut(py).schedule(py, delay, func, args, 0)?;
            }
            None => {
                let mut all = vec![delay.into_pyobject(py)?.into_any(), func];
                all.extend(args.iter());
                self.sim.bind(py).getattr("schedule")?.call1(PyTuple::new(py, all)?)?;
            }
        }
        Ok(())
    }

    fn side(&mut self, direct: bool) -> &mut Side {
        if direct {
            &mut self.direct
        } else {
            &mut self.main
        }
    }

    /// The route set of a pair in one router's core, compiled by its wrapper on first use.
    fn cset(&mut self, py: Python<'_>, direct: bool, src: usize, dst: usize) -> PyResult<usize> {
        if let Some(&cs) = self.side(direct).sets.get(&(src, dst)) {
            return Ok(cs);
        }
        let (s, d) = (self.name_objs[src].clone_ref(py), self.name_objs[dst].clone_ref(py));
        let side = self.side(direct);
        let w = side.wrapper.bind(py);
        let key = PyTuple::new(py, [&s, &d])?;
        let known = w.getattr("_ncs")?.call_method1("get", (key,))?;
        let cs: usize = if known.is_none() {
            w.call_method1("_native_cset", (s, d))?.extract()?
        } else {
            known.extract()?
        };
        side.sets.insert((src, dst), cs);
        Ok(cs)
    }

    /// A candidate's network path and P2P flag, looked up once.
    fn cand(&mut self, py: Python<'_>, direct: bool, c: usize) -> PyResult<CandInfo> {
        if let Some(Some(info)) = self.side(direct).cands.get(c) {
            return Ok(*info);
        }
        let hops = self.side(direct).wrapper.bind(py).getattr("_hops")?.get_item(c)?;
        let path = FluidNetwork::path_index(self.net.bind(py), &hops)?;
        let mut kinds = Vec::new();
        for h in hops.try_iter()? {
            let h = h?;
            let name = h.cast::<PyString>()?.to_str()?.to_owned();
            match self.names.get(&name) {
                Some(&i) => kinds.push(self.kinds[i]),
                None => return Err(PyKeyError::new_err(name)),
            }
        }
        let p2p =
            kinds.first() == Some(&GPU) && kinds.last() == Some(&GPU) && kinds.contains(&PCIE) && !kinds.contains(&NIC);
        let info = CandInfo { path, p2p };
        let side = self.side(direct);
        if side.cands.len() <= c {
            side.cands.resize(c + 1, None);
        }
        side.cands[c] = Some(info);
        Ok(info)
    }

    /// `_cap`: a flow's rate cap in GB/s (P2P over PCIe, pageable host memory), or none.
    fn cap(&self, host: bool, p2p: bool) -> Option<f64> {
        let mut cap = None;
        if p2p {
            cap = Some(self.p2p_gbps);
        }
        if host && self.pageable {
            let base = match cap {
                Some(c) if c != 0.0 => c, // `cap or pageable`
                _ => self.pageable_gbps,
            };
            cap = Some(py_min(base, self.pageable_gbps));
        }
        cap
    }

    fn node(&self, t: &Transfer) -> usize {
        let end = if self.kinds[t.src] == HOST { t.src } else { t.dst };
        self.nodes[end]
    }

    /// `_launch`: split `nbytes` over the transfer's paths and start a flow on each non-empty share.
    fn launch(&mut self, slf: &Bound<'_, Self>, ident: u64, nbytes: i64) -> PyResult<()> {
        let py = slf.py();
        let (picks, direct, host) = {
            let t = &self.active[&ident];
            (t.picks.clone(), t.direct, t.host)
        };
        let gbps: Vec<f64> = picks.iter().map(|&(_, g)| g).collect();
        let shares = split(nbytes, self.chunk, &gbps, self.neumaier);
        let net = self.net.clone_ref(py);
        for (&(c, g), share) in picks.iter().zip(shares) {
            if share <= 0 {
                continue;
            }
            let info = self.cand(py, direct, c)?;
            let cap = self.cap(host, info.p2p);
            self.active.get_mut(&ident).expect("active").pending += 1;
            let done = Py::new(
                py,
                FlowDone {
                    plane: slf.clone().unbind(),
                    ident,
                },
            )?;
            let flow = FluidNetwork::start_path(
                net.bind(py),
                info.path,
                share as f64,
                done.into_bound(py).into_any(),
                cap,
            )?;
            self.active.get_mut(&ident).expect("active").flows.push((flow, g));
        }
        Ok(())
    }

    /// `_apply_changes`: transfers the router re-routed move their remaining bytes to the new paths.
    fn apply_changes(&mut self, slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let changed = self.main.core.borrow_mut(py).take_changed();
        let net = self.net.clone_ref(py);
        for (h, picks) in changed {
            let flows = match self.active.get_mut(&h) {
                Some(t) if !t.flows.is_empty() => std::mem::take(&mut t.flows),
                _ => continue,
            };
            let mut left = 0.0;
            for (flow, _) in flows {
                if !flow.borrow(py).done {
                    left += FluidNetwork::cancel(net.bind(py), flow.into_bound(py))?;
                }
            }
            let (src, dst) = {
                let t = self.active.get_mut(&h).expect("active");
                t.pending = 0;
                t.picks = picks;
                t.direct = false;
                (t.src, t.dst)
            };
            let has_paths = !self.active[&h].picks.is_empty();
            if has_paths && left > 0.0 {
                self.launch(slf, h, py_int(left)?)?;
            } else if left > 0.0 {
                // nothing left for it: fall back to its direct path
                let cs = self.cset(py, true, src, dst)?;
                let picks = {
                    let mut core = self.direct.core.borrow_mut(py);
                    let picks = core.plan(py, SCRATCH, cs)?;
                    core.release(py, SCRATCH)?;
                    picks
                };
                let t = self.active.get_mut(&h).expect("active");
                t.managed = false;
                t.picks = picks;
                t.direct = true;
                self.launch(slf, h, py_int(left)?)?;
            } else {
                // its flows had all landed: it is complete
                self.schedule(py, 0.0, slf.getattr("_finish")?, PyTuple::new(py, [h])?)?;
            }
        }
        Ok(())
    }

    /// `_rebalance_host`: SLO-aware shares of a node's host links among its host transfers.
    fn rebalance_host(&mut self, py: Python<'_>, node: usize) -> PyResult<()> {
        let host: Vec<u64> = self.host_active[node]
            .iter()
            .copied()
            .filter(|id| !self.active[id].flows.is_empty())
            .collect();
        if host.is_empty() {
            return Ok(());
        }
        let capacity = match self.host_gbps.get(node).copied().flatten() {
            Some(c) => c,
            None => return Err(PyKeyError::new_err(node)),
        };
        let now = self.now(py)?;
        let mut demands = Vec::with_capacity(host.len());
        let mut left: Vec<f64> = Vec::new(); // one buffer for every transfer's sums (and gbps below)
        for id in &host {
            let t = &self.active[id];
            left.clear();
            left.extend(
                t.flows
                    .iter()
                    .map(|(f, _)| f.borrow(py))
                    .filter(|f| !f.done)
                    .map(|f| FluidNetwork::left_at(&f, now)),
            );
            let bytes = py_int(py_sum(&left, self.neumaier))?;
            let deadline = py_max(t.deadline, now + 1e-6);
            if bytes < 0 {
                return Err(config_error(
                    py,
                    format!("Demand {id}: remaining_bytes={bytes} must be >= 0"),
                ));
            }
            if deadline.is_nan() {
                return Err(config_error(
                    py,
                    format!("Demand {id}: deadline is NaN; give an absolute time in seconds"),
                ));
            }
            demands.push((bytes, deadline));
        }
        if !(capacity > 0.0 && capacity.is_finite()) {
            return Err(config_error(
                py,
                format!(
                    "slo_rates: capacity_gbps={} must be a positive finite number (GB/s)",
                    float_repr(py, capacity)
                ),
            ));
        }
        let rates = slo_rates(&demands, capacity, now, self.neumaier);
        let mut caps: Vec<(Py<Flow>, f64)> = Vec::new();
        let mut gbps = left;
        for (id, rate) in host.iter().zip(rates) {
            let flows = &self.active[id].flows;
            gbps.clear();
            gbps.extend(flows.iter().filter(|(f, _)| !f.borrow(py).done).map(|(_, g)| *g));
            let mut total = py_sum(&gbps, self.neumaier);
            if total == 0.0 {
                total = 1.0; // `or 1.0`
            }
            for (f, g) in flows.iter().filter(|(f, _)| !f.borrow(py).done) {
                caps.push((f.clone_ref(py), py_max(rate * g / total, 1e-3)));
            }
        }
        FluidNetwork::set_caps_of(self.net.bind(py), &caps)
    }

    fn start_body(&mut self, slf: &Bound<'_, Self>, ident: u64, host: bool, node: usize) -> PyResult<()> {
        let nbytes = self.active[&ident].nbytes;
        self.launch(slf, ident, nbytes)?;
        self.apply_changes(slf)?;
        if host && self.slo_control {
            self.rebalance_host(slf.py(), node)?;
        }
        Ok(())
    }

    fn finish_body(
        &mut self,
        slf: &Bound<'_, Self>,
        ident: u64,
        managed: bool,
        host: bool,
        node: usize,
    ) -> PyResult<()> {
        let py = slf.py();
        if managed {
            self.main.core.borrow_mut(py).release(py, ident)?;
            self.apply_changes(slf)?;
        }
        if host && self.slo_control {
            self.rebalance_host(py, node)?;
        }
        Ok(())
    }

    fn flow_done(slf: &Bound<'_, Self>, ident: u64) -> PyResult<()> {
        let last = {
            let mut p = slf.borrow_mut();
            match p.active.get_mut(&ident) {
                Some(t) => {
                    t.pending -= 1;
                    t.pending == 0
                }
                None => false, // a flow of a finished transfer (the reference's count goes below 0)
            }
        };
        if last {
            Self::_finish(slf, ident)?;
        }
        Ok(())
    }
}

#[pymethods]
impl DataPlaneCore {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.sim)?;
        visit.call(&self.kernel)?;
        visit.call(&self.net)?;
        visit.call(&self.topology)?;
        for side in [&self.main, &self.direct] {
            visit.call(&side.core)?;
            visit.call(&side.wrapper)?;
        }
        for t in self.waiting.values().chain(self.active.values()) {
            visit.call(&t.on_done)?;
            for (f, _) in &t.flows {
                visit.call(f)?;
            }
        }
        Ok(())
    }

    /// Drops the transfers (what the cycle collector calls to break a cycle through them).
    fn __clear__(&mut self) {
        self.waiting.clear();
        self.active.clear();
        self.kernel = None;
    }

    /// `devices`: (name, kind, node) per device; `host_gbps`: per node, its host uplinks' GB/s.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        sim: Bound<'_, PyAny>,
        net: Bound<'_, FluidNetwork>,
        topology: Bound<'_, PyAny>,
        router: Bound<'_, PyAny>,
        direct: Bound<'_, PyAny>,
        devices: Vec<(String, String, usize)>,
        host_gbps: HashMap<usize, f64>,
        pinned: String,
        slo_control: bool,
        chunk: i64,
        setup_s: f64,
        pin_s_per_byte: f64,
    ) -> PyResult<Self> {
        let side = |w: &Bound<'_, PyAny>| -> PyResult<Side> {
            Ok(Side {
                core: w.getattr("_core")?.cast_into::<RouterCore>()?.unbind(),
                wrapper: w.clone().unbind(),
                sets: HashMap::default(),
                cands: Vec::new(),
            })
        };
        let mut names = HashMap::default();
        let mut name_objs = Vec::new();
        let mut kinds = Vec::new();
        let mut nodes = Vec::new();
        for (name, kind, node) in devices {
            names.insert(name.clone(), kinds.len());
            name_objs.push(PyString::new(py, &name).unbind());
            kinds.push(kind_code(&kind));
            nodes.push(node);
        }
        let n_nodes = nodes
            .iter()
            .copied()
            .max()
            .map_or(0, |m| m + 1)
            .max(host_gbps.keys().copied().max().map_or(0, |m| m + 1));
        let mut gbps = vec![None; n_nodes];
        for (node, g) in host_gbps {
            gbps[node] = Some(g);
        }
        let version: (u32, u32) = py
            .import("sys")?
            .getattr("version_info")?
            .extract::<(u32, u32, u32, String, u32)>()
            .map(|v| (v.0, v.1))?;
        if chunk <= 0 {
            return Err(config_error(py, format!("DataPlaneCore: chunk={chunk} must be > 0")));
        }
        Ok(DataPlaneCore {
            kernel: sim.cast::<Kernel>().ok().map(|k| k.clone().unbind()),
            sim: sim.unbind(),
            net: net.unbind(),
            p2p_gbps: topology.getattr("pcie_p2p_gbps")?.extract()?,
            pageable_gbps: topology.getattr("pageable_gbps")?.extract()?,
            topology: topology.unbind(),
            main: side(&router)?,
            direct: side(&direct)?,
            names,
            name_objs,
            kinds,
            nodes,
            host_gbps: gbps,
            alloc: pinned == "alloc",
            pageable: pinned == "pageable",
            slo_control,
            chunk,
            setup_s,
            pin_s_per_byte,
            neumaier: version >= (3, 12),
            next_id: 0,
            started: 0,
            waiting: HashMap::default(),
            active: HashMap::default(),
            host_active: vec![Vec::new(); n_nodes],
        })
    }

    /// Move `nbytes` from device `src` to `dst`; `on_done()` when the last byte lands.
    #[pyo3(name = "move", signature = (src, dst, nbytes, on_done, deadline = 0.0))]
    fn move_(
        slf: &Bound<'_, Self>,
        src: Bound<'_, PyAny>,
        dst: Bound<'_, PyAny>,
        nbytes: Bound<'_, PyAny>,
        on_done: Bound<'_, PyAny>,
        deadline: f64,
    ) -> PyResult<()> {
        let py = slf.py();
        let whole: i64 = match nbytes.extract::<i64>() {
            Ok(n) => n,
            Err(_) => py.import("builtins")?.getattr("int")?.call1((&nbytes,))?.extract()?,
        };
        let size: f64 = nbytes.extract()?;
        let mut p = slf.borrow_mut();
        p.next_id += 1;
        let ident = p.next_id;
        let same = src.eq(&dst)?;
        if same || size <= 0.0 {
            let delay = if same { p.setup_s } else { 0.0 };
            return p.schedule(py, delay, on_done, PyTuple::empty(py));
        }
        let find = |o: &Bound<'_, PyAny>| -> Option<usize> {
            o.cast::<PyString>()
                .ok()
                .and_then(|s| s.to_str().ok().and_then(|s| p.names.get(s).copied()))
        };
        let (s, d) = match (find(&src), find(&dst)) {
            (Some(s), Some(d)) => (s, d),
            _ => {
                // the ConfigError naming the device
                let topo = p.topology.clone_ref(py);
                drop(p);
                topo.bind(py).call_method1("device", (&src,))?;
                topo.bind(py).call_method1("device", (&dst,))?;
                return Err(PyKeyError::new_err("device"));
            }
        };
        let host = p.kinds[s] == HOST || p.kinds[d] == HOST;
        let mut delay = p.setup_s;
        if host && p.alloc {
            delay += size * p.pin_s_per_byte;
        }
        p.waiting.insert(
            ident,
            Transfer {
                src: s,
                dst: d,
                nbytes: whole,
                on_done: on_done.unbind(),
                deadline,
                picks: Vec::new(),
                direct: false,
                flows: Vec::new(),
                pending: 0,
                host,
                managed: false,
                order: 0,
            },
        );
        p.schedule(py, delay, slf.getattr("_start")?, PyTuple::new(py, [ident])?)
    }

    /// `_start`: plan the transfer, launch its flows, re-route others, re-share its node's host links.
    fn _start(slf: &Bound<'_, Self>, ident: u64) -> PyResult<()> {
        let py = slf.py();
        let mut p = slf.borrow_mut();
        let Some(mut t) = p.waiting.remove(&ident) else {
            return Ok(());
        };
        let cs = match p.cset(py, false, t.src, t.dst) {
            Ok(cs) => cs,
            Err(e) => {
                p.waiting.insert(ident, t);
                return Err(e);
            }
        };
        let mut picks = p.main.core.borrow_mut(py).plan(py, ident, cs)?;
        t.managed = true;
        t.direct = false;
        if picks.is_empty() {
            // Every path is reserved by others: go the direct way and share it fairly.
            p.main.core.borrow_mut(py).release(py, ident)?;
            t.managed = false;
            let cs = p.cset(py, true, t.src, t.dst)?;
            let mut core = p.direct.core.borrow_mut(py);
            picks = core.plan(py, SCRATCH, cs)?;
            core.release(py, SCRATCH)?;
            t.direct = true;
        }
        t.picks = picks;
        t.order = p.started;
        p.started += 1;
        let (host, node) = (t.host, p.node(&t));
        if host {
            p.host_active[node].push(ident);
        }
        p.active.insert(ident, t);
        let net = p.net.clone_ref(py);
        net.borrow_mut(py).begin_batch(); // one re-allocation for the launch, the re-routes and the new shares
        let body = p.start_body(slf, ident, host, node);
        drop(p);
        let committed = FluidNetwork::commit(net.bind(py));
        body.and(committed)
    }

    /// `_finish`: release the plan, re-route others onto what it frees, re-share; then `on_done()`.
    fn _finish(slf: &Bound<'_, Self>, ident: u64) -> PyResult<()> {
        let py = slf.py();
        let mut p = slf.borrow_mut();
        let Some(t) = p.active.remove(&ident) else {
            return Ok(());
        };
        let node = p.node(&t);
        if t.host {
            p.host_active[node].retain(|&x| x != ident);
        }
        let net = p.net.clone_ref(py);
        net.borrow_mut(py).begin_batch();
        let body = p.finish_body(slf, ident, t.managed, t.host, node);
        drop(p);
        let committed = FluidNetwork::commit(net.bind(py));
        body.and(committed)?;
        // Drop the flows (and their callbacks, which hold this plane) before the caller's callback.
        let on_done = t.on_done;
        drop(t.flows);
        on_done.bind(py).call0()?;
        Ok(())
    }

    /// The started, unfinished transfers by id, in start order: (src, dst, nbytes, host, managed).
    #[getter]
    fn active<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut ids: Vec<(&u64, &Transfer)> = self.active.iter().collect();
        ids.sort_by_key(|(_, t)| t.order);
        let d = PyDict::new(py);
        for (id, t) in ids {
            let flows = PyList::new(py, t.flows.iter().map(|(f, _)| f.clone_ref(py)))?;
            let v = (
                self.name_objs[t.src].clone_ref(py),
                self.name_objs[t.dst].clone_ref(py),
                t.nbytes,
                t.host,
                t.managed,
                flows,
            );
            d.set_item(*id, v)?;
        }
        Ok(d)
    }
}
