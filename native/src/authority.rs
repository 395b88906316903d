//! Unix-socket clients send authorities h2 refuses; this shim mends them.
//!
//! grpc-go (and so etcd's clientv3 and kube-apiserver) sends the socket
//! path as HTTP/2's `:authority` on a unix:// endpoint ("/run/etcd.sock");
//! grpc-core sends it percent-encoded ("run%2Fetcd.sock").  Neither is a
//! valid URI authority, and h2 answers such a request with RST_STREAM
//! PROTOCOL_ERROR.  On unix listeners only, the bytes from the client pass
//! through this reader: it decodes every header block (HPACK, tracking the
//! client's dynamic table), replaces an invalid `:authority` with
//! "localhost" (nothing in brain reads it), and re-encodes the block with an
//! encoder of its own, whose table h2's decoder then mirrors.  Every other
//! frame passes through untouched.
//!
//! On TCP listeners the same happens to a client that sends its endpoint
//! URL as the authority ("http://10.0.0.1:2379": etcdctl 3.4's `endpoint
//! status --cluster` dials member URLs that way).  Since nearly every TCP
//! client sends a valid one, a TCP connection is only *inspected*: the first
//! header block is decoded, and if its authority is valid the connection
//! passes through untouched from then on (the block is forwarded as it came,
//! so h2's table mirrors the client's); otherwise it is rewritten for good.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const OUT_FRAME: usize = 16_384; // the smallest max frame size a peer allows

struct Block {
    stream_id: u32,
    end_stream: bool,
    data: Vec<u8>,
    raw: Vec<u8>, // the frames as they came (kept while inspecting)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rewrite, // every header block is decoded and re-encoded
    Inspect, // until the first header block says whether Rewrite is needed
    Pass,    // a valid authority: bytes pass through as they come
}

pub struct AuthorityFix<S> {
    inner: S,
    inbuf: BytesMut,
    out: BytesMut,
    preface_left: usize,
    pass_left: usize,
    block: Option<Block>,
    decoder: hpack::Decoder<'static>,
    encoder: hpack::Encoder<'static>,
    eof: bool,
    mode: Mode,
}

impl<S> AuthorityFix<S> {
    /// Rewrites every header block (unix listeners).
    pub fn new(inner: S) -> Self {
        Self::with_mode(inner, Mode::Rewrite)
    }

    /// Looks at the first header block only, and rewrites from there on
    /// only if its authority is invalid (TCP listeners).
    pub fn inspecting(inner: S) -> Self {
        Self::with_mode(inner, Mode::Inspect)
    }

    fn with_mode(inner: S, mode: Mode) -> Self {
        AuthorityFix {
            inner,
            inbuf: BytesMut::with_capacity(16_384),
            out: BytesMut::new(),
            preface_left: PREFACE_LEN,
            pass_left: 0,
            block: None,
            decoder: hpack::Decoder::new(),
            encoder: hpack::Encoder::new(),
            eof: false,
            mode,
        }
    }

    fn bad(msg: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
    }

