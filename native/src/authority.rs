//! The reader that puts a connection's bytes through brain-wire's HPACK
//! authority rewriter (native/wire/src/authority.rs, which says why): on
//! unix listeners every header block is rewritten, on TCP listeners only
//! those of a connection whose first block carries an invalid authority.
//! h2 reads what the rewriter gives out; writes pass through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use brain_wire::authority::Rewriter;
use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct AuthorityFix<S> {
    inner: S,
    fix: Rewriter,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    /// Rewrites every header block (unix listeners).
    pub fn new(inner: S) -> Self {
        AuthorityFix { inner, fix: Rewriter::rewriting(), eof: false }
    }

    /// Looks at the first header block only, and rewrites from there on
    /// only if its authority is invalid (TCP listeners).
    pub fn inspecting(inner: S) -> Self {
        AuthorityFix { inner, fix: Rewriter::inspecting(), eof: false }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let out = &mut this.fix.out;
            if !out.is_empty() {
                let n = out.len().min(buf.remaining());
                buf.put_slice(&out[..n]);
                out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.fix.passing() {
                // a known-good connection reads straight into the caller's buffer
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut tmp = [0u8; 16_384];
            let mut rb = ReadBuf::new(&mut tmp);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                        continue;
                    }
                    if let Err(e) = this.fix.push(rb.filled()) {
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    crate::passthrough::forward_writes!();
}
