//! The contention-aware router's bookkeeping and planning phases: `gfaas.policy.routing.Router`'s
//! `plan`, `plan_many` and `release`, natively.
//!
//! Route sets stay Python's (maximum flows, twins of identical nodes); they arrive here compiled, as
//! candidates of integer edge indices (`add_cset`). Transfers are integer handles the Python wrapper
//! (`gfaas.policy.routing.NativeRouter`) maps to its transfer keys and `Plan` objects. Every float is
//! computed by the same operations in the same order as the reference, and every "first of equal
//! values" choice is the reference's, so plans agree bit for bit (tests/unit/test_policy_routing_native.py).

use crate::{HashMap, HashSet};
use pyo3::prelude::*;

use crate::config_error;
use crate::py_min;

/// Residual at or below this (GB/s) counts as none (the reference's `EPS`).
const EPS: f64 = 1e-9;

/// A bit per edge (the reference's integer masks for the saturated and the used edges).
#[derive(Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    #[inline]
    fn get(&self, e: usize) -> bool {
        self.0[e >> 6] >> (e & 63) & 1 == 1
    }
    #[inline]
    fn set(&mut self, e: usize) {
        self.0[e >> 6] |= 1 << (e & 63);
    }
    #[inline]
    fn clear(&mut self, e: usize) {
        self.0[e >> 6] &= !(1 << (e & 63));
    }
    fn any(&self, edges: &[usize]) -> bool {
        edges.iter().any(|&e| self.get(e))
    }
    /// `(bits & mask) == mask` for the mask of `edges` (true for no edges, as in the reference).
    fn all(&self, edges: &[usize]) -> bool {
        edges.iter().all(|&e| self.get(e))
    }
}

struct Cand {
    edges: Vec<usize>,
    group: i64, // -1: none
    cap: f64,
    direct: bool,
    share: f64,
    rank: usize,
    detour: bool,
}

struct Idle {
    res: Vec<(usize, f64)>,
    sat: Vec<usize>,
    used: Vec<usize>,
    cnt: Vec<(usize, i64, i64)>,
    held: Vec<(usize, f64)>,
}

struct CSet {
    cands: std::ops::Range<usize>, // its candidates' ids (added together, in rank order)
    direct: Vec<usize>,
    flow: Vec<usize>,
    tiers: Vec<Vec<usize>>,
    grouped: Vec<bool>,
    fallback: Vec<usize>,
    fair: bool,
    balance: bool,
    busy: Vec<usize>,
    load: bool,
    load_tiers: Vec<Vec<usize>>,
    load_grouped: Vec<bool>,
    load_busy: Vec<usize>,
    load_mask: HashSet<usize>,
    stop_out: Vec<usize>,
    stop_in: Vec<usize>,
    allmask: Vec<usize>,
    idle: Option<Idle>,
}

struct Held {
    handle: u64,
    cs: usize,
    res: Vec<(usize, f64)>, // candidate -> rate, in the order taken (the reference's dict)
}

impl Held {
    fn total(&self) -> f64 {
        self.res.iter().fold(0.0, |s, &(_, g)| s + g)
    }
    fn rate(&self, c: usize) -> Option<f64> {
        self.res.iter().find(|&&(d, _)| d == c).map(|&(_, g)| g)
    }
}

/// An insertion-ordered set of handles (the reference's `dict[transfer, None]`).
#[derive(Default)]
struct Ordered {
    order: Vec<u64>,
    set: HashSet<u64>,
}

impl Ordered {
    fn insert(&mut self, h: u64) {
        if self.set.insert(h) {
            self.order.push(h);
        }
    }
    fn remove(&mut self, h: u64) {
        if self.set.remove(&h) {
            self.order.retain(|&x| x != h);
        }
    }
    fn take(&mut self) -> Vec<u64> {
        self.set.clear();
        std::mem::take(&mut self.order)
    }
}

pub(crate) type Picks = Vec<(usize, f64)>;

fn min_res(c: &Cand, res: &[f64]) -> f64 {
    let mut b = res[c.edges[0]];
    for &e in &c.edges[1..] {
        b = py_min(b, res[e]);
    }
    b
}

fn lower(c: &Cand, b: f64, res: &mut [f64], sat: &mut Bits) {
    for &e in &c.edges {
        let r = res[e] - b;
        if r <= EPS {
            res[e] = 0.0;
            sat.set(e);
        } else {
            res[e] = r;
        }
    }
}

