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
//!   of it; the streams told so are parked here (`W`, calls.rs's `Waiting`)
//!   and handed back when it is.
//!
//! Unary answers are handed to h2 whole and are not counted here: what a
//! client that never reads them makes the server hold is bounded by the
//! calls it may have open at once, --max-concurrent-streams.
//!
//! A leaf: it knows nothing of streams or events (calls.rs does the telling).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The receive side's counters, every connection together (the metrics).
#[derive(Default)]
pub struct Counters {
    /// Request bytes received and not yet answered or taken.
    pub received_held: AtomicUsize,
    /// Times a connection had to wait for its budget to read on.
    pub received_full: AtomicU64,
}

pub struct ConnBudget<W> {
    pub limit: usize,
    recv: Arc<Semaphore>,
    /// Response bytes queued on the connection's streams.
    pub queued: AtomicUsize,
    waiting: Mutex<Vec<W>>,
    counters: Arc<Counters>,
}

/// Bytes of one request message reserved on its connection, given back
/// when this is dropped (with the answer, or when Python took the message).
pub struct Held {
    _permit: OwnedSemaphorePermit,
    n: usize,
    counters: Arc<Counters>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.counters.received_held.fetch_sub(self.n, Ordering::Relaxed);
    }
}

impl<W> ConnBudget<W> {
    pub fn new(limit: usize, counters: Arc<Counters>) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        ConnBudget { limit, recv: Arc::new(Semaphore::new(limit)), queued: AtomicUsize::new(0), waiting: Mutex::new(Vec::new()), counters }
    }

    /// A message's bytes as reserved: at most the whole budget (a message
    /// the receive limit lets in is never refused for its size here).
    fn permits(&self, n: usize) -> u32 {
        n.clamp(1, self.limit).min(u32::MAX as usize) as u32
    }

    fn held(&self, permit: OwnedSemaphorePermit, n: u32) -> Held {
        self.counters.received_held.fetch_add(n as usize, Ordering::Relaxed);
        Held { _permit: permit, n: n as usize, counters: self.counters.clone() }
    }

    /// Reserve `n` bytes of request, waiting while the connection holds too much.
    pub async fn reserve(&self, n: usize) -> Held {
        if let Some(h) = self.try_reserve(n) {
            return h;
        }
        self.counters.received_full.fetch_add(1, Ordering::Relaxed);
        let n = self.permits(n);
        match self.recv.clone().acquire_many_owned(n).await {
            Ok(p) => self.held(p, n),
            Err(_) => unreachable!("the budget's semaphore is never closed"),
        }
    }

    /// `reserve` if the budget has room now.
    pub fn try_reserve(&self, n: usize) -> Option<Held> {
        let n = self.permits(n);
        let permit = self.recv.clone().try_acquire_many_owned(n).ok()?;
        Some(self.held(permit, n))
    }

    /// `n` response bytes were queued on one of the connection's streams;
    /// true when the connection is now over its budget.
    pub fn add_queued(&self, n: usize) -> bool {
        self.queued.fetch_add(n, Ordering::SeqCst) + n > self.limit
    }

    pub fn over_half(&self) -> bool {
        self.queued.load(Ordering::SeqCst) > self.limit / 2
    }

    /// Room left for responses before the connection is over its budget.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.queued.load(Ordering::SeqCst))
    }

    /// Keep `w` until the connection is back under half its budget.
    pub fn park(&self, w: W) {
        self.waiting.lock().push(w);
    }

    /// `n` queued bytes left (written to h2, or dropped with their stream);
    /// the parked streams once under half the budget (none before).
    pub fn sub_queued(&self, n: usize) -> Vec<W> {
        if n == 0 {
            return Vec::new();
        }
        let left = self.queued.fetch_sub(n, Ordering::SeqCst) - n;
        if left > self.limit / 2 {
            return Vec::new();
        }
        std::mem::take(&mut *self.waiting.lock())
    }
}
