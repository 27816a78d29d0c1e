//! The simulator's discrete-event kernel: `gfaas.sim.kernel.PySimulator`'s contract. Callbacks on a
//! binary heap ordered by `(time, priority, seq)`, lazy cancellation, and `at_many` streams that enter
//! the heap one event at a time with the sequence numbers they were given at submission. Callbacks are
//! Python callables; the kernel never holds a borrow of itself while one runs, so a callback may
//! schedule, cancel or peek (but not `run`, as in the reference).

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::{callable_name, config_error, float_repr};

/// Allocations between generation-0 collections while a run is in progress (the reference's
/// `_GC_GEN0`: a run makes millions of short-lived objects; see gfaas.sim.kernel).
const GC_GEN0: i64 = 100_000;

/// One scheduled callback, as `Kernel.schedule` and `Kernel.at` return it (for `cancel`).
#[pyclass(module = "gfaas_native")]
pub struct Event {
    #[pyo3(get)]
    time: f64,
    #[pyo3(get, name = "fn")]
    func: Py<PyAny>,
    #[pyo3(get)]
    args: Py<PyTuple>,
    #[pyo3(get)]
    cancelled: bool,
    #[pyo3(get)]
    done: bool,
}

#[pymethods]
impl Event {
    // A callback usually refers back to the model, and the model to the kernel that holds this event:
    // the cycle collector must see these references (docs/design/native-core.md).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.func)?;
        visit.call(&self.args)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let state = if self.cancelled {
            "cancelled"
        } else if self.done {
            "done"
        } else {
            "pending"
        };
        format!(
            "Event(t={}, fn={}, {})",
            float_repr(py, self.time),
            callable_name(self.func.bind(py)),
            state
        )
    }
}

enum Item {
    Ev(Py<Event>),
    Stream(usize),
}

struct Entry {
    t: f64,
    priority: i64,
    seq: u64,
    item: Item,
}

// BinaryHeap is a max-heap: the order is reversed so that the least (time, priority, seq) is on top.
// Times are finite (checked on the way in), so partial_cmp never fails; like Python's tuple
// comparison it takes -0.0 and 0.0 as equal.
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .t
            .partial_cmp(&self.t)
            .unwrap_or(Ordering::Equal)
            .then(other.priority.cmp(&self.priority))
            .then(other.seq.cmp(&self.seq))
    }
}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for Entry {}

/// The not-yet-pushed events of one `at_many` call; its next one sits in the heap.
struct Stream {
    times: Vec<f64>,
    seqs: Option<Vec<u64>>,
    base: u64,
    func: Py<PyAny>,
    args: Py<PyTuple>,
    priority: i64,
    i: usize,
}

impl Stream {
    fn entry(&self, idx: usize) -> Entry {
        let i = self.i;
        let seq = match &self.seqs {
            Some(s) => s[i],
            None => self.base + i as u64,
        };
        Entry {
            t: self.times[i],
            priority: self.priority,
            seq,
            item: Item::Stream(idx),
        }
    }
}

/// The event queue and simulated time: `gfaas.sim.kernel.PySimulator`'s contract, natively.
#[pyclass(module = "gfaas_native", subclass)]
pub struct Kernel {
    pub(crate) now: f64,
    heap: BinaryHeap<Entry>,
    seq: u64,
    ncancelled: u64,
    dropped: u64,
    unpushed: u64,
    running: bool,
    streams: Vec<Option<Stream>>,
    free_streams: Vec<usize>,
}

impl Kernel {
    /// `t` must be finite and not before now (false for NaN too), as `at` and `at_many` require.
    fn check_time(&self, py: Python<'_>, func: &Bound<'_, PyAny>, t: f64) -> PyResult<()> {
        if self.now <= t && t < f64::INFINITY {
            return Ok(());
        }
        Err(config_error(
            py,
            format!(
                "cannot schedule {} at time {} s: it must be finite and not before now ({} s); use a later time or \
                 schedule(delay, ...)",
                callable_name(func),
                float_repr(py, t),
                float_repr(py, self.now)
            ),
        ))
    }

    /// Pop the next live event due at or before `limit` and make it current: its callback and
    /// arguments, or None when nothing is due (time is then left alone).
    fn next_due(&mut self, py: Python<'_>, limit: f64) -> Option<(Py<PyAny>, Py<PyTuple>)> {
        loop {
            let top = self.heap.peek()?;
            if top.t > limit {
                return None;
            }
            let entry = self.heap.pop()?;
            match entry.item {
                Item::Ev(ev) => {
                    let mut e = ev.borrow_mut(py);
                    if e.cancelled {
                        self.ncancelled -= 1;
                        self.dropped += 1;
                        continue;
                    }
                    self.now = entry.t;
                    e.done = true;
                    return Some((e.func.clone_ref(py), e.args.clone_ref(py)));
                }
                Item::Stream(idx) => {
                    self.now = entry.t;
                    let stream = self.streams[idx].as_mut().expect("a stream in the heap is live");
                    stream.i += 1;
                    let out = (stream.func.clone_ref(py), stream.args.clone_ref(py));
                    // The next one enters before the callback runs, so that an exception leaves the
                    // stream consistent (as in the reference).
                    if stream.i < stream.times.len() {
                        let next = stream.entry(idx);
                        self.unpushed -= 1;
                        self.heap.push(next);
                    } else {
                        self.streams[idx] = None;
                        self.free_streams.push(idx);
                    }
                    return Some(out);
                }
            }
        }
    }