/// Free paths, tier by tier, widest live bottleneck first, lowering `res` as it goes (the
/// reference's `_select`, on the live residuals or on a scratch copy for a dry run).
fn select(cands: &[Cand], cs: &CSet, held: &[(usize, f64)], res: &mut [f64], sat: &mut Bits, loaded: bool) -> Picks {
    let (so, si) = (&cs.stop_out, &cs.stop_in);
    let stopped = |sat: &Bits| !so.is_empty() && (sat.all(so) || sat.all(si));
    let mut picks: Picks = Vec::new();
    let empty: Vec<usize> = Vec::new();
    let (flow, tiers, grouped) = if loaded && cs.load {
        (&empty, &cs.load_tiers, &cs.load_grouped)
    } else {
        (&cs.flow, &cs.tiers, &cs.grouped)
    };
    for &ci in flow {
        let c = &cands[ci];
        if sat.any(&c.edges) {
            continue;
        }
        let mut b = min_res(c, res);
        if c.share < b {
            b = c.share;
        }
        if b <= EPS {
            continue;
        }
        lower(c, b, res, sat);
        picks.push((ci, b));
        if stopped(sat) {
            return picks;
        }
    }
    let in_held = |ci: usize| held.iter().any(|&(d, _)| d == ci);
    for (tier, &is_grouped) in tiers.iter().zip(grouped.iter()) {
        if stopped(sat) {
            break;
        }
        let mut groups: Option<HashSet<i64>> = None;
        if is_grouped {
            let mut g: HashSet<i64> = held.iter().map(|&(d, _)| cands[d].group).collect();
            g.extend(picks.iter().map(|&(d, _)| cands[d].group));
            g.remove(&-1);
            groups = Some(g);
        }
        let blocked = |groups: &Option<HashSet<i64>>, ci: usize| match groups {
            Some(g) => g.contains(&cands[ci].group) && !in_held(ci),
            None => false,
        };
        let mut work: Vec<(f64, usize, usize)> = Vec::new();
        for &ci in tier {
            let c = &cands[ci];
            if sat.any(&c.edges) || blocked(&groups, ci) {
                continue;
            }
            let b = min_res(c, res);
            work.push((-(if c.cap < b { c.cap } else { b }), c.rank, ci));
        }
        if work.len() > 1 {
            work.sort_by(|x, y| x.0.partial_cmp(&y.0).unwrap().then(x.1.cmp(&y.1)));
        }
        let mut dirty: Vec<usize> = Vec::new(); // edges lowered since `work` was ranked
        while !work.is_empty() {
            let (nb, rank, ci) = work.remove(0);
            if blocked(&groups, ci) {
                continue;
            }
            let c = &cands[ci];
            let b;
            if c.edges.iter().any(|e| dirty.contains(e)) {
                if sat.any(&c.edges) {
                    continue;
                }
                let mut bb = min_res(c, res);
                if c.cap < bb {
                    bb = c.cap;
                }
                if let Some(&(tnb, trank, _)) = work.first() {
                    if bb < -tnb || (bb == -tnb && rank > trank) {
                        // another route is now wider: back in its place (bisect.insort)
                        let key = (-bb, rank);
                        let pos = work
                            .iter()
                            .position(|&(x, r, _)| x > key.0 || (x == key.0 && r > key.1))
                            .unwrap_or(work.len());
                        work.insert(pos, (key.0, rank, ci));
                        continue;
                    }
                }
                b = bb;
            } else {
                b = -nb;
            }
            lower(c, b, res, sat);
            dirty.extend_from_slice(&c.edges);
            picks.push((ci, b));
            if let Some(g) = groups.as_mut() {
                if c.group != -1 {
                    g.insert(c.group);
                }
            }
        }
    }
    picks
}

/// The router's state: residuals, saturated and used edges, holdings per edge, held transfers.
#[pyclass(module = "gfaas_native")]
pub struct RouterCore {
    cap: Vec<f64>,
    res: Vec<f64>,
    sat: Bits,
    used: Bits,
    cnt: Vec<i64>,
    icnt: Vec<i64>,
    cands: Vec<Cand>,
    csets: Vec<CSet>,
    renamings: Vec<HashMap<usize, usize>>, // edge id -> edge id, see copy_cset
    held: Vec<Option<Held>>,               // in the order registered (the reference's dict), with holes
    pos: HashMap<u64, usize>,
    live: usize,
    changed: Ordered,
    stale: Ordered,
    reroute: bool,
    multipath: bool,
}

impl RouterCore {
    fn h(&self, i: usize) -> &Held {
        self.held[i].as_ref().expect("a live holding")
    }
    fn hm(&mut self, i: usize) -> &mut Held {
        self.held[i].as_mut().expect("a live holding")
    }

    fn bn(&self, ci: usize) -> f64 {
        let c = &self.cands[ci];
        let b = min_res(c, &self.res);
        if c.cap < b {
            c.cap
        } else {
            b
        }
    }

    fn register(&mut self, handle: u64, cs: usize) -> usize {
        let i = self.held.len();
        self.held.push(Some(Held {
            handle,
            cs,
            res: Vec::new(),
        }));
        self.pos.insert(handle, i);
        self.live += 1;
        i
    }

