//! gRPC over HTTP/2: statuses and the per-call tasks (message framing:
//! brain-wire's framing, native/wire).
//!
//! A unary (or server-streaming) call's task reads its one request message,
//! files the call's `SendResponse` in the registry (calls.rs) and hands the call to
//! Python; Python's answer is written straight from the thread that gives
//! it (h2's send side is thread-safe), so a unary call costs one short task
//! and no channel.  A streaming call keeps a task for its life: it reads
//! messages (only while its send queue is under the limit, so a client that
//! never reads cannot make the server buffer its requests either) and
//! writes what Python queued, as the peer's flow-control window allows.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;

use brain_wire::framing::{Decoded, Decoder};
pub use brain_wire::framing::{frame, frames};
use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::sync::mpsc;

use crate::budget::Held;
use crate::calls::{self, Cmd, ConnBudget, Pending, StreamHandle, StreamState, Waiting};
use crate::events::{CallMeta, Event, Peer};
use crate::shared::Shared;

pub const KIND_UNARY: u8 = 0;
pub const KIND_SERVER_STREAM: u8 = 1;
pub const KIND_BIDI: u8 = 2;

pub const UNIMPLEMENTED: u32 = 12;
pub const INTERNAL: u32 = 13;

/// grpc-message is percent-encoded: bytes outside printable ASCII and '%'.
pub fn percent_encode(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for &b in msg.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn response_headers() -> Response<()> {
    let mut r = Response::new(());
    r.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
    r
}

pub fn status_trailers(code: u32, message: &str) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(2);
    h.insert("grpc-status", HeaderValue::from(code));
    if !message.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
            h.insert("grpc-message", v);
        }
    }
    h
}

/// A status without a response message: one HEADERS frame ending the stream
/// ("trailers-only"), as grpc-go answers failed unary calls.
pub fn fail_response(mut respond: SendResponse<Bytes>, code: u32, message: &str) {
    let mut r = response_headers();
    r.headers_mut().extend(status_trailers(code, message));
    let _ = respond.send_response(r, true);
}

pub fn respond_ok(mut respond: SendResponse<Bytes>, msg: &[u8]) {
    if let Ok(mut send) = respond.send_response(response_headers(), false) {
        let _ = send.send_data(frame(msg), false);
        let _ = send.send_trailers(status_trailers(0, ""));
    }
}

/// etcd's require-leader metadata (rpctypes.MetadataRequireLeaderKey and
/// MetadataHasLeader): as etcd reads it, the first value must be "true".
fn requires_leader(headers: &http::HeaderMap) -> bool {
    headers.get("hasleader").is_some_and(|v| v.as_bytes() == b"true")
}

/// What Python needs of a call's metadata: require-leader and etcd's auth
/// token (its TokenFieldNameGRPC "token", else TokenFieldNameSwagger
/// "authorization"; the first value, as etcd reads it).
fn call_meta(headers: &http::HeaderMap) -> CallMeta {
    let token = headers
        .get("token")
        .or_else(|| headers.get("authorization"))
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    CallMeta { require_leader: requires_leader(headers), token }
}

fn compressed_text(req_encoding: &str) -> String {
    format!("grpc: Decompressor is not installed for grpc-encoding \"{req_encoding}\"")
}

// -- the call tasks ----------------------------------------------------------

