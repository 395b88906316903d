//! Listeners and connections: TCP or unix sockets, optionally TLS, then
//! HTTP/2 (gRPC, and plain HTTP requests over h2) or HTTP/1.1 on the same
//! port, told apart by the first bytes (or ALPN), as etcd's cmux does.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::oneshot;
use tokio_rustls::LazyConfigAcceptor;

use brain_wire::http1::{self as h1, Head, Request as Http1Request, Sniff};

use crate::authority::AuthorityFix;
use crate::calls::{HttpReply, Pending};
use crate::events::{Event, Peer};
use crate::grpc;
use crate::narrowing;
use crate::pings::{PingGuard, PingPolicy};
use crate::shared::{Shared, HANDSHAKE_REASONS};
use crate::tls::{self, TlsState};
use crate::x509;

pub enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// Accept connections until the transport closes.  Call inside the runtime.
pub fn spawn_listener(shared: Arc<Shared>, listener: Listener, tls: Option<Arc<TlsState>>) -> io::Result<()> {
    let mut stop = shared.shutdown.subscribe();
    match listener {
        Listener::Tcp(l) => {
            l.set_nonblocking(true)?;
            let l = TcpListener::from_std(l)?;
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        r = l.accept() => match r {
                            Ok((sock, addr)) => {
                                let _ = sock.set_nodelay(true);
                                tokio::spawn(connection(shared.clone(), sock, tls.clone(), false, addr.to_string()));
                            }
                            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        },
                        _ = stop.changed() => return,
                    }
                }
            });
        }
        Listener::Unix(l) => {
            l.set_nonblocking(true)?;
            let l = UnixListener::from_std(l)?;
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        r = l.accept() => match r {
                            // "@": an unnamed unix peer, as Go prints its address
                            Ok((sock, _)) => { tokio::spawn(connection(shared.clone(), sock, tls.clone(), true, "@".into())); }
                            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        },
                        _ = stop.changed() => return,
                    }
                }
            });
        }
    }
    Ok(())
}

struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection<S>(shared: Arc<Shared>, sock: S, tls: Option<Arc<TlsState>>, unix: bool, remote: String)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    shared.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
    shared.stats.connections_open.fetch_add(1, Ordering::Relaxed);
    let _guard = OpenGuard(shared.clone());
    let Some(tls) = tls else {
        serve(shared, sock, Arc::new(Peer { common_name: None }), None, unix).await;
        return;
    };
    // The ClientHello first, so that a refusal can name the server name
    // the client asked for, as etcd's log line does.
    let handshake = async {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), sock)
            .await
            .map_err(|e| (e, String::new()))?;
        let server_name = start.client_hello().server_name().unwrap_or("").to_string();
        start.into_stream(tls.config()).await.map_err(|e| (e, server_name))
    };
    let (stream, refused) = narrowing::capture(tokio::time::timeout(shared.cfg.handshake_timeout, handshake)).await;
    let mut stream = match stream {
        Ok(Ok(s)) => s,
        Ok(Err((e, server_name))) => {
            let reason = tls::failure_reason(&e);
            count_handshake_failure(&shared, reason);
            if shared.debug {
                eprintln!("brain transport: TLS handshake failed ({reason}): {e}");
            }
            let quiet = reason == "closed";
            let error = tls::failure_text(&e);
            shared.queue.push(Event::Rejected { remote, server_name, error, quiet, names: refused });
            return;
        }
        Err(_) => {
            count_handshake_failure(&shared, "timeout");
            let error = format!("tls: no handshake within {:?}", shared.cfg.handshake_timeout);
            shared.queue.push(Event::Rejected { remote, server_name: String::new(), error, quiet: true, names: None });
            return;
        }
    };
    let (_, conn) = stream.get_ref();
    // etcd's CRL check: after the handshake, before a byte is served
    if let Some((reason, error)) = tls.refusal(conn.peer_certificates()) {
        count_handshake_failure(&shared, reason);
        let server_name = conn.server_name().unwrap_or("").to_string();
        let names = conn.peer_certificates().and_then(|c| c.first()).map(|c| x509::alt_names(c.as_ref()));
        shared.queue.push(Event::Rejected { remote, server_name, error, quiet: false, names });
        // close_notify, then the close, as Go's tls.Conn.Close does
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
        return;
    }
    let (_, conn) = stream.get_ref();
    let common_name = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| tls::subject_common_name(c.as_ref()));
    let alpn = conn.alpn_protocol().map(|p| p.to_vec());
    serve(shared, stream, Arc::new(Peer { common_name }), alpn, unix).await;
}