    fn others(&self, hi: usize) -> Vec<usize> {
        (0..self.held.len())
            .filter(|&i| i != hi && self.held[i].is_some())
            .collect()
    }

    fn account(&mut self, hi: usize, ci: usize, g: f64) {
        if let Some(entry) = self.hm(hi).res.iter_mut().find(|(d, _)| *d == ci) {
            entry.1 += g;
            return;
        }
        let direct = self.cands[ci].direct;
        for k in 0..self.cands[ci].edges.len() {
            let e = self.cands[ci].edges[k];
            self.cnt[e] += 1;
            if !direct {
                self.icnt[e] += 1;
            }
            self.used.set(e);
        }
        self.hm(hi).res.push((ci, g));
    }

    fn reserve(&mut self, hi: usize, ci: usize, g: f64) {
        lower(&self.cands[ci], g, &mut self.res, &mut self.sat);
        self.account(hi, ci, g);
    }

    /// Give back `g` of the holding's rate on `ci` (all of it when None or when little is left).
    fn drop_rate(&mut self, hi: usize, ci: usize, g: Option<f64>) {
        let have = self.h(hi).rate(ci).expect("a held candidate");
        let whole = match g {
            None => true,
            Some(x) => have - x <= EPS,
        };
        let amount = match g {
            Some(x) if !whole => x,
            _ => have,
        };
        let direct = self.cands[ci].direct;
        for k in 0..self.cands[ci].edges.len() {
            let e = self.cands[ci].edges[k];
            if whole {
                self.cnt[e] -= 1;
                if !direct {
                    self.icnt[e] -= 1;
                }
            }
            if self.cnt[e] == 0 {
                self.res[e] = self.cap[e];
                self.used.clear(e);
            } else {
                let r = self.res[e] + amount;
                self.res[e] = if r < self.cap[e] { r } else { self.cap[e] };
            }
        }
        for k in 0..self.cands[ci].edges.len() {
            let e = self.cands[ci].edges[k];
            self.sat.clear(e);
        }
        let held = self.hm(hi);
        let p = held.res.iter().position(|&(d, _)| d == ci).expect("a held candidate");
        if whole {
            held.res.remove(p);
        } else {
            held.res[p].1 = have - amount;
        }
    }

    fn mark(&mut self, hi: usize) {
        let handle = self.h(hi).handle;
        self.stale.insert(handle);
        self.changed.insert(handle);
    }

    fn stopped(&self, cs: usize) -> bool {
        let c = &self.csets[cs];
        !c.stop_out.is_empty() && (self.sat.all(&c.stop_out) || self.sat.all(&c.stop_in))
    }

    fn phase_direct(&mut self, hi: usize) {
        let cs = self.h(hi).cs;
        let direct = self.csets[cs].direct.clone();
        let mut victims: Vec<usize> = Vec::new();
        if self.reroute {
            for &ci in &direct {
                if self.cands[ci].edges.iter().any(|&e| self.icnt[e] != 0) {
                    for v in self.evict(hi, ci) {
                        if !victims.contains(&v) {
                            victims.push(v);
                        }
                    }
                }
            }
        }
        if self.csets[cs].fair {
            let busy = self.csets[cs].busy.clone();
            self.take_fair(hi, &busy);
        } else if direct.len() == 1 {
            let ci = direct[0];
            if !self.sat.any(&self.cands[ci].edges) {
                let b = self.bn(ci);
                self.reserve(hi, ci, b);
            }
        } else if !direct.is_empty() {
            let mut best = direct[0];
            for &ci in &direct[1..] {
                let (b, bb) = (self.bn(ci), self.bn(best));
                if b > bb || (b == bb && self.cands[ci].rank < self.cands[best].rank) {
                    best = ci;
                }
            }
            let b = self.bn(best);
            if b > EPS {
                self.reserve(hi, best, b);
            }
            if self.multipath {
                for &ci in &direct {
                    if ci != best {
                        let b = self.bn(ci);
                        if b > EPS {
                            self.reserve(hi, ci, b);
                        }
                    }
                }
            }
        }
        for v in victims {
            self.fill(v);
            self.mark(v);
        }
    }

    fn phase_rest(&mut self, hi: usize) {
        let cs = self.h(hi).cs;
        let (fair, has_rest, balance) = {
            let c = &self.csets[cs];
            (c.fair, !c.flow.is_empty() || !c.tiers.is_empty(), c.balance)
        };
        if !fair && has_rest {
            self.fill(hi);
            if balance && self.live > 1 && !self.stopped(cs) {
                self.balance(hi);
            }
        }
        if self.h(hi).res.is_empty() {
            let fallback = self.csets[cs].fallback.clone();
            for ci in fallback {
                let b = self.bn(ci);
                if b > EPS {
                    self.reserve(hi, ci, b);
                    break;
                }
            }
        }
    }

