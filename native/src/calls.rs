//! The call registry: every call, stream and HTTP request waiting for
//! Python, by the id Python answers it with.
//!
//! The call tasks (grpc.rs, and server.rs for HTTP) file what answers a call
//! here; Python's `respond`, `fail`, `send`, `finish` and `http_respond`
//! (lib.rs) take it back out.  Below both, so that the modules depend one
//! way: server.rs -> grpc.rs -> calls.rs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::budget::{self, Held};
use crate::events::{Event, EventQueue};

/// A connection's budget (budget.rs), whose parked streams are `Waiting`.
pub type ConnBudget = budget::ConnBudget<Waiting>;

/// A stream that was told "full" because of its connection.
pub struct Waiting {
    pub id: u64,
    pub state: Arc<StreamState>,
}

pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// What Python's send() and finish() hand to a stream's task.
pub enum Cmd {
    Data(Vec<Bytes>),
    Finish(u32, String),
}

pub struct StreamState {
    /// Bytes handed over by Python and not yet given to h2 with window.
    pub queued: AtomicUsize,
    /// Python was told the queue is full: tell it when it drains.
    pub want_writable: AtomicBool,
    /// In its connection's list of streams to tell when it drains.
    pub waits_on_connection: AtomicBool,
    /// The connection's budget, which its queue counts against too.
    pub conn: Arc<ConnBudget>,
    pub method: u32,
}

impl StreamState {
    pub fn new(conn: Arc<ConnBudget>, method: u32) -> Self {
        StreamState {
            method,
            queued: AtomicUsize::new(0),
            want_writable: AtomicBool::new(false),
            waits_on_connection: AtomicBool::new(false),
            conn,
        }
    }

    /// Bytes this stream may be sent before it is full: its own queue's
    /// room under `stream_limit`, or its connection's if less.
    pub fn room(&self, stream_limit: usize) -> usize {
        stream_limit.saturating_sub(self.queued.load(Ordering::SeqCst)).min(self.conn.room())
    }
}

/// A stream that was told "full" and is back under its own limit: it is
/// told it may send now, or once its connection is under half its budget.
pub fn writable_or_wait(w: Waiting, queue: &EventQueue) {
    let (id, state) = (w.id, w.state.clone());
    if state.conn.over_half() {
        wait_for_drain(w);
        // drained meanwhile: that drain may have taken the list before this
        if state.conn.over_half() {
            return;
        }
    }
    if state.want_writable.swap(false, Ordering::SeqCst) {
        queue.push(Event::Writable { id, method: state.method });
    }
}

/// Tell this stream when its connection is back under half its budget.
pub fn wait_for_drain(w: Waiting) {
    if !w.state.waits_on_connection.swap(true, Ordering::SeqCst) {
        let conn = w.state.conn.clone();
        conn.park(w);
    }
}

/// `n` queued bytes of a connection left; once under half its budget, the
/// streams that were told "full" because of it and are under their own
/// limits (`stream_limit`) are told they may send.
pub fn sub_queued(conn: &ConnBudget, n: usize, stream_limit: usize, queue: &EventQueue) {
    let mut events = Vec::new();
    for w in conn.sub_queued(n) {
        w.state.waits_on_connection.store(false, Ordering::SeqCst);
        if w.state.queued.load(Ordering::SeqCst) <= stream_limit / 2 && w.state.want_writable.swap(false, Ordering::SeqCst) {
            events.push(Event::Writable { id: w.id, method: w.state.method });
        }
    }
    queue.push_many(events);
}

/// A stream's command channel and state, as its task registered them.
pub struct StreamHandle {
    pub tx: mpsc::UnboundedSender<Cmd>,
    pub state: Arc<StreamState>,
}

pub enum Pending {
    /// A unary call, with its request's bytes reserved on its connection
    /// until it is answered (brain's --max-connection-bytes).
    Unary(SendResponse<Bytes>, Option<Held>),
    Stream(StreamHandle),
    Http(oneshot::Sender<HttpReply>),
}

/// Calls waiting for Python, by id; sharded so I/O threads and Python
/// rarely meet on one lock.
pub struct Calls {
    shards: Vec<Mutex<HashMap<u64, Pending>>>,
}

const SHARDS: usize = 16;

impl Calls {
    pub fn new() -> Self {
        Calls { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }
    pub fn insert(&self, id: u64, p: Pending) {
        self.shards[id as usize % SHARDS].lock().insert(id, p);
    }
    pub fn remove(&self, id: u64) -> Option<Pending> {
        self.shards[id as usize % SHARDS].lock().remove(&id)
    }
    /// The stream's command channel and state (streams stay registered
    /// until their task ends).
    pub fn stream(&self, id: u64) -> Option<(mpsc::UnboundedSender<Cmd>, Arc<StreamState>)> {
        match self.shards[id as usize % SHARDS].lock().get(&id) {
            Some(Pending::Stream(h)) => Some((h.tx.clone(), h.state.clone())),
            _ => None,
        }
    }
    pub fn is_stream(&self, id: u64) -> bool {
        matches!(self.shards[id as usize % SHARDS].lock().get(&id), Some(Pending::Stream(_)))
    }
    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }
}