    fn push_event(
        &mut self,
        py: Python<'_>,
        t: f64,
        func: Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        priority: i64,
    ) -> PyResult<Py<Event>> {
        let seq = self.seq;
        self.seq = seq + 1;
        let ev = Py::new(
            py,
            Event {
                time: t,
                func: func.unbind(),
                args: args.unbind(),
                cancelled: false,
                done: false,
            },
        )?;
        self.heap.push(Entry {
            t,
            priority,
            seq,
            item: Item::Ev(ev.clone_ref(py)),
        });
        Ok(ev)
    }
}

fn run_due(slf: &Bound<'_, Kernel>, limit: f64) -> PyResult<()> {
    let py = slf.py();
    loop {
        let due = slf.borrow_mut().next_due(py, limit);
        match due {
            None => return Ok(()),
            Some((func, args)) => {
                func.bind(py).call1(args.bind(py))?;
            }
        }
    }
}

#[pymethods]
impl Kernel {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for entry in self.heap.iter() {
            if let Item::Ev(ev) = &entry.item {
                visit.call(ev)?;
            }
        }
        for stream in self.streams.iter().flatten() {
            visit.call(&stream.func)?;
            visit.call(&stream.args)?;
        }
        Ok(())
    }

    /// Drops the pending events (what the cycle collector calls to break a cycle through them).
    fn __clear__(&mut self) {
        self.heap.clear();
        self.streams.clear();
        self.free_streams.clear();
    }

    #[new]
    #[pyo3(signature = (start = 0.0))]
    fn new(py: Python<'_>, start: f64) -> PyResult<Self> {
        if !start.is_finite() {
            return Err(config_error(
                py,
                format!(
                    "simulation start time {} is not finite; pass a finite number of seconds",
                    float_repr(py, start)
                ),
            ));
        }
        Ok(Kernel {
            now: start,
            heap: BinaryHeap::new(),
            seq: 0,
            ncancelled: 0,
            dropped: 0,
            unpushed: 0,
            running: false,
            streams: Vec::new(),
            free_streams: Vec::new(),
        })
    }

    /// Current simulated time in seconds.
    #[getter]
    fn now(&self) -> f64 {
        self.now
    }

    /// Run `fn(*args)` at `now + delay`; `delay` must be a finite number >= 0.
    #[pyo3(signature = (delay, func, *args, priority = 0))]
    pub(crate) fn schedule(
        &mut self,
        py: Python<'_>,
        delay: f64,
        func: Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        priority: i64,
    ) -> PyResult<Py<Event>> {
        // Also false for NaN, which a plain `delay < 0` would let through.
        if !(0.0..f64::INFINITY).contains(&delay) {
            return Err(config_error(
                py,
                format!(
                    "cannot schedule {} with delay {} s; the delay must be a finite number >= 0",
                    callable_name(&func),
                    float_repr(py, delay)
                ),
            ));
        }
        let t = self.now + delay;
        self.push_event(py, t, func, args, priority)
    }

    /// Run `fn(*args)` at absolute time `time`, which must not be earlier than `now`.
    #[pyo3(signature = (time, func, *args, priority = 0))]
    pub(crate) fn at(
        &mut self,
        py: Python<'_>,
        time: f64,
        func: Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        priority: i64,
    ) -> PyResult<Py<Event>> {
        self.check_time(py, &func, time)?;
        self.push_event(py, time, func, args, priority)
    }

    /// `at(t, fn, *args, priority=priority)` for every `t` in `times`, in that order, with the
    /// sequence numbers those calls would give; they enter the heap one at a time and cannot be
    /// cancelled.
    #[pyo3(signature = (times, func, *args, priority = 0))]
    fn at_many(
        &mut self,
        py: Python<'_>,
        times: Bound<'_, PyAny>,
        func: Bound<'_, PyAny>,
        args: Bound<'_, PyTuple>,
        priority: i64,
    ) -> PyResult<()> {
        // A numpy array: its floats without iterating numpy scalars.
        let src = match times.getattr("tolist") {
            Ok(tolist) if tolist.is_callable() => tolist.call0()?,
            _ => times,
        };
        let mut ts: Vec<f64> = Vec::new();
        for item in src.try_iter()? {
            ts.push(item?.extract::<f64>()?);
        }
        if ts.is_empty() {
            return Ok(());
        }
        for &t in &ts {
            self.check_time(py, &func, t)?;
        }
        let n = ts.len();
        let base = self.seq;
        self.seq = base + n as u64;
        let mut seqs = None;
        if ts.windows(2).any(|w| w[0] > w[1]) {
            let mut order: Vec<usize> = (0..n).collect();
            // Stable: equal times keep their submission order.
            order.sort_by(|&a, &b| ts[a].partial_cmp(&ts[b]).unwrap_or(Ordering::Equal));
            ts = order.iter().map(|&i| ts[i]).collect();
            seqs = Some(order.iter().map(|&i| base + i as u64).collect());
        }
        let stream = Stream {
            times: ts,
            seqs,
            base,
            func: func.unbind(),
            args: args.unbind(),
            priority,
            i: 0,
        };
        let idx = match self.free_streams.pop() {
            Some(i) => i,
            None => {
                self.streams.push(None);
                self.streams.len() - 1
            }
        };
        let first = stream.entry(idx);
        self.streams[idx] = Some(stream);
        self.unpushed += n as u64 - 1;
        self.heap.push(first);
        Ok(())
    }

    /// Stop `ev` from running; a no-op if it already ran or was already cancelled.
    pub(crate) fn cancel(&mut self, ev: &Bound<'_, Event>) {
        let mut e = ev.borrow_mut();
        if e.cancelled || e.done {
            return;
        }
        e.cancelled = true;
        self.ncancelled += 1;
    }

    /// Time of the next event that will run, or `math.inf` if none is pending.
    fn peek(&mut self, py: Python<'_>) -> f64 {
        while let Some(top) = self.heap.peek() {
            let cancelled = match &top.item {
                Item::Ev(ev) => ev.borrow(py).cancelled,
                Item::Stream(_) => false,
            };
            if !cancelled {
                return top.t;
            }
            self.heap.pop();
            self.ncancelled -= 1;
            self.dropped += 1;
        }
        f64::INFINITY
    }

    /// Events executed so far (cancelled ones excluded), including one whose callback is running.
    #[getter]
    fn events_run(&self) -> u64 {
        self.seq - self.heap.len() as u64 - self.dropped - self.unpushed
    }

    /// Number of scheduled events that have neither run nor been cancelled.
    #[getter]
    fn pending(&self) -> u64 {
        self.heap.len() as u64 - self.ncancelled + self.unpushed
    }

    /// Entries in the heap now, cancelled ones not yet dropped included.
    #[getter]
    fn heap_size(&self) -> usize {
        self.heap.len()
    }

    /// Run the next live event; False (and time left alone) if there is none.
    fn step(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let py = slf.py();
        let due = slf.borrow_mut().next_due(py, f64::INFINITY);
        match due {
            None => Ok(false),
            Some((func, args)) => {
                func.bind(py).call1(args.bind(py))?;
                Ok(true)
            }
        }
    }

    /// Run events in order until none is left, or until the next one is later than `until`
    /// (events at exactly `until` run; then `now == until`). Returns `now`. A callback's exception
    /// propagates with `now` at its event's time and the rest still queued.
    #[pyo3(signature = (until = None))]
    fn run(slf: &Bound<'_, Self>, until: Option<f64>) -> PyResult<f64> {
        let py = slf.py();
        let limit = {
            let k = slf.borrow();
            if k.running {
                return Err(config_error(
                    py,
                    "Simulator.run() was called from inside an event callback; schedule \
                                             the work as an event instead of running the simulator re-entrantly"
                        .into(),
                ));
            }
            match until {
                None => f64::INFINITY,
                Some(u) => {
                    #[allow(clippy::neg_cmp_op_on_partial_ord)] // also true for NaN, which is refused
                    if !(u >= k.now) {
                        return Err(config_error(
                            py,
                            format!(
                                "cannot run until {} s: it is before now ({} s); pass a time >= now",
                                float_repr(py, u),
                                float_repr(py, k.now)
                            ),
                        ));
                    }
                    u
                }
            }
        };
        // As the reference: collect less often while running, restore the caller's thresholds after.
        let gc = py.import("gc")?;
        let thresholds = gc.call_method0("get_threshold")?;
        let t0: i64 = thresholds.get_item(0)?.extract()?;
        gc.call_method1(
            "set_threshold",
            (t0.max(GC_GEN0), thresholds.get_item(1)?, thresholds.get_item(2)?),
        )?;
        slf.borrow_mut().running = true;
        let result = run_due(slf, limit);
        slf.borrow_mut().running = false;
        gc.getattr("set_threshold")?.call1(thresholds.cast::<PyTuple>()?)?;
        result?;
        let mut k = slf.borrow_mut();
        if until.is_some() {
            k.now = limit;
        }
        Ok(k.now)
    }
}