    /// Other transfers give up their idle-flow detours that cross the routes `hi` takes under load.
    fn yield_detours(&mut self, hi: usize) -> Vec<usize> {
        let cs = self.h(hi).cs;
        let mine = self.csets[cs].load_mask.clone();
        self.give_up(hi, |c| c.detour && c.edges.iter().any(|e| mine.contains(e)))
    }

    /// Take every other transfer's indirect path off the edges of `hi`'s direct route `ci`.
    fn evict(&mut self, hi: usize, ci: usize) -> Vec<usize> {
        let mine = self.cands[ci].edges.clone();
        self.give_up(hi, |c| !c.direct && c.edges.iter().any(|e| mine.contains(e)))
    }

    /// Every other transfer drops its paths that `hit` picks; the transfers that dropped any.
    fn give_up(&mut self, hi: usize, hit: impl Fn(&Cand) -> bool) -> Vec<usize> {
        let mut out = Vec::new();
        for v in self.others(hi) {
            let gone: Vec<usize> = self
                .h(v)
                .res
                .iter()
                .map(|&(d, _)| d)
                .filter(|&d| hit(&self.cands[d]))
                .collect();
            for &d in &gone {
                self.drop_rate(v, d, None);
            }
            if !gone.is_empty() {
                out.push(v);
            }
        }
        out
    }

    fn fill(&mut self, hi: usize) {
        let cs = self.h(hi).cs;
        let own: Vec<usize> = self
            .h(hi)
            .res
            .iter()
            .flat_map(|&(d, _)| self.cands[d].edges.iter().copied())
            .collect();
        let loaded = self.csets[cs]
            .allmask
            .iter()
            .any(|&e| self.used.get(e) && !own.contains(&e));
        let held = self.h(hi).res.clone();
        let picks = select(
            &self.cands,
            &self.csets[cs],
            &held,
            &mut self.res,
            &mut self.sat,
            loaded,
        );
        for (ci, g) in picks {
            self.account(hi, ci, g);
        }
    }

    /// Reserve all of `cands` at once, max-min fair over the residuals (progressive filling).
    fn take_fair(&mut self, hi: usize, cands: &[usize]) {
        let mut left: Vec<(usize, f64)> = Vec::new();
        for &ci in cands {
            for &e in &self.cands[ci].edges {
                if !left.iter().any(|&(x, _)| x == e) {
                    left.push((e, self.res[e]));
                }
            }
        }
        let li = |left: &Vec<(usize, f64)>, e: usize| left.iter().position(|&(x, _)| x == e).expect("an edge");
        let mut rate: Vec<f64> = vec![0.0; cands.len()];
        let mut live: Vec<usize> = (0..cands.len())
            .filter(|&k| !self.sat.any(&self.cands[cands[k]].edges))
            .collect();
        while !live.is_empty() {
            let mut users: Vec<(usize, usize)> = Vec::new();
            for &k in &live {
                for &e in &self.cands[cands[k]].edges {
                    match users.iter_mut().find(|(x, _)| *x == e) {
                        Some(u) => u.1 += 1,
                        None => users.push((e, 1)),
                    }
                }
            }
            let mut inc = f64::INFINITY;
            for (j, &(e, n)) in users.iter().enumerate() {
                let v = left[li(&left, e)].1 / n as f64;
                inc = if j == 0 { v } else { py_min(inc, v) };
            }
            for &k in &live {
                inc = py_min(inc, self.cands[cands[k]].cap - rate[k]);
            }
            for &k in &live {
                rate[k] += inc;
                for &e in &self.cands[cands[k]].edges {
                    let p = li(&left, e);
                    left[p].1 -= inc;
                }
            }
            live.retain(|&k| {
                let c = &self.cands[cands[k]];
                c.cap - rate[k] > EPS && c.edges.iter().all(|&e| left[li(&left, e)].1 > EPS)
            });
        }
        for (k, &ci) in cands.iter().enumerate() {
            let g = py_min(rate[k], self.bn(ci)); // guard float drift: never beyond the live residual
            if g > EPS {
                self.reserve(hi, ci, g);
            }
        }
    }

    /// Every other transfer with the edges its indirect and its direct paths cross.
    fn owners(&self, hi: usize) -> Vec<(usize, HashSet<usize>, HashSet<usize>)> {
        let mut out = Vec::new();
        for v in self.others(hi) {
            let (mut ind, mut dirm) = (HashSet::default(), HashSet::default());
            for &(d, _) in &self.h(v).res {
                let c = &self.cands[d];
                if c.direct {
                    dirm.extend(c.edges.iter().copied());
                } else {
                    ind.extend(c.edges.iter().copied());
                }
            }
            out.push((v, ind, dirm));
        }
        out
    }

