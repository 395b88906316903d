//! What Rust hands to Python: events, queued until the dispatch thread
//! takes them in a batch.
//!
//! The queue is the only place both sides meet.  I/O tasks push (a short
//! lock, a condvar signal when the dispatch thread sleeps); the dispatch
//! thread drains up to N events per `recv_batch` with the GIL released while
//! it waits.  `wake()` makes a sleeping `recv_batch` return even when nothing
//! arrived, so Python can be asked to look at its own work (a watch stream
//! that has responses ready) without a thread per stream.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::budget::Held;
use crate::x509::AltNames;

/// Who is on the other end of a connection.
#[derive(Debug)]
pub struct Peer {
    /// Common name of the verified client certificate (mutual TLS only).
    pub common_name: Option<String>,
}

/// What a call's metadata tells Python.
#[derive(Debug, Clone, Default)]
pub struct CallMeta {
    /// `hasleader: true` (etcd's WithRequireLeader), see `REQUIRE_LEADER`.
    pub require_leader: bool,
    /// etcd's auth token: the `token` metadata, else `authorization`
    /// (etcd's two names for it), see `AUTH_TOKEN`.
    pub token: Option<String>,
}

pub enum Event {
    /// A unary or server-streaming call with its one request message.
    /// `meta`: what its metadata says (leader required, auth token).
    /// `held`: a server stream's request bytes, reserved on its connection
    /// until Python takes it (a unary call's stay with the call instead).
    Call {
        id: u64,
        method: u32,
        payload: Bytes,
        peer: Arc<Peer>,
        meta: CallMeta,
        #[allow(dead_code)] // never read: dropped with the event
        held: Option<Held>,
    },
    /// A bidirectional stream began (messages follow as `Message`).
    Open { id: u64, method: u32, peer: Arc<Peer>, meta: CallMeta },
    /// `held`: its bytes, reserved on the connection until Python takes it.
    Message {
        id: u64,
        method: u32,
        payload: Bytes,
        #[allow(dead_code)] // never read: dropped with the event
        held: Option<Held>,
    },
    /// The client sent END_STREAM: no more messages will come.
    HalfClosed { id: u64, method: u32 },
    /// The client reset the call or its connection went away.
    Cancelled { id: u64, method: u32 },
    /// A stream's send queue went back under its limit.
    Writable { id: u64, method: u32 },
    /// A message longer than the receive limit (its declared length); the
    /// body was not buffered.
    Oversized { id: u64, method: u32, len: usize, peer: Arc<Peer> },
    /// A plain HTTP request (HTTP/1.1 or HTTP/2 without gRPC).
    Http { id: u64, method: String, path: String, peer: Arc<Peer> },
    /// A TLS connection refused or abandoned, for the log: the peer's
    /// address, the server name it asked for (SNI) and why, in Go's words
    /// where etcd's log has them.  `quiet`: the peer closed or never spoke
    /// (etcd logs an EOF at debug level, not as a warning).  `names`: the
    /// client certificate's DNS names and IP addresses, when it was read
    /// and then refused by etcd's narrowing (etcd logs them then).
    Rejected { remote: String, server_name: String, error: String, quiet: bool, names: Option<AltNames> },
}

pub const EV_CALL: u8 = 1;
pub const EV_OPEN: u8 = 2;
pub const EV_MESSAGE: u8 = 3;
pub const EV_HALF_CLOSED: u8 = 4;
pub const EV_CANCELLED: u8 = 5;
pub const EV_WRITABLE: u8 = 6;
pub const EV_OVERSIZED: u8 = 7;
pub const EV_HTTP: u8 = 8;
pub const EV_REJECTED: u8 = 9;
/// Or-ed into EV_CALL / EV_OPEN for a call with `hasleader: true`: Python
/// tells those apart with one bit test and the other events pay nothing.
pub const REQUIRE_LEADER: u8 = 0x80;
/// Or-ed into EV_CALL / EV_OPEN for a call that carries an auth token; its
/// event's last item is then (common name, token) instead of the name.
pub const AUTH_TOKEN: u8 = 0x40;

struct Inner {
    events: VecDeque<Event>,
    woken: bool,
    closed: bool,
    sleeping: bool,
}

pub struct EventQueue {
    inner: Mutex<Inner>,
    cv: Condvar,
}

impl EventQueue {
    pub fn new() -> Self {
        EventQueue {
            inner: Mutex::new(Inner { events: VecDeque::new(), woken: false, closed: false, sleeping: false }),
            cv: Condvar::new(),
        }
    }

    pub fn push(&self, ev: Event) {
        let mut q = self.inner.lock();
        q.events.push_back(ev);
        if q.sleeping {
            q.sleeping = false;
            self.cv.notify_one();
        }
    }

    pub fn push_many(&self, evs: impl IntoIterator<Item = Event>) {
        let mut q = self.inner.lock();
        let before = q.events.len();
        q.events.extend(evs);
        if q.sleeping && q.events.len() > before {
            q.sleeping = false;
            self.cv.notify_one();
        }
    }

    pub fn wake(&self) {
        let mut q = self.inner.lock();
        q.woken = true;
        if q.sleeping {
            q.sleeping = false;
            self.cv.notify_one();
        }
    }

    pub fn close(&self) {
        let mut q = self.inner.lock();
        q.closed = true;
        self.cv.notify_all();
    }

    /// Up to `max` events; an empty batch after `wake()`; None once closed
    /// (events still queued are dropped: nobody will answer them).
    pub fn take(&self, max: usize) -> Option<Vec<Event>> {
        let mut q = self.inner.lock();
        loop {
            if q.closed {
                return None;
            }
            if !q.events.is_empty() || q.woken {
                q.woken = false;
                let n = q.events.len().min(max);
                return Some(q.events.drain(..n).collect());
            }
            q.sleeping = true;
            self.cv.wait(&mut q);
        }
    }
}
