//! The write side of the byte-stream wrappers, written once.
//!
//! Three wrappers sit between a socket and h2 and change or watch only
//! what is read (server.rs's Rewind, authority.rs's AuthorityFix) or also
//! watch what is written (pings.rs's PingGuard); what they pass on to their
//! `inner` stream unchanged is these macros, expanded inside their
//! `impl AsyncWrite` blocks.

/// `is_write_vectored`, `poll_flush` and `poll_shutdown`, forwarded to `self.inner`.
macro_rules! forward_flush_and_shutdown {
    () => {
        fn is_write_vectored(&self) -> bool {
            self.inner.is_write_vectored()
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    };
}

/// Every `AsyncWrite` method, forwarded to `self.inner`.
macro_rules! forward_writes {
    () => {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
        }
        $crate::passthrough::forward_flush_and_shutdown!();
    };
}

pub(crate) use forward_flush_and_shutdown;
pub(crate) use forward_writes;