    /// Busy-path balancing (the reference's `_balance`, seed 001 Algorithm 1 lines 8-14).
    fn balance(&mut self, hi: usize) {
        let cs = self.h(hi).cs;
        let mut owners = self.owners(hi);
        let union = |owners: &Vec<(usize, HashSet<usize>, HashSet<usize>)>| {
            let mut o: HashSet<usize> = HashSet::default();
            for (_, ind, dirm) in owners {
                o.extend(ind.iter().copied());
                o.extend(dirm.iter().copied());
            }
            o
        };
        let mut others = union(&owners);
        let mut mine = self.h(hi).total();
        let load_busy = self.csets[cs].load_busy.clone();
        for ci in load_busy {
            let satc: Vec<usize> = self.cands[ci]
                .edges
                .iter()
                .copied()
                .filter(|&e| self.sat.get(e))
                .collect();
            if satc.is_empty() || satc.iter().any(|e| !others.contains(e)) || self.h(hi).rate(ci).is_some() {
                continue; // free, or some saturated edge is held by hi alone: nobody to balance with
            }
            let mut victim: Option<usize> = None;
            for (v, ind, dirm) in &owners {
                if satc.iter().any(|e| ind.contains(e) || dirm.contains(e)) {
                    if victim.is_some() || satc.iter().any(|e| dirm.contains(e)) {
                        victim = None;
                        break;
                    }
                    victim = Some(*v);
                }
            }
            let v = match victim {
                Some(v) if self.h(v).total() > mine + EPS => v,
                _ => continue,
            };
            let blocking: Vec<usize> = self
                .h(v)
                .res
                .iter()
                .map(|&(d, _)| d)
                .filter(|&d| self.cands[d].edges.iter().any(|e| satc.contains(e)))
                .collect();
            if self.compensate(hi, ci, v, &blocking) || self.share(hi, ci, v, &blocking, &satc) {
                if self.stopped(cs) {
                    return;
                }
                owners = self.owners(hi);
                others = union(&owners);
                mine = self.h(hi).total();
            }
        }
    }

    /// Dry-run V giving up `blocking` and re-planning; commit only if V loses nothing.
    fn compensate(&mut self, hi: usize, ci: usize, v: usize, blocking: &[usize]) -> bool {
        let mut scratch = self.res.clone();
        let mut sat = self.sat.clone();
        let mut lost = 0.0;
        let mut touched: Vec<usize> = self.cands[ci].edges.clone();
        for &d in blocking {
            let g = self.h(v).rate(d).expect("a blocking path");
            lost += g;
            for &e in &self.cands[d].edges {
                touched.push(e);
                let r = scratch[e] + g;
                scratch[e] = if r < self.cap[e] { r } else { self.cap[e] };
            }
        }
        for &e in &touched {
            sat.clear(e);
        }
        let c = &self.cands[ci];
        let mut b = min_res(c, &scratch);
        if c.cap < b {
            b = c.cap;
        }
        if b <= EPS {
            return false;
        }
        lower(c, b, &mut scratch, &mut sat);
        // Cheap bound first: V cannot win back more than its unsaturated routes' bottlenecks.
        let vcs = self.h(v).cs;
        let mut bound = 0.0;
        for &d in &self.csets[vcs].load_busy {
            if !sat.any(&self.cands[d].edges) {
                bound += min_res(&self.cands[d], &scratch);
            }
        }
        if bound < lost - EPS {
            return false;
        }
        let rest: Vec<(usize, f64)> = self
            .h(v)
            .res
            .iter()
            .copied()
            .filter(|(d, _)| !blocking.contains(d))
            .collect();
        let picks = select(&self.cands, &self.csets[vcs], &rest, &mut scratch, &mut sat, true);
        if picks.iter().fold(0.0, |s, &(_, g)| s + g) < lost - EPS {
            return false;
        }
        for &d in blocking {
            self.drop_rate(v, d, None);
        }
        let b = py_min(b, self.bn(ci));
        if b > EPS {
            self.reserve(hi, ci, b);
        }
        for (d, g) in picks {
            // same sequence as the dry run; the guard only absorbs float noise
            let g = py_min(g, self.bn(d));
            if g > EPS {
                self.reserve(v, d, g);
            }
        }
        self.mark(v);
        true
    }

