//! What every listener, connection and call task of one transport shares:
//! the method table, the event queue, the call registry, call ids, the
//! settings, the counters and the shutdown signal.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::calls::Calls;
use crate::events::EventQueue;

/// Why a TLS connection was refused; `not_allowed` (the allowed names),
/// `revoked` and `crl_unusable` (the CRL) are etcd's narrowing
/// (`narrowing`), the CRL's after the handshake.
pub const HANDSHAKE_REASONS: [&str; 11] = [
    "no_client_certificate",
    "bad_certificate",
    "not_allowed",
    "revoked",
    "crl_unusable",
    "not_tls",
    "incompatible",
    "alert_received",
    "closed",
    "timeout",
    "other",
];

#[derive(Default)]
pub struct Stats {
    pub connections_accepted: AtomicU64,
    pub connections_open: AtomicU64,
    pub http_requests: AtomicU64,
    pub bad_requests: AtomicU64,
    pub keepalive_timeouts: AtomicU64,
    pub too_many_pings: AtomicU64,
    pub handshake_failures: [AtomicU64; HANDSHAKE_REASONS.len()],
}

pub struct Config {
    pub keepalive_min_time: Duration,
    pub max_recv: usize,
    pub send_queue_bytes: usize,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub handshake_timeout: Duration,
    pub max_concurrent_streams: u32,
}

pub struct Shared {
    pub methods: HashMap<String, (u32, u8)>,
    pub services: HashSet<String>,
    pub queue: EventQueue,
    pub calls: Calls,
    pub next: AtomicU64,
    pub max_recv: usize,
    pub send_queue_bytes: usize,
    pub cfg: Config,
    pub stats: Stats,
    pub shutdown: watch::Sender<bool>,
    /// BRAIN_TRANSPORT_DEBUG set: failures are also printed to stderr.
    pub debug: bool,
}

impl Shared {
    pub fn new(methods: Vec<(String, u8)>, cfg: Config) -> Self {
        let services = methods
            .iter()
            .filter_map(|(p, _)| p.trim_start_matches('/').rsplit_once('/').map(|(s, _)| s.to_string()))
            .collect();
        let methods = methods.into_iter().enumerate().map(|(i, (p, k))| (p, (i as u32, k))).collect();
        Shared {
            methods,
            services,
            queue: EventQueue::new(),
            calls: Calls::new(),
            next: AtomicU64::new(1),
            max_recv: cfg.max_recv,
            send_queue_bytes: cfg.send_queue_bytes,
            cfg,
            stats: Stats::default(),
            shutdown: watch::channel(false).0,
            debug: std::env::var_os("BRAIN_TRANSPORT_DEBUG").is_some(),
        }
    }
    pub fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}
