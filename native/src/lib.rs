//! brain._transport: the native transport under brain's etcd API.
//!
//! Rust does the bytes (sockets, TLS, HTTP/2, gRPC framing, HTTP/1.1);
//! Python does everything above them.  The face Python sees is small and
//! sans-IO-like:
//!
//! * events out, in batches: `recv_batch(n)` returns tuples
//!   `(kind, id, a, b, c)` (see `EV_*`; calls carry method id, payload and
//!   the client certificate's common name; a call or stream with etcd's
//!   `hasleader: true` metadata has `REQUIRE_LEADER` or-ed into its kind,
//!   one with an auth token `AUTH_TOKEN`, and then (name, token) as its last item;
//!   a refused TLS connection is `(EV_REJECTED, quiet, remote address,
//!   server name, (error, ip addresses, dns names))`, for the log, the
//!   names None unless the client's certificate was read and refused);
//! * bytes in: `respond` / `fail` a unary call, `send` messages on a stream
//!   (False: its queue is full, an EV_WRITABLE follows when it drains),
//!   `finish` a stream with a status, `http_respond` to an HTTP request.
//!
//! One more function encodes the KeyValues of a list (`kvenc`): the
//! protobuf bytes of the only response part whose size grows with the data;
//! `txndec` and `txnenc` read a TxnRequest into brain's request objects and
//! write a TxnResponse from its result objects, the two ends of every
//! Kubernetes write.
//!
//! The GIL is released while `recv_batch` waits and while the transport
//! closes; I/O runs on tokio threads that never take it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict, PyList};

mod authority;
mod budget;
mod calls;
mod events;
mod grpc;
mod kvenc;
mod passthrough;
mod pings;
mod server;
mod shared;
mod narrowing;
mod tls;
mod txndec;
mod txnenc;
mod x509;

use calls::{Cmd, HttpReply, Pending};
use events::*;
use server::Listener;
use shared::{Config, Shared, HANDSHAKE_REASONS};

/// (cert, key, ca or None, client_auth, tls12 cipher suites, tls13 only,
/// tls12 only, allowed CNs, allowed hostnames, CRL file or None).
type TlsArgs = (String, String, Option<String>, bool, Vec<String>, bool, bool, Vec<String>, Vec<String>, Option<String>);

#[pyclass(module = "brain._transport", frozen)]
struct Transport {
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    io_threads: usize,
    bound: Mutex<Vec<(Listener, Option<Arc<tls::TlsState>>)>>,
}

/// An io::Error as Python's OSError(errno, strerror), so callers can word
/// it as Go does ("address already in use").
/// A call's or stream's event kind and its last item: the client
/// certificate's common name, or (name, token) with `AUTH_TOKEN` or-ed in.
fn caller<'py>(py: Python<'py>, base: u8, peer: &Peer, meta: CallMeta) -> PyResult<(u8, Bound<'py, PyAny>)> {
    let mut kind = if meta.require_leader { base | REQUIRE_LEADER } else { base };
    let cn = peer.common_name.as_deref();
    let who = match meta.token {
        Some(token) => {
            kind |= AUTH_TOKEN;
            (cn, token).into_pyobject(py)?.into_any()
        }
        None => cn.into_pyobject(py)?.into_any(),
    };
    Ok((kind, who))
}

fn os_error(e: std::io::Error) -> PyErr {
    match e.raw_os_error() {
        Some(code) => {
            let text = std::io::Error::from_raw_os_error(code).to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_string();
            pyo3::exceptions::PyOSError::new_err((code, text))
        }
        None => pyo3::exceptions::PyOSError::new_err(e.to_string()),
    }
}

fn tls_state(args: Option<TlsArgs>) -> PyResult<Option<Arc<tls::TlsState>>> {
    let Some((cert_file, key_file, ca_file, client_auth, cipher_suites, min_tls13, max_tls12, cns, hostnames, crl_file)) =
        args
    else {
        return Ok(None);
    };
    let allowed = narrowing::Allowed { cns, hostnames };
    let s = tls::TlsSettings {
        cert_file,
        key_file,
        ca_file,
        client_auth,
        cipher_suites,
        min_tls13,
        max_tls12,
        allowed,
        crl_file,
    };
    tls::TlsState::new(s).map(|t| Some(Arc::new(t))).map_err(PyValueError::new_err)
}

