//! --grpc-keepalive-min-time: clients that ping too often are sent away,
//! as grpc-go's server does for etcd.
//!
//! h2 answers PINGs itself and does not tell its user, so this reader
//! watches the client's frame headers go by (it never changes a byte).  The
//! rule is grpc-go's: a PING sooner than the minimum interval after the
//! previous one is a strike (with no call in flight, sooner than 2 h: etcd
//! sets PermitWithoutStream false); a client that sent HEADERS or DATA
//! since its last PING starts again from zero strikes (grpc-go resets them
//! when the server writes, which a live call makes it do); more than two
//! strikes and the connection ends with GOAWAY ENHANCE_YOUR_CALM.

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

pub struct PingGuard<S> {
    inner: S,
    policy: Arc<PingPolicy>,
    min_time: Duration,
    skip: usize,             // bytes of preface or frame payload still to pass
    head: [u8; 9],           // a frame header being read
    head_len: usize,
    last_ping: Option<Instant>,
    strikes: u32,
    activity: bool,
}

impl<S> PingGuard<S> {
    pub fn new(inner: S, policy: Arc<PingPolicy>, min_time: Duration) -> Self {
        PingGuard {
            inner,
            policy,
            min_time,
            skip: PREFACE_LEN,
            head: [0; 9],
            head_len: 0,
            last_ping: None,
            strikes: 0,
            activity: false,
        }
    }

    fn frame(&mut self) {
        let kind = self.head[3];
        let flags = self.head[4];
        if kind == HEADERS || kind == DATA {
            self.activity = true;
        } else if kind == PING && flags & ACK == 0 {
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
    }

    fn observe(&mut self, mut bytes: &[u8]) {
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
                self.frame();
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PingGuard<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.observe(&buf.filled()[before..]);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PingGuard<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
