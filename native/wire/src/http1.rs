//! HTTP/1.1 on the gRPC port: telling it from HTTP/2 by the first bytes (as
//! etcd's cmux does), and reading a request head.
//!
//! Only etcd's endpoints are served over HTTP/1.1 (/health, /version,
//! /metrics, ...), which take no body: a body is read only when it is small
//! and length-delimited, and skipped.

/// The client preface every HTTP/2 connection begins with.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Go's http.DefaultMaxHeaderBytes.
pub const MAX_HEAD: usize = 1 << 20;
/// The largest body skipped; a longer one is refused.
pub const MAX_BODY: usize = 1 << 20;

#[derive(Debug, PartialEq, Eq)]
pub enum Sniff {
    /// HTTP/2's whole preface has come.
    Http2,
    /// These bytes are not HTTP/2's preface: HTTP/1.x, or garbage.
    Http1,
    /// A prefix of the preface so far: read more.
    More,
}

/// What the first bytes of a connection (without ALPN) say it speaks.
pub fn sniff(buf: &[u8]) -> Sniff {
    let k = buf.len().min(PREFACE.len());
    if buf[..k] != PREFACE[..k] {
        Sniff::Http1
    } else if buf.len() >= PREFACE.len() {
        Sniff::Http2
    } else {
        Sniff::More
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Bytes of the head, blank line included.
    pub head_len: usize,
    /// Bytes of the body that follows (Content-Length), at most MAX_BODY.
    pub body_len: usize,
    /// The connection closes after the answer (HTTP/1.0 or `Connection: close`).
    pub close: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    Request(Request),
    /// An incomplete head within MAX_HEAD: read more.
    Partial,
    /// 400 Bad Request (Go's net/http answer to a malformed request).
    Malformed,
    /// 413: a chunked body, or one longer than MAX_BODY (or unreadable length).
    BodyRefused,
    /// 431: no complete head within MAX_HEAD bytes.
    HeadTooLarge,
}

/// The request head at the start of `buf`.
pub fn parse_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => {
            let mut body_len = 0usize;
            let mut close = req.version == Some(0);
            let mut chunked = false;
            for h in req.headers.iter() {
                if h.name.eq_ignore_ascii_case("content-length") {
                    body_len = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(usize::MAX);
                } else if h.name.eq_ignore_ascii_case("connection") {
                    let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
                    if v.contains("close") {
                        close = true;
                    } else if v.contains("keep-alive") {
                        close = false;
                    }
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = true;
                }
            }
            if chunked || body_len > MAX_BODY {
                return Head::BodyRefused;
            }
            Head::Request(Request {
                method: req.method.unwrap_or("GET").to_string(),
                path: req.path.unwrap_or("/").to_string(),
                head_len: n,
                body_len,
                close,
            })
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => Head::HeadTooLarge,
        Ok(httparse::Status::Partial) => Head::Partial,
        Err(_) => Head::Malformed,
    }
}