pub async fn serve_call(
    shared: Arc<Shared>,
    peer: Arc<Peer>,
    conn: Arc<ConnBudget>,
    req: Request<RecvStream>,
    respond: SendResponse<Bytes>,
) {
    let path = req.uri().path();
    let Some(&(method, kind)) = shared.methods.get(path) else {
        let (service, name) = path.trim_start_matches('/').rsplit_once('/').unwrap_or((path, ""));
        let text = if shared.services.contains(service) {
            format!("unknown method {name} for service {service}")
        } else {
            format!("unknown service {service}")
        };
        fail_response(respond, UNIMPLEMENTED, &text);
        return;
    };
    let encoding = req
        .headers()
        .get("grpc-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .to_string();
    let meta = call_meta(req.headers());
    let id = shared.next_id();
    if kind == KIND_BIDI {
        serve_stream(shared, id, method, peer, conn, meta, req.into_body(), respond, encoding, None).await;
        return;
    }
    let mut body = req.into_body();
    let mut dec = Decoder::new(shared.max_recv);
    let mut held: Option<Held> = None;
    let mut unreleased = 0usize;
    loop {
        // the message's bytes are reserved on the connection before more
        // of them are acknowledged (the budget: budget.rs)
        if held.is_none() {
            if let Some(len) = dec.peek_len().filter(|&len| len <= shared.max_recv) {
                held = Some(conn.reserve(5 + len).await);
            }
        }
        if unreleased > 0 {
            let _ = body.flow_control().release_capacity(unreleased);
            unreleased = 0;
        }
        if let Some(d) = dec.next() {
            match d {
                Decoded::Msg(payload) => {
                    if kind == KIND_SERVER_STREAM {
                        let first = Some((payload, held));
                        serve_stream(shared, id, method, peer, conn, meta, body, respond, encoding, first).await;
                        return;
                    }
                    shared.calls.insert(id, Pending::Unary(respond, held));
                    shared.queue.push(Event::Call { id, method, payload, peer, meta, held: None });
                }
                Decoded::Oversized(len) => {
                    shared.calls.insert(id, Pending::Unary(respond, None));
                    shared.queue.push(Event::Oversized { id, method, len, peer });
                }
                Decoded::Compressed => fail_response(respond, UNIMPLEMENTED, &compressed_text(&encoding)),
            }
            return;
        }
        match body.data().await {
            Some(Ok(chunk)) => {
                unreleased += chunk.len();
                dec.push(chunk);
            }
            Some(Err(_)) => return,
            None => {
                fail_response(respond, INTERNAL, "grpc: the client sent no request message");
                return;
            }
        }
    }
}

/// A streaming call once its kind is known: a bidirectional stream
/// (`first` None: its messages follow on `body`), or a server stream whose
/// one request (`first`, with the bytes it holds on the connection) is in,
/// so that its receive side is over.
#[allow(clippy::too_many_arguments)]
async fn serve_stream(
    shared: Arc<Shared>,
    id: u64,
    method: u32,
    peer: Arc<Peer>,
    conn: Arc<ConnBudget>,
    meta: CallMeta,
    body: RecvStream,
    respond: SendResponse<Bytes>,
    encoding: String,
    first: Option<(Bytes, Option<Held>)>,
) {
    let body = if first.is_some() {
        drop(body);
        None
    } else {
        Some(body)
    };
    let Some((send, rx, state)) = open_stream(&shared, id, method, respond, conn) else { return };
    let encoding = match first {
        Some((payload, held)) => {
            shared.queue.push(Event::Call { id, method, payload, peer, meta, held });
            String::new()
        }
        None => {
            shared.queue.push(Event::Open { id, method, peer, meta });
            encoding
        }
    };
    pump(shared, id, method, body, send, rx, state, encoding).await;
}

type Opened = (h2::SendStream<Bytes>, mpsc::UnboundedReceiver<Cmd>, Arc<StreamState>);

fn open_stream(
    shared: &Arc<Shared>,
    id: u64,
    method: u32,
    mut respond: SendResponse<Bytes>,
    conn: Arc<ConnBudget>,
) -> Option<Opened> {
    let send = respond.send_response(response_headers(), false).ok()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Arc::new(StreamState::new(conn, method));
    shared.calls.insert(id, Pending::Stream(StreamHandle { tx, state: state.clone() }));
    Some((send, rx, state))
}

enum SendEvent {
    Reset,
    Capacity(Option<Result<usize, h2::Error>>),
}

/// Hand h2 as much of `pending` as the stream's window allows now, then ask
/// for capacity for the rest.  False when the stream is gone.
fn flush(
    shared: &Shared,
    id: u64,
    send: &mut h2::SendStream<Bytes>,
    pending: &mut VecDeque<Bytes>,
    pending_bytes: &mut usize,
    state: &Arc<StreamState>,
) -> bool {
    let mut cap = send.capacity();
    let mut sent = 0usize;
    while cap > 0 {
        let Some(mut front) = pending.pop_front() else { break };
        let chunk = if front.len() <= cap {
            front
        } else {
            let c = front.split_to(cap);
            pending.push_front(front);
            c
        };
        cap -= chunk.len();
        sent += chunk.len();
        if send.send_data(chunk, false).is_err() {
            return false;
        }
    }
    if sent > 0 {
        *pending_bytes -= sent;
        let limit = shared.send_queue_bytes;
        // SeqCst: pairs with send() in lib.rs (store want_writable, then load
        // queued); with weaker orders both sides could miss each other.
        let left = state.queued.fetch_sub(sent, Ordering::SeqCst) - sent;
        calls::sub_queued(&state.conn, sent, limit, &shared.queue);
        shared.stats.queued.fetch_sub(sent, Ordering::Relaxed);
        if left <= limit / 2 && state.want_writable.load(Ordering::SeqCst) {
            // writable now, or once its connection is back under its budget
            calls::writable_or_wait(Waiting { id, state: state.clone() }, &shared.queue);
        }
    }
    send.reserve_capacity(*pending_bytes);
    true
}

#[allow(clippy::too_many_arguments)]
async fn pump(
    shared: Arc<Shared>,
    id: u64,
    method: u32,
    mut body: Option<RecvStream>,
    mut send: h2::SendStream<Bytes>,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    state: Arc<StreamState>,
    encoding: String,
) {
    let limit = shared.send_queue_bytes;
    let mut dec = Decoder::new(shared.max_recv);
    let mut held: Option<Held> = None;
    let mut pending: VecDeque<Bytes> = VecDeque::new();
    let mut pending_bytes = 0usize;
    let mut finishing: Option<(u32, String)> = None;
    let mut cancelled = false;
    loop {
        if pending.is_empty() {
            if let Some((code, msg)) = finishing.take() {
                let _ = send.send_trailers(status_trailers(code, &msg));
                break;
            }
        }
        let has_pending = !pending.is_empty();
        let reading = body.is_some() && state.queued.load(Ordering::Relaxed) <= limit;
        tokio::select! {
            biased;
            ev = poll_fn(|cx| {
                if let Poll::Ready(_) = send.poll_reset(cx) {
                    return Poll::Ready(SendEvent::Reset);
                }
                if has_pending {
                    if let Poll::Ready(c) = send.poll_capacity(cx) {
                        return Poll::Ready(SendEvent::Capacity(c));
                    }
                }
                Poll::Pending
            }) => match ev {
                SendEvent::Reset | SendEvent::Capacity(None) | SendEvent::Capacity(Some(Err(_))) => {
                    cancelled = true;
                    break;
                }
                SendEvent::Capacity(Some(Ok(_))) => {
                    if !flush(&shared, id, &mut send, &mut pending, &mut pending_bytes, &state) {
                        cancelled = true;
                        break;
                    }
                }
            },
            cmd = rx.recv() => match cmd {
                Some(Cmd::Data(frames)) => {
                    for f in frames {
                        pending_bytes += f.len();
                        pending.push_back(f);
                    }
                    // capacity may be assigned already (no increase to wait for)
                    if !flush(&shared, id, &mut send, &mut pending, &mut pending_bytes, &state) {
                        cancelled = true;
                        break;
                    }
                }
                Some(Cmd::Finish(code, msg)) => {
                    finishing = Some((code, msg));
                    body = None;
                }
                None => break,
            },
            data = async { body.as_mut().unwrap().data().await }, if reading => match data {
                Some(Ok(chunk)) => {
                    let n = chunk.len();
                    dec.push(chunk);
                    let mut evs = Vec::new();
                    loop {
                        // each message's bytes reserved on the connection before
                        // more are acknowledged (budget.rs); messages already
                        // decoded go to Python first, so that a wait never holds
                        // what Python would give back
                        if held.is_none() {
                            if let Some(len) = dec.peek_len().filter(|&len| len <= shared.max_recv) {
                                held = match state.conn.try_reserve(5 + len) {
                                    Some(h) => Some(h),
                                    None => {
                                        shared.queue.push_many(std::mem::take(&mut evs));
                                        Some(state.conn.reserve(5 + len).await)
                                    }
                                };
                            }
                        }
                        let Some(d) = dec.next() else { break };
                        match d {
                            Decoded::Msg(payload) => evs.push(Event::Message { id, method, payload, held: held.take() }),
                            Decoded::Oversized(len) => {
                                evs.push(Event::Oversized { id, method, len, peer: Arc::new(Peer { common_name: None }) });
                                body = None;
                                break;
                            }
                            Decoded::Compressed => {
                                finishing = Some((UNIMPLEMENTED, compressed_text(&encoding)));
                                body = None;
                                break;
                            }
                        }
                    }
                    if let Some(b) = body.as_mut() {
                        let _ = b.flow_control().release_capacity(n);
                    }
                    shared.queue.push_many(evs);
                }
                Some(Err(_)) => {
                    cancelled = true;
                    break;
                }
                None => {
                    body = None;
                    shared.queue.push(Event::HalfClosed { id, method });
                }
            },
        }
    }
    shared.calls.remove(id);
    // what Python queued and was never written leaves the connection's count
    rx.close();
    while let Ok(cmd) = rx.try_recv() {
        if let Cmd::Data(frames) = cmd {
            pending_bytes += frames.iter().map(|f| f.len()).sum::<usize>();
        }
    }
    calls::sub_queued(&state.conn, pending_bytes, limit, &shared.queue);
    shared.stats.queued.fetch_sub(pending_bytes, Ordering::Relaxed);
    if cancelled {
        shared.queue.push(Event::Cancelled { id, method });
    }
}
