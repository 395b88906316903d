"""The clock that leadership is timed on: CLOCK_BOOTTIME.

A replica's hold on the election key, and the read lease that rests on it,
are promises about real time: "no other replica can write before T +
election timeout".  ``time.monotonic()`` (CLOCK_MONOTONIC) stops while the
machine is suspended, so a leader suspended past its lease would wake up
believing it still held it.  CLOCK_BOOTTIME is the same clock (slewed by
NTP at the same bounded rate) but keeps counting through suspend, so a
lease that ended while the machine slept has ended when it wakes.

What no guest clock can see is time the hypervisor hides from it: a VM
that is paused and resumed (live migration, `virsh suspend`) gets its
clocks restored as if no time had passed.  docs/cluster.md ("The read
lease") says why the lease is therefore off by default.

Every time the election keeps (key holds, leases, heartbeats, answers) and
the journal's acknowledgement time it compares them with are read here, so
no two of them are on different clocks.
"""

from __future__ import annotations

import time

CLOCK = time.CLOCK_BOOTTIME


def now() -> float:
    """Seconds on CLOCK_BOOTTIME (only differences mean anything)."""
    return time.clock_gettime(CLOCK)