fn count_handshake_failure(shared: &Shared, reason: &str) {
    let i = HANDSHAKE_REASONS.iter().position(|r| *r == reason).unwrap_or(HANDSHAKE_REASONS.len() - 1);
    shared.stats.handshake_failures[i].fetch_add(1, Ordering::Relaxed);
}

async fn serve<S>(shared: Arc<Shared>, mut io: S, peer: Arc<Peer>, alpn: Option<Vec<u8>>, unix: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let h2 = match alpn.as_deref() {
        Some(b"h2") => Some(Bytes::new()),
        Some(b"http/1.1") => None,
        _ => {
            // Sniff: HTTP/2's preface, or else HTTP/1.x (or garbage).
            let mut buf = BytesMut::with_capacity(4096);
            loop {
                let n = match tokio::time::timeout(shared.cfg.handshake_timeout, io.read_buf(&mut buf)).await {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
                if n == 0 {
                    return;
                }
                match h1::sniff(&buf) {
                    Sniff::Http1 => {
                        http1(shared, io, peer, buf).await;
                        return;
                    }
                    Sniff::Http2 => break,
                    Sniff::More => {}
                }
            }
            Some(buf.freeze())
        }
    };
    match h2 {
        // unix sockets: clients send the path as :authority (see authority.rs)
        Some(prefix) if unix => http2(shared, AuthorityFix::new(Rewind { prefix, inner: io }), peer).await,
        // TCP: only a client sending an invalid authority is rewritten
        Some(prefix) => http2(shared, AuthorityFix::inspecting(Rewind { prefix, inner: io }), peer).await,
        None => http1(shared, io, peer, BytesMut::new()).await,
    }
}

async fn http2<S>(shared: Arc<Shared>, io: S, peer: Arc<Peer>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let policy = Arc::new(PingPolicy::default());
    let io = PingGuard::new(io, policy.clone(), shared.cfg.keepalive_min_time);
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(shared.cfg.max_concurrent_streams)
        .initial_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .max_frame_size(1 << 20)
        .max_header_list_size(16 << 20)
        .max_send_buffer_size(1 << 20);
    let mut conn = match tokio::time::timeout(shared.cfg.handshake_timeout, builder.handshake::<_, Bytes>(io)).await {
        Ok(Ok(c)) => c,
        _ => return,
    };
    let dead = Arc::new(tokio::sync::Notify::new());
    let keepalive = conn.ping_pong().map(|mut pp| {
        let interval = shared.cfg.keepalive_interval;
        let timeout = shared.cfg.keepalive_timeout;
        let dead = dead.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                match tokio::time::timeout(timeout, pp.ping(h2::Ping::opaque())).await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(_)) => return,
                    Err(_) => {
                        shared.stats.keepalive_timeouts.fetch_add(1, Ordering::Relaxed);
                        dead.notify_one();
                        return;
                    }
                }
            }
        })
    });
    let mut stop = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            r = conn.accept() => match r {
                Some(Ok((req, respond))) => {
                    let shared = shared.clone();
                    let peer = peer.clone();
                    let active = ActiveCall::new(policy.clone());
                    tokio::spawn(async move {
                        request(shared, peer, req, respond).await;
                        drop(active);
                    });
                }
                _ => break,
            },
            _ = policy.notify.notified() => {
                // grpc-go's answer to a client pinging too often
                shared.stats.too_many_pings.fetch_add(1, Ordering::Relaxed);
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(Ok(_)) = conn.accept().await {}
                }).await;
                break;
            }
            _ = dead.notified() => break,
            _ = stop.changed() => break,
        }
    }
    if let Some(k) = keepalive {
        k.abort();
    }
}