#[pymethods]
impl Transport {
    /// `methods`: [(path, kind)] with kind 0 unary, 1 server streaming,
    /// 2 bidirectional; a method's id is its index.
    #[new]
    #[pyo3(signature = (methods, *, io_threads=1, max_recv_bytes=2_097_152, send_queue_bytes=4_194_304,
                        keepalive_interval_ms=7_200_000, keepalive_timeout_ms=20_000, keepalive_min_time_ms=5_000,
                        handshake_timeout_ms=20_000, max_concurrent_streams=u32::MAX, max_connections=usize::MAX,
                        max_connection_bytes=usize::MAX))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        methods: Vec<(String, u8)>,
        io_threads: usize,
        max_recv_bytes: usize,
        send_queue_bytes: usize,
        keepalive_interval_ms: u64,
        keepalive_timeout_ms: u64,
        keepalive_min_time_ms: u64,
        handshake_timeout_ms: u64,
        max_concurrent_streams: u32,
        max_connections: usize,
        max_connection_bytes: usize,
    ) -> PyResult<Self> {
        let cfg = Config {
            keepalive_min_time: Duration::from_millis(keepalive_min_time_ms),
            max_recv: max_recv_bytes,
            send_queue_bytes,
            keepalive_interval: Duration::from_millis(keepalive_interval_ms.max(1)),
            keepalive_timeout: Duration::from_millis(keepalive_timeout_ms.max(1)),
            handshake_timeout: Duration::from_millis(handshake_timeout_ms.max(1)),
            max_concurrent_streams,
            max_connections,
            max_connection_bytes,
        };
        Ok(Transport {
            shared: Arc::new(Shared::new(methods, cfg)),
            runtime: Mutex::new(None),
            io_threads: io_threads.max(1),
            bound: Mutex::new(Vec::new()),
        })
    }

    /// Bind a TCP listener now (a taken port fails here); returns the port.
    /// `tls`: a `TlsArgs` tuple (brain.api.native_listeners.TlsFiles makes
    /// it) or None for plaintext.
    #[pyo3(signature = (host, port, tls=None))]
    fn listen_tcp(&self, host: &str, port: u16, tls: Option<TlsArgs>) -> PyResult<u16> {
        let tls = tls_state(tls)?;
        let l = std::net::TcpListener::bind((host, port)).map_err(os_error)?;
        let port = l.local_addr().map_err(os_error)?.port();
        self.bound.lock().push((Listener::Tcp(l), tls));
        Ok(port)
    }

    /// Adopt a listening TCP socket the caller opened (and bound, and set
    /// options on, such as SO_REUSEPORT); the transport owns the fd from
    /// here.  Returns its port.
    #[pyo3(signature = (fd, tls=None))]
    fn listen_tcp_fd(&self, fd: i32, tls: Option<TlsArgs>) -> PyResult<u16> {
        use std::os::fd::FromRawFd;
        let tls = tls_state(tls)?;
        // SAFETY: the caller hands over a listening socket it no longer uses.
        let l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        let port = l.local_addr().map_err(os_error)?.port();
        self.bound.lock().push((Listener::Tcp(l), tls));
        Ok(port)
    }

    #[pyo3(signature = (path, tls=None))]
    fn listen_unix(&self, path: &str, tls: Option<TlsArgs>) -> PyResult<()> {
        let tls = tls_state(tls)?;
        let l = std::os::unix::net::UnixListener::bind(path).map_err(os_error)?;
        self.bound.lock().push((Listener::Unix(l), tls));
        Ok(())
    }

    /// Start accepting on every bound listener.
    fn start(&self) -> PyResult<()> {
        let mut rt_slot = self.runtime.lock();
        if rt_slot.is_none() {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(self.io_threads)
                .thread_name("brain-io")
                .enable_all()
                .build()?;
            *rt_slot = Some(rt);
        }
        let rt = rt_slot.as_ref().unwrap();
        let _enter = rt.enter();
        for (l, tls) in self.bound.lock().drain(..) {
            server::spawn_listener(self.shared.clone(), l, tls)?;
        }
        Ok(())
    }

    /// Up to `max` events, waiting (GIL released) until there is one or
    /// `wake()` is called (then possibly none); None once closed.
    fn recv_batch<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Option<Bound<'py, PyList>>> {
        let shared = self.shared.clone();
        let Some(evs) = py.allow_threads(move || shared.queue.take(max)) else {
            return Ok(None);
        };
        let list = PyList::empty(py);
        for ev in evs {
            let item = match ev {
                Event::Call { id, method, payload, peer, meta, held: _ } => {
                    let (kind, who) = caller(py, EV_CALL, &peer, meta)?;
                    (kind, id, method, PyBytes::new(py, &payload), who).into_pyobject(py)?
                }
                Event::Open { id, method, peer, meta } => {
                    let (kind, who) = caller(py, EV_OPEN, &peer, meta)?;
                    (kind, id, method, py.None(), who).into_pyobject(py)?
                }
                Event::Message { id, method, payload, held: _ } => {
                    (EV_MESSAGE, id, method, PyBytes::new(py, &payload), py.None()).into_pyobject(py)?
                }
                Event::HalfClosed { id, method } => (EV_HALF_CLOSED, id, method, py.None(), py.None()).into_pyobject(py)?,
                Event::Cancelled { id, method } => (EV_CANCELLED, id, method, py.None(), py.None()).into_pyobject(py)?,
                Event::Writable { id, method } => (EV_WRITABLE, id, method, py.None(), py.None()).into_pyobject(py)?,
                Event::Oversized { id, method, len, peer } => {
                    (EV_OVERSIZED, id, method, len, peer.common_name.as_deref()).into_pyobject(py)?
                }
                Event::Http { id, method, path, peer } => {
                    (EV_HTTP, id, method, path, peer.common_name.as_deref()).into_pyobject(py)?
                }
                Event::Rejected { remote, server_name, error, quiet, names } => {
                    let (ips, dns) = match names {
                        Some(n) => (Some(n.ip_strings()), Some(n.dns)),
                        None => (None, None),
                    };
                    (EV_REJECTED, quiet as u64, remote, server_name, (error, ips, dns)).into_pyobject(py)?
                }
            };
            list.append(item)?;
        }
        Ok(Some(list))
    }

    /// Answer a unary call with one message (status OK).
    fn respond(&self, id: u64, data: &[u8]) {
        if let Some(Pending::Unary(r, _held)) = self.shared.calls.remove(id) {
            grpc::respond_ok(r, data);
        }
    }

    /// Answer many unary calls: [(id, message)].  The HTTP/2 work runs with
    /// the GIL released, so Python's other threads go on meanwhile.
    fn respond_many(&self, py: Python<'_>, items: Vec<(u64, PyBackedBytes)>) {
        let shared = self.shared.clone();
        py.allow_threads(move || {
            for (id, data) in items {
                if let Some(Pending::Unary(r, _held)) = shared.calls.remove(id) {
                    grpc::respond_ok(r, &data);
                }
            }
        });
    }

    /// End a call with a status: a unary call at once; a stream after the
    /// messages already queued on it.
    fn fail(&self, id: u64, code: u32, message: &str) {
        self.finish(id, code, message)
    }

    fn finish(&self, id: u64, code: u32, message: &str) {
        if let Some((tx, _)) = self.shared.calls.stream(id) {
            let _ = tx.send(Cmd::Finish(code, message.to_string()));
            return;
        }
        match self.shared.calls.remove(id) {
            Some(Pending::Unary(r, _held)) => grpc::fail_response(r, code, message),
            Some(other) => {
                if let Pending::Http(tx) = other {
                    let _ = tx.send(HttpReply { status: 500, headers: vec![], body: Bytes::from(message.to_string()) });
                }
            }
            None => {}
        }
    }

    /// Queue messages on a stream.  False when its queue is now over the
    /// limit, or its connection's queues are over --max-connection-bytes:
    /// stop sending until an EV_WRITABLE event for it (the messages given
    /// here are kept either way).  True for a stream that is gone.
    fn send(&self, id: u64, messages: Vec<PyBackedBytes>) -> bool {
        let Some((tx, state)) = self.shared.calls.stream(id) else { return true };
        let frames = vec![grpc::frames(&messages)];
        let n: usize = frames[0].len();
        use std::sync::atomic::Ordering::{Relaxed, SeqCst};
        let queued = state.queued.fetch_add(n, SeqCst) + n;
        let conn_over = state.conn.add_queued(n);
        self.shared.stats.queued.fetch_add(n, Relaxed);
        if tx.send(Cmd::Data(frames)).is_err() {
            // the stream's task is gone and never counted these
            calls::sub_queued(&state.conn, n, self.shared.send_queue_bytes, &self.shared.queue);
            self.shared.stats.queued.fetch_sub(n, Relaxed);
            return true;
        }
        let limit = self.shared.send_queue_bytes;
        if queued > limit || conn_over {
            state.want_writable.store(true, SeqCst);
            if conn_over {
                self.shared.stats.queued_full.fetch_add(1, Relaxed);
                calls::wait_for_drain(calls::Waiting { id, state: state.clone() });
            }
            // it may have drained meanwhile: check again (see grpc::flush)
            if state.queued.load(SeqCst) > limit / 2 || state.conn.over_half() {
                return false;
            }
            // drained: nobody needs telling (a Writable may still come; harmless)
            state.want_writable.store(false, SeqCst);
        }
        true
    }

    /// Bytes a stream may be sent before `send` reports it full (its own
    /// queue's room, or its connection's if less); 0 for a stream that is
    /// gone or full.
    fn room(&self, id: u64) -> usize {
        let Some((_, state)) = self.shared.calls.stream(id) else { return 0 };
        state.room(self.shared.send_queue_bytes)
    }

    fn is_stream(&self, id: u64) -> bool {
        self.shared.calls.is_stream(id)
    }

    /// Answer an HTTP request.
    fn http_respond(&self, id: u64, status: u16, headers: Vec<(String, String)>, body: &[u8]) {
        if let Some(Pending::Http(tx)) = self.shared.calls.remove(id) {
            let _ = tx.send(HttpReply { status, headers, body: Bytes::copy_from_slice(body) });
        }
    }

    /// Make a waiting `recv_batch` return.
    fn wake(&self) {
        self.shared.queue.wake();
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.shared.stats;
        let d = PyDict::new(py);
        d.set_item("connections_accepted", s.connections_accepted.load(Relaxed))?;
        d.set_item("connections_open", s.connections_open.load(Relaxed))?;
        d.set_item("http_requests", s.http_requests.load(Relaxed))?;
        d.set_item("bad_requests", s.bad_requests.load(Relaxed))?;
        d.set_item("keepalive_timeouts", s.keepalive_timeouts.load(Relaxed))?;
        d.set_item("too_many_pings", s.too_many_pings.load(Relaxed))?;
        d.set_item("connections_refused", s.connections_refused.load(Relaxed))?;
        d.set_item("streams_open", s.streams_open.load(Relaxed))?;
        d.set_item("streams_at_limit", s.streams_at_limit.load(Relaxed))?;
        d.set_item("received_bytes", s.budget.received_held.load(Relaxed))?;
        d.set_item("received_full", s.budget.received_full.load(Relaxed))?;
        d.set_item("queued_bytes", s.queued.load(Relaxed))?;
        d.set_item("queued_full", s.queued_full.load(Relaxed))?;
        let f = PyDict::new(py);
        for (i, r) in HANDSHAKE_REASONS.iter().enumerate() {
            f.set_item(*r, s.handshake_failures[i].load(Relaxed))?;
        }
        d.set_item("tls_handshake_failures", f)?;
        Ok(d)
    }

    /// Stop accepting, drop every connection and make `recv_batch` return
    /// None.  Calls not yet answered are dropped with their connections.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let _ = self.shared.shutdown.send(true);
        self.shared.queue.close();
        let rt = self.runtime.lock().take();
        let shared = self.shared.clone();
        py.allow_threads(move || {
            shared.calls.clear();
            if let Some(rt) = rt {
                rt.shutdown_timeout(Duration::from_millis(500));
            }
        });
        self.bound.lock().clear();
        Ok(())
    }
}

