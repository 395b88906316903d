//! The call registry: every call, stream and HTTP request waiting for
//! Python, by the id Python answers it with.
//!
//! The call tasks (grpc.rs, and server.rs for HTTP) file what answers a call
//! here; Python's `respond`, `fail`, `send`, `finish` and `http_respond`
//! (lib.rs) take it back out.  Below both, so that the modules depend one
//! way: server.rs -> grpc.rs -> calls.rs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::budget::{ConnBudget, Held};

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