/// A call in flight, for the ping policy (held by the call's task).
struct ActiveCall(Arc<PingPolicy>);

impl ActiveCall {
    fn new(p: Arc<PingPolicy>) -> Self {
        p.active.fetch_add(1, Ordering::Relaxed);
        ActiveCall(p)
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn request(shared: Arc<Shared>, peer: Arc<Peer>, req: Request<RecvStream>, respond: SendResponse<Bytes>) {
    let is_grpc = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.starts_with("application/grpc"))
        .unwrap_or(false);
    if is_grpc {
        grpc::serve_call(shared, peer, req, respond).await;
        return;
    }
    // Plain HTTP over HTTP/2 (e.g. Go's http client on https: GET /version).
    let method = req.method().as_str().to_string();
    let path = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let reply = ask_python(&shared, method, path, peer).await;
    let mut respond = respond;
    let mut r = Response::new(());
    *r.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (k, v) in &reply.headers {
        if let (Ok(k), Ok(v)) = (http::HeaderName::from_bytes(k.as_bytes()), http::HeaderValue::from_str(v)) {
            r.headers_mut().append(k, v);
        }
    }
    if let Ok(mut send) = respond.send_response(r, reply.body.is_empty()) {
        if !reply.body.is_empty() {
            let _ = send.send_data(reply.body, true);
        }
    }
}

async fn ask_python(shared: &Arc<Shared>, method: String, path: String, peer: Arc<Peer>) -> HttpReply {
    shared.stats.http_requests.fetch_add(1, Ordering::Relaxed);
    let id = shared.next_id();
    let (tx, rx) = oneshot::channel();
    shared.calls.insert(id, Pending::Http(tx));
    shared.queue.push(Event::Http { id, method, path, peer });
    match rx.await {
        Ok(r) => r,
        Err(_) => HttpReply {
            status: 503,
            headers: vec![("Content-Type".into(), "text/plain; charset=utf-8".into())],
            body: Bytes::from_static(b"server is shutting down\n"),
        },
    }
}

// -- HTTP/1.1 ------------------------------------------------------------------

const IDLE: Duration = Duration::from_secs(120);

fn reason(status: u16) -> &'static str {
    StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("")
}

async fn http1<S>(shared: Arc<Shared>, mut io: S, peer: Arc<Peer>, mut buf: BytesMut)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    loop {
        // read one request head
        let Http1Request { method, path, head_len, body_len, close } = loop {
            let refusal: &[u8] = match h1::parse_head(&buf) {
                Head::Request(r) => break r,
                Head::Partial => match tokio::time::timeout(IDLE, io.read_buf(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => continue,
                    _ => return,
                },
                // only small, length-delimited bodies are read (etcd's endpoints take none)
                Head::BodyRefused => b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n413 Request Entity Too Large",
                Head::HeadTooLarge => b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large",
                // Go's net/http answer to a malformed request
                Head::Malformed => b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request",
            };
            shared.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            let _ = io.write_all(refusal).await;
            return;
        };
        // skip the body
        while buf.len() < head_len + body_len {
            match tokio::time::timeout(IDLE, io.read_buf(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
        }
        buf.advance(head_len + body_len);
        let head_only = method == "HEAD";
        let reply = ask_python(&shared, method, path, peer.clone()).await;
        let mut out = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
        for (k, v) in &reply.headers {
            if !k.eq_ignore_ascii_case("content-length") {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
        if close {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if !head_only {
            bytes.extend_from_slice(&reply.body);
        }
        if io.write_all(&bytes).await.is_err() || io.flush().await.is_err() {
            return;
        }
        if close {
            let _ = io.shutdown().await;
            return;
        }
    }
}

// -- replaying sniffed bytes ---------------------------------------------------

struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let chunk = self.prefix.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    crate::passthrough::forward_writes!();
}
