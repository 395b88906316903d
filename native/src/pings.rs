//! --grpc-keepalive-min-time: clients that ping too often are sent away,
//! as grpc-go's server does for etcd.
//!
//! h2 answers PINGs itself and does not tell its user, so this reader
//! watches the client's frame headers go by (it never changes a byte).  The
//! rule is grpc-go's: a PING sooner than the minimum interval after the
//! previous one is a strike (with no call in flight, sooner than 2 h: etcd
//! sets PermitWithoutStream false); when the server sent HEADERS or DATA
//! since the client's last PING the strikes start again from zero (as
//! grpc-go resets them on every write: a client's BDP pings on a busy
//! stream are never strikes); more than two strikes and the connection
//! ends with GOAWAY ENHANCE_YOUR_CALM.  Frames written are watched too.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

const PREFACE_LEN: usize = 24;
const PING: u8 = 0x6;
const HEADERS: u8 = 0x1;
const DATA: u8 = 0x0;
const ACK: u8 = 0x1;
const MAX_STRIKES: u32 = 2;
const IDLE_MIN: Duration = Duration::from_secs(2 * 60 * 60);

/// What the connection loop and the guard share.
#[derive(Default)]
pub struct PingPolicy {
    /// Calls in flight on the connection.
    pub active: AtomicUsize,
    /// Set when the client broke the rule; `notify` wakes the loop.
    pub violated: AtomicBool,
    pub notify: Notify,
}

/// Finds frame headers in a byte stream cut anywhere.
struct Frames {
    skip: usize,   // bytes of preface or frame payload still to pass
    head: [u8; 9], // a frame header being gathered
    head_len: usize,
}

impl Frames {
    fn new(skip: usize) -> Self {
        Frames { skip, head: [0; 9], head_len: 0 }
    }

    /// Calls `f(kind, flags)` for every frame header completed in `bytes`.
    fn feed(&mut self, mut bytes: &[u8], mut f: impl FnMut(u8, u8)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len == 9 {
                self.head_len = 0;
                self.skip = ((self.head[0] as usize) << 16) | ((self.head[1] as usize) << 8) | self.head[2] as usize;
                f(self.head[3], self.head[4]);
            }
        }
    }
}

pub struct PingGuard<S> {
    inner: S,
    policy: Arc<PingPolicy>,
    min_time: Duration,
    read: Frames,
    written: Frames,
    last_ping: Option<Instant>,
    strikes: u32,
    /// The server sent HEADERS or DATA since the client's last PING
    /// (grpc-go resets the strikes then).
    activity: bool,
}

impl<S> PingGuard<S> {
    pub fn new(inner: S, policy: Arc<PingPolicy>, min_time: Duration) -> Self {
        PingGuard {
            inner,
            policy,
            min_time,
            read: Frames::new(PREFACE_LEN),
            written: Frames::new(0),
            last_ping: None,
            strikes: 0,
            activity: false,
        }
    }

    fn client_frame(&mut self, kind: u8, flags: u8) {
        if kind != PING || flags & ACK != 0 {
            return;
        }
        let now = Instant::now();
        if std::mem::take(&mut self.activity) {
            self.strikes = 0;
        } else if let Some(last) = self.last_ping {
            let min = if self.policy.active.load(Ordering::Relaxed) == 0 { IDLE_MIN } else { self.min_time };
            if now.duration_since(last) < min {
                self.strikes += 1;
            }
        }
        self.last_ping = Some(now);
        if self.strikes > MAX_STRIKES && !self.policy.violated.swap(true, Ordering::AcqRel) {
            self.policy.notify.notify_one();
        }
    }

    fn observe_read(&mut self, bytes: &[u8]) {
        let mut frames = std::mem::replace(&mut self.read, Frames::new(0));
        frames.feed(bytes, |kind, flags| self.client_frame(kind, flags));
        self.read = frames;
    }

    fn observe_written(&mut self, bytes: &[u8]) {
        let mut active = false;
        self.written.feed(bytes, |kind, _| active |= kind == HEADERS || kind == DATA);
        self.activity |= active;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PingGuard<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.observe_read(&buf.filled()[before..]);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PingGuard<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.observe_written(&buf[..n]);
        }
        r
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = r {
            for b in bufs {
                let k = n.min(b.len());
                this.observe_written(&b[..k]);
                n -= k;
                if n == 0 {
                    break;
                }
            }
        }
        r
    }
    crate::passthrough::forward_flush_and_shutdown!();
}