/// Load TLS files as a listener would (ValueError says what is wrong).
#[pyfunction]
fn check_tls(tls: TlsArgs) -> PyResult<()> {
    tls_state(Some(tls)).map(|_| ())
}

/// How many serial numbers a DER CRL revokes, read as etcd reads a
/// --client-crl-file (ValueError with Go's text when it cannot be).
#[pyfunction]
fn crl_revoked_count(der: &[u8]) -> PyResult<usize> {
    x509::revoked_serials(der).map(|s| s.len()).map_err(PyValueError::new_err)
}

/// rustls' names of the cipher suites this transport implements.
#[pyfunction]
fn supported_cipher_suites() -> Vec<String> {
    rustls::crypto::ring::default_provider()
        .cipher_suites
        .iter()
        .map(|cs| format!("{:?}", cs.suite()))
        .collect()
}

#[pymodule]
fn _transport(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Transport>()?;
    m.add_class::<txndec::TxnDecoder>()?;
    m.add_class::<txnenc::TxnEncoder>()?;
    m.add_function(wrap_pyfunction!(supported_cipher_suites, m)?)?;
    m.add_function(wrap_pyfunction!(check_tls, m)?)?;
    m.add_function(wrap_pyfunction!(crl_revoked_count, m)?)?;
    m.add_function(wrap_pyfunction!(kvenc::encode_key_values, m)?)?;
    m.add("EV_CALL", EV_CALL)?;
    m.add("EV_OPEN", EV_OPEN)?;
    m.add("EV_MESSAGE", EV_MESSAGE)?;
    m.add("EV_HALF_CLOSED", EV_HALF_CLOSED)?;
    m.add("EV_CANCELLED", EV_CANCELLED)?;
    m.add("EV_WRITABLE", EV_WRITABLE)?;
    m.add("EV_OVERSIZED", EV_OVERSIZED)?;
    m.add("EV_HTTP", EV_HTTP)?;
    m.add("EV_REJECTED", EV_REJECTED)?;
    m.add("REQUIRE_LEADER", REQUIRE_LEADER)?;
    m.add("AUTH_TOKEN", AUTH_TOKEN)?;
    m.add("KIND_UNARY", grpc::KIND_UNARY)?;
    m.add("KIND_SERVER_STREAM", grpc::KIND_SERVER_STREAM)?;
    m.add("KIND_BIDI", grpc::KIND_BIDI)?;
    Ok(())
}
