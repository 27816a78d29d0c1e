"""Page-merging decisions: the KSM burst setting, when a process's merging has leveled off, and which
sharing domain may use KSM on a node.

Pure functions (no clock, files or threads): :class:`gfaas.dedup.controller.MergeController` feeds them
samples it took and applies what they decide.

Why a burst and not a steady setting: KSM scans every mergeable page at ``pages_to_scan`` pages per
``sleep_millisecs``; the default (100 / 20 ms) needs a minute for 8 x 64 MB, an aggressive setting costs
about one core for as long as it runs. Scanning hard only while hinted pages are pending gives
merge-within-seconds and zero cost when idle.

Measured on the 2-core issue-17 machine (8 processes x 100 MB identical random bytes, time from KSM
switched on to 85% of the pages merged; a sweep script from the issue-17 KSM report, one run;
``pytest -s tests/integration/test_dedup_ksm_root.py`` prints the time of the setting chosen here): 100000/0 1.11 s, 10000/0 1.21 s, 100000/1 1.30 s, 10000/1 1.54 s (an earlier run:
100000/0 1.19-1.28 s, 3000/0 1.31 s, 1000/0 1.32 s). ksmd is one thread and needs two passes (the
first only checksums a page, the second merges it), so once the sleep is 0 the time is bound by one
core and the page count, not by the batch size; a large batch only saves wake-ups. The issue's 1 s
target for 8 x 100 MB is not reached by KSM on this machine (1.1-1.4 s); content-addressed shared
mappings (``gfaas.dedup.shared``) share at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Pages per ksmd batch in a burst: never below MIN (a tiny batch wastes wake-ups), never above MAX
#: (a batch is not preemptible by our sampling anyway; 100000 pages is ~400 MB, more gains nothing).
MIN_BURST_PAGES = 10_000
MAX_BURST_PAGES = 100_000

#: A process has had every page seen twice (checksum pass, then merge pass) once KSM finished this many
#: full scans after its hint: the scan under way at the hint may have passed its pages already.
SETTLE_FULL_SCANS = 3


@dataclass(frozen=True)
class BurstSettings:
    """KSM scan rate during a burst.

    Attributes:
        pages_to_scan: pages ksmd scans per batch.
        sleep_millisecs: ksmd's sleep between batches (0: back to back, about one core).
    """

    pages_to_scan: int
    sleep_millisecs: int

    def as_sysfs(self) -> dict[str, str]:
        """The sysfs values of the burst: the rate, the advisor off (it would override ``pages_to_scan``),
        smart scan off and ksmd running (a kernel without a setting skips it).

        Smart scan (Linux 6.7+) skips pages that failed to merge before, for more scans each time they
        fail. A process hinted before its partner fails alone; when the partner is hinted, its pages
        would be skipped for a while, the partner's would find nothing to merge with, and the burst
        would end on :data:`SETTLE_FULL_SCANS` full scans with nothing merged (seen in CI). With smart
        scan off every page is compared on every scan, which is what that rule counts on."""
        return {
            "advisor_mode": "none",
            "pages_to_scan": str(self.pages_to_scan),
            "sleep_millisecs": str(self.sleep_millisecs),
            "smart_scan": "0",
            "run": "1",
        }


def burst_settings(pending_pages: int) -> BurstSettings:
    """The burst setting for ``pending_pages`` hinted pages not yet merged: one batch covers them all
    (bounded to [MIN_BURST_PAGES, MAX_BURST_PAGES]) and ksmd never sleeps while the burst lasts."""
    pages = min(MAX_BURST_PAGES, max(MIN_BURST_PAGES, int(pending_pages)))
    return BurstSettings(pages_to_scan=pages, sleep_millisecs=0)


def leveled_off(samples: Sequence[tuple[float, int]], *, window_s: float, min_gain: int) -> bool:
    """Whether a process's merging has leveled off.

    ``samples`` are ``(time, merging_pages)`` in time order. True when merging has started (the last
    value is above 0: KSM's first pass only checksums, so a flat zero means "not reached yet", not
    "done"), the samples cover at least ``window_s`` and the value grew by less than ``min_gain`` pages
    over the last ``window_s``.
    """
    if len(samples) < 2 or samples[-1][1] <= 0:
        return False
    t_last, v_last = samples[-1]
    if t_last - samples[0][0] < window_s:
        return False
    # The newest sample at or before the window's start is the baseline of the window.
    base = samples[0][1]
    for t, v in samples:
        if t <= t_last - window_s:
            base = v
        else:
            break
    return v_last - base < min_gain


def settled(
    samples: Sequence[tuple[float, int]], full_scans_since_hint: int, *, window_s: float, min_gain: int
) -> bool:
    """Whether a hinted process needs no more burst: its merging leveled off, or KSM has scanned all
    of its pages twice since the hint (:data:`SETTLE_FULL_SCANS` full scans) and found nothing more
    (content that has no duplicate never shows progress)."""
    return full_scans_since_hint >= SETTLE_FULL_SCANS or leveled_off(
        samples, window_s=window_s, min_gain=min_gain
    )


def min_gain_for(hinted_pages: int) -> int:
    """Progress below which a process counts as leveled off: 0.5% of its hinted pages, at least 1."""
    return max(1, hinted_pages // 200)


def admit(domain: str, active_domain: str | None, live_pids_by_domain: Mapping[str, int]) -> str | None:
    """Whether a hint from ``domain`` may use KSM now.

    KSM has one global tree: pages of every mergeable process are compared with each other, so a
    process can learn that another one holds a page it guessed (the merge makes its write slower:
    copy-on-write). Granting KSM to one sharing domain at a time keeps that side channel inside the
    domain. Returns None to admit, else the refusal reason (names the active domain and the fix).
    """
    if not domain:
        return "a merge hint needs a sharing domain (got an empty name); pass domain=<workflow or tenant>"
    if active_domain is None or active_domain == domain:
        return None
    live = live_pids_by_domain.get(active_domain, 0)
    if live <= 0:
        return None
    return (
        f"KSM merging on this node is held by sharing domain {active_domain!r} ({live} live hinted "
        f"process{'es' if live != 1 else ''}); the hint from domain {domain!r} is refused: retry after "
        f"those processes stop, or hint within domain {active_domain!r}"
    )