    fn share(&mut self, hi: usize, ci: usize, v: usize, blocking: &[usize], satc: &[usize]) -> bool {
        let (mine, theirs) = (self.h(hi).total(), self.h(v).total());
        let c = &self.cands[ci];
        let mut vals: Vec<f64> = c
            .edges
            .iter()
            .filter(|e| !satc.contains(e))
            .map(|&e| self.res[e])
            .collect();
        vals.push(c.cap);
        let mut least = self.h(v).rate(blocking[0]).expect("a blocking path");
        for &d in &blocking[1..] {
            least = py_min(least, self.h(v).rate(d).expect("a blocking path"));
        }
        vals.push(least);
        vals.push((theirs - mine) / (blocking.len() + 1) as f64);
        let mut x = vals[0];
        for &y in &vals[1..] {
            x = py_min(x, y);
        }
        if x <= EPS {
            return false;
        }
        for &d in blocking {
            self.drop_rate(v, d, Some(x));
        }
        let g = py_min(x, self.bn(ci));
        if g > EPS {
            self.reserve(hi, ci, g);
        }
        self.mark(v);
        true
    }

    fn record_idle(&mut self, hi: usize) {
        let cs = self.h(hi).cs;
        let held = self.h(hi).res.clone();
        let mut edges: Vec<usize> = held
            .iter()
            .flat_map(|&(d, _)| self.cands[d].edges.iter().copied())
            .collect();
        edges.sort_unstable();
        edges.dedup();
        let res = edges.iter().map(|&e| (e, self.res[e])).collect();
        let sat = self.csets[cs]
            .allmask
            .iter()
            .copied()
            .filter(|&e| self.sat.get(e))
            .collect();
        let cnt = edges
            .iter()
            .map(|&e| {
                let n = held.iter().filter(|&&(d, _)| self.cands[d].edges.contains(&e)).count() as i64;
                let ni = held
                    .iter()
                    .filter(|&&(d, _)| self.cands[d].edges.contains(&e) && !self.cands[d].direct)
                    .count() as i64;
                (e, n, ni)
            })
            .collect();
        self.csets[cs].idle = Some(Idle {
            res,
            sat,
            used: edges,
            cnt,
            held,
        });
    }

    fn unregister(&mut self, handle: u64) -> Option<Held> {
        let i = self.pos.remove(&handle)?;
        let h = self.held[i].take();
        self.live -= 1;
        // Compact now and then (positions shift, the order of the live ones does not).
        if self.held.len() > 64 && self.live * 2 < self.held.len() {
            self.held.retain(|x| x.is_some());
            self.pos.clear();
            for (k, x) in self.held.iter().enumerate() {
                self.pos.insert(x.as_ref().expect("compacted").handle, k);
            }
        }
        h
    }
}

fn list_of(ids: &[usize], base: usize) -> Vec<usize> {
    ids.iter().map(|&i| base + i).collect()
}

#[pymethods]
impl RouterCore {
    #[new]
    fn new(cap: Vec<f64>, reroute: bool, multipath: bool) -> Self {
        let n = cap.len();
        RouterCore {
            res: cap.clone(),
            cap,
            sat: Bits::new(n),
            used: Bits::new(n),
            cnt: vec![0; n],
            icnt: vec![0; n],
            cands: Vec::new(),
            csets: Vec::new(),
            renamings: Vec::new(),
            held: Vec::new(),
            pos: HashMap::default(),
            live: 0,
            changed: Ordered::default(),
            stale: Ordered::default(),
            reroute,
            multipath,
        }
    }

