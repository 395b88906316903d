"""Full collections of the cyclic GC that walk only what is new.

Under a steady write load the index holds hundreds of thousands of
long-lived Python objects that the merges have not yet packed, and CPython
collects its oldest generation whenever it has grown by a quarter since
the last full collection: each such collection walks every one of them to
find nothing, with every thread stopped.  Measured under the node-capacity
load at 140,000 nodes (one brain, 14,200 writes/s): 43 full collections in
45 s, 15 ms growing to 260 ms each as the index grew, 0 objects found.

After each full collection this moves what survived it to the permanent
generation (``gc.freeze``), as recovery does once for a recovered index
(brain.engine.recovery.keep_out_of_gc): the next full collection walks only
what came since (0-8 ms in the same run).  Reference counting still frees
a frozen object that stops being used; what the permanent generation
keeps is a garbage *cycle* among objects that were alive at a freeze.
Under that load the collector found 27 such objects in 20 s in all
generations, at start-up a few hundred: the cost of the pauses it saves
far outweighs that.

Raising the young generation's threshold (10,000 allocations instead of
700) was measured and not kept: under the node-capacity load at 150,000
nodes (40 s windows, 2 runs each, alternating) the server's CPU a write
was the same (57.7-59.1 against 58.2-58.3 us), and a full collection,
now rarer and larger, stopped every thread for 258-400 ms against at
most 18-21 ms.

Process-wide, so ``brain serve`` installs it (not each Engine: tests open
many in one process).
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_installed = False


def _after_collection(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def install() -> None:
    """Freeze the survivors of every full collection from now on."""
    global _installed
    with _lock:
        if not _installed:
            gc.callbacks.append(_after_collection)
            _installed = True


def uninstall() -> None:
    global _installed
    with _lock:
        if _installed:
            gc.callbacks.remove(_after_collection)
            _installed = False


def installed() -> bool:
    return _installed