    /// Move every complete unit of `inbuf` to `out`.
    fn process(&mut self) -> io::Result<()> {
        loop {
            if self.mode == Mode::Pass {
                let all = self.inbuf.split();
                self.out.extend_from_slice(&all);
                return Ok(());
            }
            let pass = if self.preface_left > 0 { &mut self.preface_left } else { &mut self.pass_left };
            if *pass > 0 {
                let n = (*pass).min(self.inbuf.len());
                if n == 0 {
                    return Ok(());
                }
                *pass -= n;
                let chunk = self.inbuf.split_to(n);
                self.out.extend_from_slice(&chunk);
                continue;
            }
            if self.inbuf.len() < 9 {
                return Ok(());
            }
            let len = ((self.inbuf[0] as usize) << 16) | ((self.inbuf[1] as usize) << 8) | self.inbuf[2] as usize;
            let kind = self.inbuf[3];
            if kind != HEADERS && kind != CONTINUATION {
                self.pass_left = 9 + len;
                continue;
            }
            if self.inbuf.len() < 9 + len {
                self.inbuf.reserve(9 + len - self.inbuf.len());
                return Ok(());
            }
            let flags = self.inbuf[4];
            let stream_id = u32::from_be_bytes([self.inbuf[5], self.inbuf[6], self.inbuf[7], self.inbuf[8]]) & 0x7fff_ffff;
            let frame = self.inbuf.split_to(9 + len);
            let mut p = &frame[9..];
            if kind == HEADERS {
                if flags & PADDED != 0 {
                    let pad = *p.first().ok_or_else(|| Self::bad("short HEADERS frame"))? as usize;
                    if 1 + pad > p.len() {
                        return Err(Self::bad("bad padding"));
                    }
                    p = &p[1..p.len() - pad];
                }
                if flags & PRIORITY != 0 {
                    if p.len() < 5 {
                        return Err(Self::bad("short HEADERS frame"));
                    }
                    p = &p[5..];
                }
                let raw = if self.mode == Mode::Inspect { frame.to_vec() } else { Vec::new() };
                self.block = Some(Block { stream_id, end_stream: flags & END_STREAM != 0, data: p.to_vec(), raw });
            } else {
                let inspecting = self.mode == Mode::Inspect;
                match self.block.as_mut() {
                    Some(b) if b.stream_id == stream_id => {
                        b.data.extend_from_slice(p);
                        if inspecting {
                            b.raw.extend_from_slice(&frame);
                        }
                    }
                    _ => return Err(Self::bad("CONTINUATION without HEADERS")),
                }
            }
            if flags & END_HEADERS != 0 {
                let b = self.block.take().unwrap();
                if self.mode == Mode::Inspect {
                    self.inspect(b)?;
                } else {
                    self.reencode(b)?;
                }
            }
        }
    }

    /// The first header block of a TCP connection: forwarded as it came
    /// (and the connection passed through from now on) when its authority
    /// is valid, else rewritten (and every later block too).
    fn inspect(&mut self, b: Block) -> io::Result<()> {
        let headers = self.decoder.decode(&b.data).map_err(|e| Self::bad(&format!("HPACK: {e:?}")))?;
        let invalid = headers.iter().any(|(name, value)| {
            name.as_slice() == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err()
        });
        if invalid {
            self.mode = Mode::Rewrite;
            return self.emit(headers, b.stream_id, b.end_stream);
        }
        self.out.extend_from_slice(&b.raw);
        self.mode = Mode::Pass;
        Ok(())
    }

    fn reencode(&mut self, b: Block) -> io::Result<()> {
        let headers = self.decoder.decode(&b.data).map_err(|e| Self::bad(&format!("HPACK: {e:?}")))?;
        self.emit(headers, b.stream_id, b.end_stream)
    }

    fn emit(&mut self, mut headers: Vec<(Vec<u8>, Vec<u8>)>, stream_id: u32, end_stream: bool) -> io::Result<()> {
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
                *value = b"localhost".to_vec();
            }
        }
        let block = self.encoder.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
        let mut rest = &block[..];
        let mut first = true;
        loop {
            let n = rest.len().min(OUT_FRAME);
            let last = n == rest.len();
            let kind = if first { HEADERS } else { CONTINUATION };
            let mut flags = if last { END_HEADERS } else { 0 };
            if first && end_stream {
                flags |= END_STREAM;
            }
            self.out.put_u8((n >> 16) as u8);
            self.out.put_u8((n >> 8) as u8);
            self.out.put_u8(n as u8);
            self.out.put_u8(kind);
            self.out.put_u8(flags);
            self.out.put_u32(stream_id);
            self.out.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            first = false;
            if last {
                return Ok(());
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.mode == Mode::Pass && this.inbuf.is_empty() {
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
                    this.inbuf.extend_from_slice(rb.filled());
                    this.process()?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    crate::passthrough::forward_writes!();
}