    /// Compile one pair's route set: `cands` are its distinct routes in rank order, as (edges, group
    /// or -1, cap, direct, share), and the lists index them. Returns (set id, first candidate id).
    #[allow(clippy::too_many_arguments)]
    fn add_cset(
        &mut self,
        cands: Vec<(Vec<usize>, i64, f64, bool, f64)>,
        direct: Vec<usize>,
        flow: Vec<usize>,
        tiers: Vec<Vec<usize>>,
        fallback: Vec<usize>,
        fair: bool,
        balance: bool,
        load: bool,
        load_tiers: Vec<Vec<usize>>,
        stop_out: Vec<usize>,
        stop_in: Vec<usize>,
    ) -> PyResult<(usize, usize)> {
        let base = self.cands.len();
        for (rank, (edges, group, cap, is_direct, share)) in cands.into_iter().enumerate() {
            if edges.is_empty() || edges.iter().any(|&e| e >= self.cap.len()) {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "candidate {rank} has edges {edges:?}, outside 0..{}",
                    self.cap.len()
                )));
            }
            let share = if share < cap { share } else { cap };
            self.cands.push(Cand {
                edges,
                group,
                cap,
                direct: is_direct,
                share,
                rank,
                detour: false,
            });
        }
        let (direct, flow, fallback) = (list_of(&direct, base), list_of(&flow, base), list_of(&fallback, base));
        let tiers: Vec<Vec<usize>> = tiers.iter().map(|t| list_of(t, base)).collect();
        let load_tiers: Vec<Vec<usize>> = load_tiers.iter().map(|t| list_of(t, base)).collect();
        let grouped_of = |ts: &Vec<Vec<usize>>, cands: &Vec<Cand>| -> Vec<bool> {
            ts.iter().map(|t| t.iter().any(|&c| cands[c].group != -1)).collect()
        };
        let dedup = |v: Vec<usize>| -> Vec<usize> {
            let mut seen = HashSet::default();
            v.into_iter().filter(|c| seen.insert(*c)).collect()
        };
        let busy = dedup(
            direct
                .iter()
                .chain(flow.iter())
                .chain(tiers.iter().flatten())
                .copied()
                .collect(),
        );
        let load_busy = if load {
            dedup(direct.iter().chain(load_tiers.iter().flatten()).copied().collect())
        } else {
            busy.clone()
        };
        let mut load_mask = HashSet::default();
        if load {
            for &c in &load_busy {
                load_mask.extend(self.cands[c].edges.iter().copied());
            }
            let keep: HashSet<usize> = load_busy.iter().copied().collect();
            for &c in &flow {
                self.cands[c].detour = !keep.contains(&c);
            }
        }
        let mut allmask: Vec<usize> = stop_out.iter().chain(stop_in.iter()).copied().collect();
        for c in &self.cands[base..] {
            allmask.extend(c.edges.iter().copied());
        }
        allmask.sort_unstable();
        allmask.dedup();
        let cs = CSet {
            cands: base..self.cands.len(),
            grouped: grouped_of(&tiers, &self.cands),
            load_grouped: grouped_of(&load_tiers, &self.cands),
            direct,
            flow,
            tiers,
            fallback,
            fair,
            balance,
            busy,
            load,
            load_tiers,
            load_busy,
            load_mask,
            stop_out,
            stop_in,
            allmask,
            idle: None,
        };
        self.csets.push(cs);
        Ok((self.csets.len() - 1, base))
    }

    /// Keep a map of edge ids from one node to a node that copies it, for `copy_cset`; its id.
    fn add_renaming(&mut self, edges: HashMap<usize, usize>) -> PyResult<usize> {
        if let Some(&e) = edges.values().find(|&&e| e >= self.cap.len()) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "edge {e} is outside 0..{}",
                self.cap.len()
            )));
        }
        self.renamings.push(edges);
        Ok(self.renamings.len() - 1)
    }

    /// Add a copy of route set `cs` for a node that copies `cs`'s node (the reference renames the
    /// routes and compiles them again, which gives this set): each edge id through renaming
    /// `renaming` (`add_renaming`) and each group id through `groups`; an edge the renaming does not
    /// hold stays (it lies outside both nodes). Returns (set id, first candidate id), as `add_cset` does.
    fn copy_cset(&mut self, cs: usize, renaming: usize, groups: HashMap<i64, i64>) -> PyResult<(usize, usize)> {
        let (Some(from), Some(edges)) = (self.csets.get(cs), self.renamings.get(renaming)) else {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "no route set {cs} or no renaming {renaming}"
            )));
        };
        let edge = |e: &usize| *edges.get(e).unwrap_or(e);
        let base = self.cands.len();
        let old = from.cands.start;
        let ids = |v: &Vec<usize>| -> Vec<usize> { v.iter().map(|&c| c - old + base).collect() };
        let mut allmask: Vec<usize> = from.allmask.iter().map(edge).collect();
        allmask.sort_unstable();
        allmask.dedup();
        let copy = CSet {
            cands: base..base + from.cands.len(),
            direct: ids(&from.direct),
            flow: ids(&from.flow),
            tiers: from.tiers.iter().map(ids).collect(),
            grouped: from.grouped.clone(),
            fallback: ids(&from.fallback),
            fair: from.fair,
            balance: from.balance,
            busy: ids(&from.busy),
            load: from.load,
            load_tiers: from.load_tiers.iter().map(ids).collect(),
            load_grouped: from.load_grouped.clone(),
            load_busy: ids(&from.load_busy),
            load_mask: from.load_mask.iter().map(edge).collect(),
            stop_out: from.stop_out.iter().map(edge).collect(),
            stop_in: from.stop_in.iter().map(edge).collect(),
            allmask,
            idle: None,
        };
        let mut cands = Vec::with_capacity(from.cands.len());
        for c in &self.cands[from.cands.clone()] {
            let group = if c.group == -1 {
                -1
            } else {
                match groups.get(&c.group) {
                    Some(&g) => g,
                    None => {
                        return Err(pyo3::exceptions::PyValueError::new_err(format!(
                            "group {} has no copy",
                            c.group
                        )))
                    }
                }
            };
            cands.push(Cand {
                edges: c.edges.iter().map(edge).collect(),
                group,
                ..*c
            });
        }
        self.cands.extend(cands);
        self.csets.push(copy);
        Ok((self.csets.len() - 1, base))
    }

    /// Plan transfer `handle` over route set `cs` and reserve its bandwidth: its (candidate, GB/s).
    pub(crate) fn plan(&mut self, py: Python<'_>, handle: u64, cs: usize) -> PyResult<Picks> {
        if self.pos.contains_key(&handle) || cs >= self.csets.len() {
            return Err(config_error(
                py,
                format!("transfer handle {handle} is held, or route set {cs} unknown"),
            ));
        }
        let hi = self.register(handle, cs);
        if self.csets[cs].allmask.iter().any(|&e| self.used.get(e)) {
            let victims = if self.csets[cs].load && self.reroute {
                self.yield_detours(hi)
            } else {
                Vec::new()
            };
            self.phase_direct(hi);
            self.phase_rest(hi);
            for v in victims {
                // after the newcomer: what it left, over the victim's short routes
                self.fill(v);
                self.mark(v);
            }
            return Ok(self.h(hi).res.clone());
        }
        // Nobody holds an edge this plan could read: the idle plan, computed once, then replayed.
        if self.csets[cs].idle.is_none() {
            self.phase_direct(hi);
            self.phase_rest(hi);
            self.record_idle(hi);
            return Ok(self.h(hi).res.clone());
        }
        let idle = self.csets[cs].idle.as_ref().expect("recorded");
        for &(e, r) in &idle.res {
            self.res[e] = r;
        }
        for &(e, n, ni) in &idle.cnt {
            self.cnt[e] += n;
            self.icnt[e] += ni;
        }
        for &e in &idle.sat {
            self.sat.set(e);
        }
        for &e in &idle.used {
            self.used.set(e);
        }
        let held = idle.held.clone();
        self.hm(hi).res = held.clone();
        Ok(held)
    }

    /// The transfers of one workflow together (the reference's `plan_many`), in input order.
    fn plan_many(&mut self, py: Python<'_>, requests: Vec<(u64, usize)>) -> PyResult<Vec<Picks>> {
        for &(handle, cs) in &requests {
            if self.pos.contains_key(&handle) || cs >= self.csets.len() {
                return Err(config_error(
                    py,
                    format!("transfer handle {handle} is held, or route set {cs} unknown"),
                ));
            }
        }
        let his: Vec<usize> = requests.iter().map(|&(handle, cs)| self.register(handle, cs)).collect();
        for &hi in &his {
            self.phase_direct(hi);
        }
        let mut order: Vec<usize> = (0..his.len()).collect();
        let totals: Vec<f64> = his.iter().map(|&hi| self.h(hi).total()).collect();
        order.sort_by(|&a, &b| totals[a].partial_cmp(&totals[b]).unwrap().then(a.cmp(&b)));
        for i in order {
            self.phase_rest(his[i]);
        }
        let plans = his.iter().map(|&hi| self.h(hi).res.clone()).collect();
        for &(handle, _) in &requests {
            self.changed.remove(handle);
            self.stale.remove(handle);
        }
        Ok(plans)
    }

    /// Return every reservation of `handle`.
    pub(crate) fn release(&mut self, py: Python<'_>, handle: u64) -> PyResult<()> {
        let h = match self.unregister(handle) {
            Some(h) => h,
            None => {
                return Err(config_error(
                    py,
                    format!("transfer handle {handle} has no plan to release"),
                ))
            }
        };
        let mut freed: Vec<usize> = Vec::new();
        for &(ci, g) in &h.res {
            let c = &self.cands[ci];
            for &e in &c.edges {
                freed.push(e);
                let n = self.cnt[e] - 1;
                self.cnt[e] = n;
                if !c.direct {
                    self.icnt[e] -= 1;
                }
                if n == 0 {
                    self.res[e] = self.cap[e]; // no holder left: exact, whatever float drift came before
                    self.used.clear(e);
                } else {
                    let r = self.res[e] + g;
                    self.res[e] = if r < self.cap[e] { r } else { self.cap[e] };
                }
            }
        }
        // Every reservation is above EPS, so each edge it crossed has residual again.
        for e in freed {
            self.sat.clear(e);
        }
        self.changed.remove(handle);
        self.stale.remove(handle);
        Ok(())
    }

    /// The handles altered since the last call, in order, with their holdings; clears both lists.
    pub(crate) fn take_changed(&mut self) -> Vec<(u64, Picks)> {
        self.stale.take();
        let order = self.changed.take();
        order
            .into_iter()
            .map(|t| (t, self.h(self.pos[&t]).res.clone()))
            .collect()
    }

    /// The handles altered since the last call to this or `take_changed` (plans to rebuild).
    fn take_stale(&mut self) -> Vec<(u64, Picks)> {
        let order = self.stale.take();
        order
            .into_iter()
            .map(|t| (t, self.h(self.pos[&t]).res.clone()))
            .collect()
    }

    /// Live residual GB/s of edge `e`.
    fn residual(&self, e: usize) -> f64 {
        self.res[e]
    }

    /// Transfers holding a plan now.
    fn __len__(&self) -> usize {
        self.live
    }
}
