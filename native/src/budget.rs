//! What one connection may make the server hold: `--max-connection-bytes`,
//! counted on each side of the connection separately.
//!
//! * Requests received: every request message reserves its bytes here as
//!   soon as its length is known, before more of the client's bytes are
//!   acknowledged (h2's flow control), and keeps them until it is answered
//!   (a unary call) or taken by Python (a stream's message).  When the
//!   budget is spent the connection's call tasks stop reading: h2 stops
//!   granting window and the client stops sending.  A reservation covers a
//!   whole message at once, so two calls waiting for the rest of their
//!   messages can never hold each other up.
//! * Responses queued: the bytes Python handed to the connection's streams
//!   (Watch, LeaseKeepAlive, server streams) and h2 has not taken yet.  Over
//!   the budget, every stream of the connection reports its queue full (as a
//!   stream over its own limit does) until the connection is back under half
//!   of it; the streams told so are told when it is.
//!
//! Unary answers are handed to h2 whole and are not counted here: what a
//! client that never reads them makes the server hold is bounded by the
//! calls it may have open at once, --max-concurrent-streams.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::events::{Event, EventQueue};
use crate::shared::Stats;

/// A stream that was told "full" because of its connection.
pub struct Waiting {
    pub id: u64,
    pub state: Arc<crate::calls::StreamState>,
}

pub struct ConnBudget {
    pub limit: usize,
    recv: Arc<Semaphore>,
    /// Response bytes queued on the connection's streams.
    pub queued: AtomicUsize,
    waiting: Mutex<Vec<Waiting>>,
}

/// Bytes of one request message reserved on its connection, given back
/// when this is dropped (with the answer, or when Python took the message).
pub struct Held {
    _permit: OwnedSemaphorePermit,
    n: usize,
    stats: Arc<Stats>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stats.received_held.fetch_sub(self.n, Ordering::Relaxed);
    }
}

impl ConnBudget {
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        ConnBudget {
            limit,
            recv: Arc::new(Semaphore::new(limit)),
            queued: AtomicUsize::new(0),
            waiting: Mutex::new(Vec::new()),
        }
    }

    /// Reserve `n` bytes of request (at most the whole budget: a message
    /// the receive limit lets in is never refused for its size here),
    /// waiting while the connection holds too much.
    pub async fn reserve(&self, n: usize, stats: &Arc<Stats>) -> Held {
        if let Some(h) = self.try_reserve(n, stats) {
            return h;
        }
        stats.received_full.fetch_add(1, Ordering::Relaxed);
        let n = n.clamp(1, self.limit).min(u32::MAX as usize);
        let permit = match self.recv.clone().acquire_many_owned(n as u32).await {
            Ok(p) => p,
            Err(_) => unreachable!("the budget's semaphore is never closed"),
        };
        stats.received_held.fetch_add(n, Ordering::Relaxed);
        Held { _permit: permit, n, stats: stats.clone() }
    }

    /// `reserve` if the budget has room now.
    pub fn try_reserve(&self, n: usize, stats: &Arc<Stats>) -> Option<Held> {
        let n = n.clamp(1, self.limit).min(u32::MAX as usize);
        let permit = self.recv.clone().try_acquire_many_owned(n as u32).ok()?;
        stats.received_held.fetch_add(n, Ordering::Relaxed);
        Some(Held { _permit: permit, n, stats: stats.clone() })
    }

    /// `n` response bytes were queued on one of the connection's streams;
    /// true when the connection is now over its budget.
    pub fn add_queued(&self, n: usize) -> bool {
        self.queued.fetch_add(n, Ordering::SeqCst) + n > self.limit
    }

    pub fn over_half(&self) -> bool {
        self.queued.load(Ordering::SeqCst) > self.limit / 2
    }

    /// A stream that was told "full" and is back under its own limit: it
    /// is told it may send now, or once the connection is under half its
    /// budget.
    pub fn writable_or_wait(&self, w: Waiting, queue: &EventQueue) {
        let (id, state) = (w.id, w.state.clone());
        if self.over_half() {
            self.wait_for_drain(w);
            // drained meanwhile: that drain may have taken the list before this
            if self.over_half() {
                return;
            }
        }
        if state.want_writable.swap(false, Ordering::SeqCst) {
            queue.push(Event::Writable { id, method: state.method });
        }
    }

    /// Tell this stream when the connection is back under half its budget.
    pub fn wait_for_drain(&self, w: Waiting) {
        let mut list = self.waiting.lock();
        if !w.state.waits_on_connection.swap(true, Ordering::SeqCst) {
            list.push(w);
        }
    }

    /// `n` queued bytes left (written to h2, or dropped with their stream);
    /// once under half the budget, the streams that were told "full"
    /// because of it and are under their own limits are told they may send.
    pub fn sub_queued(&self, n: usize, stream_limit: usize, queue: &EventQueue) {
        if n == 0 {
            return;
        }
        let left = self.queued.fetch_sub(n, Ordering::SeqCst) - n;
        if left > self.limit / 2 {
            return;
        }
        let ready: Vec<Waiting> = std::mem::take(&mut *self.waiting.lock());
        let mut events = Vec::new();
        for w in ready {
            w.state.waits_on_connection.store(false, Ordering::SeqCst);
            if w.state.queued.load(Ordering::SeqCst) <= stream_limit / 2 && w.state.want_writable.swap(false, Ordering::SeqCst) {
                events.push(Event::Writable { id: w.id, method: w.state.method });
            }
        }
        queue.push_many(events);
    }
}
