//! Unix-socket clients send authorities h2 refuses; this rewriter mends them.
//!
//! grpc-go (and so etcd's clientv3 and kube-apiserver) sends the socket
//! path as HTTP/2's `:authority` on a unix:// endpoint ("/run/etcd.sock");
//! grpc-core sends it percent-encoded ("run%2Fetcd.sock").  Neither is a
//! valid URI authority, and h2 answers such a request with RST_STREAM
//! PROTOCOL_ERROR.  On unix listeners every header block the client sends
//! is decoded (HPACK, tracking the client's dynamic table), an invalid
//! `:authority` is replaced with "localhost" (nothing in brain reads it),
//! and the block is re-encoded with an encoder of its own, whose table h2's
//! decoder then mirrors.  Every other frame passes through untouched.
//!
//! On TCP listeners the same happens to a client that sends its endpoint
//! URL as the authority ("http://10.0.0.1:2379": etcdctl 3.4's `endpoint
//! status --cluster` dials member URLs that way).  Since nearly every TCP
//! client sends a valid one, a TCP connection is only *inspected*: the first
//! header block is decoded, and if its authority is valid the connection
//! passes through untouched from then on (the block is forwarded as it came,
//! so h2's table mirrors the client's); otherwise it is rewritten for good.
//!
//! The rewriter is sans-IO: `push` the client's bytes as they come (cut
//! anywhere), take what h2 should read from `out`.  An error means the
//! client's bytes are not HTTP/2 this rewriter can follow: the connection
//! ends.  The transport's reader around a socket is native/src/authority.rs.

use std::fmt;

use bytes::{BufMut, BytesMut};

use crate::hpack_check::{self, MAX_TABLE_SIZE};

const PREFACE_LEN: usize = 24;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const OUT_FRAME: usize = 16_384; // the smallest max frame size a peer allows
/// The largest header block taken in (h2's max_header_list_size in
/// server.rs): a client sending CONTINUATION frames without end cannot
/// make the rewriter hold more.
pub const MAX_BLOCK: usize = 16 << 20;

/// Why the client's bytes cannot be rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn bad(msg: &str) -> Error {
    Error(msg.to_string())
}

struct Block {
    stream_id: u32,
    end_stream: bool,
    data: Vec<u8>,
    raw: Vec<u8>, // the frames as they came (kept while inspecting)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Rewrite, // every header block is decoded and re-encoded
    Inspect, // until the first header block says whether Rewrite is needed
    Pass,    // a valid authority: bytes pass through as they come
}

pub struct Rewriter {
    inbuf: BytesMut,
    /// What h2 reads next.
    pub out: BytesMut,
    preface_left: usize,
    pass_left: usize,
    block: Option<Block>,
    decoder: hpack::Decoder<'static>,
    encoder: hpack::Encoder<'static>,
    mode: Mode,
}

impl Rewriter {
    /// Rewrites every header block (unix listeners).
    pub fn rewriting() -> Self {
        Self::with_mode(Mode::Rewrite)
    }

    /// Looks at the first header block only, and rewrites from there on
    /// only if its authority is invalid (TCP listeners).
    pub fn inspecting() -> Self {
        Self::with_mode(Mode::Inspect)
    }

    fn with_mode(mode: Mode) -> Self {
        Rewriter {
            inbuf: BytesMut::with_capacity(16_384),
            out: BytesMut::new(),
            preface_left: PREFACE_LEN,
            pass_left: 0,
            block: None,
            decoder: hpack::Decoder::new(),
            encoder: hpack::Encoder::new(),
            mode,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// True once the rest of the connection passes through as it comes
    /// (nothing is held back): the reader may read straight into h2's buffer.
    pub fn passing(&self) -> bool {
        self.mode == Mode::Pass && self.inbuf.is_empty()
    }

    /// The client's next bytes; every complete unit moves to `out`.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.inbuf.extend_from_slice(bytes);
        self.process()
    }

    fn process(&mut self) -> Result<(), Error> {
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
            let stream_id = u32::from_be_bytes([self.inbuf[5], self.inbuf[6], self.inbuf[7], self.inbuf[8]]) & 0x7fff_ffff;
            if let Some(b) = &self.block {
                // RFC 7540 6.10: nothing but the block's CONTINUATION until it ends
                // (a frame let through here would reach h2 before the block)
                if kind != CONTINUATION || stream_id != b.stream_id {
                    return Err(bad("header block interrupted"));
                }
            }
            if kind != HEADERS && kind != CONTINUATION {
                self.pass_left = 9 + len;
                continue;
            }
            if self.inbuf.len() < 9 + len {
                self.inbuf.reserve(9 + len - self.inbuf.len());
                return Ok(());
            }
            let flags = self.inbuf[4];
            let frame = self.inbuf.split_to(9 + len);
            let mut p = &frame[9..];
            if kind == HEADERS {
                if flags & PADDED != 0 {
                    let pad = *p.first().ok_or_else(|| bad("short HEADERS frame"))? as usize;
                    if 1 + pad > p.len() {
                        return Err(bad("bad padding"));
                    }
                    p = &p[1..p.len() - pad];
                }
                if flags & PRIORITY != 0 {
                    if p.len() < 5 {
                        return Err(bad("short HEADERS frame"));
                    }
                    p = &p[5..];
                }
                let raw = if self.mode == Mode::Inspect { frame.to_vec() } else { Vec::new() };
                self.block = Some(Block { stream_id, end_stream: flags & END_STREAM != 0, data: p.to_vec(), raw });
            } else {
                let inspecting = self.mode == Mode::Inspect;
                match self.block.as_mut() {
                    Some(b) => {
                        if b.data.len() + p.len() > MAX_BLOCK {
                            return Err(bad("header block too large"));
                        }
                        b.data.extend_from_slice(p);
                        if inspecting {
                            b.raw.extend_from_slice(&frame);
                        }
                    }
                    _ => return Err(bad("CONTINUATION without HEADERS")),
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
    fn inspect(&mut self, b: Block) -> Result<(), Error> {
        let headers = self.decode(&b.data)?;
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

    fn reencode(&mut self, b: Block) -> Result<(), Error> {
        let headers = self.decode(&b.data)?;
        self.emit(headers, b.stream_id, b.end_stream)
    }

    /// A header block's fields, through the client's dynamic table; checked
    /// first (hpack_check: what hpack 0.3 would panic on or take wrongly).
    fn decode(&mut self, block: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error> {
        hpack_check::check(block, MAX_TABLE_SIZE).map_err(|e| Error(format!("HPACK: {e}")))?;
        self.decoder.decode(block).map_err(|e| Error(format!("HPACK: {e:?}")))
    }

    fn emit(&mut self, mut headers: Vec<(Vec<u8>, Vec<u8>)>, stream_id: u32, end_stream: bool) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::PREFACE;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_unix_socket_authority_becomes_localhost() {
        let block = hpack::Encoder::new().encode(vec![
            (&b":method"[..], &b"POST"[..]),
            (&b":authority"[..], &b"/run/etcd.sock"[..]),
        ]);
        let mut r = Rewriter::rewriting();
        r.push(PREFACE).unwrap();
        r.push(&frame(HEADERS, END_HEADERS, 1, &block)).unwrap();
        let out = r.out.split();
        let got = hpack::Decoder::new().decode(&out[PREFACE.len() + 9..]).unwrap();
        assert_eq!(got[1], (b":authority".to_vec(), b"localhost".to_vec()));
    }

    /// Found by native/fuzz's `authority` target (its corpus keeps the input,
    /// tests/fuzz/corpus/authority/regress-size-update-cut-short): a header
    /// block ending inside a dynamic table size update made hpack 0.3 panic
    /// (decoder.rs: `decode_integer(..).ok().unwrap()`), killing the
    /// connection's task; it is now refused as bad HPACK.
    #[test]
    fn a_size_update_cut_short_is_an_error_not_a_panic() {
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0x00, 0x00, 0x02, 0x01, 0x04, 0x11, 0x30, 0x00, 0x3e, 0x35, 0x3f]);
        input.extend_from_slice(&[0x3e, 0x0d, 0x04, 0x29, 0x0a]);
        for mut r in [Rewriter::rewriting(), Rewriter::inspecting()] {
            let e = r.push(&input).unwrap_err();
            assert_eq!(e.0, "HPACK: integer cut short");
        }
    }

    /// Found by native/fuzz's `authority` target (corpus:
    /// regress-headers-interrupted): a HEADERS frame without END_HEADERS
    /// followed by another HEADERS frame.  The rewriter dropped the first
    /// (on TCP it then passed the connection on without it), so h2 never
    /// saw the protocol error; a DATA frame inside a block was let through
    /// ahead of it.  Both end the connection now, as RFC 7540 6.10 says.
    #[test]
    fn a_header_block_interrupted_is_an_error() {
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0, 0, 5, 1, 1, 0, 0, 0, 0, 0, 0, 79, 254, 0]);
        input.extend_from_slice(&[0, 0, 0, 1, 212, 255, 178, 212, 10, 0, 0, 165, 0, 0, 0, 0]);
        for mut r in [Rewriter::rewriting(), Rewriter::inspecting()] {
            assert_eq!(r.push(&input).unwrap_err().0, "header block interrupted");
            assert_eq!(&r.out[..], PREFACE, "nothing after the preface was given out");
        }
        let mut r = Rewriter::inspecting();
        r.push(PREFACE).unwrap();
        r.push(&frame(HEADERS, 0, 1, &[0x82])).unwrap();
        assert_eq!(r.push(&frame(0x0, 0, 1, b"data")).unwrap_err().0, "header block interrupted");
        assert_eq!(&r.out[..], PREFACE);
    }

    /// A client may not make the rewriter's table (which h2 never sees on a
    /// rewritten connection) grow past the size HTTP/2's settings allow.
    #[test]
    fn a_table_size_over_the_settings_is_refused() {
        let mut r = Rewriter::rewriting();
        r.push(PREFACE).unwrap();
        // size update to 2^20, then a literal field with incremental indexing
        let block = [0x3f, 0xe1, 0xff, 0x3f, 0x40, 0x01, b'a', 0x01, b'b'];
        let e = r.push(&frame(HEADERS, END_HEADERS, 1, &block)).unwrap_err();
        assert_eq!(e.0, "HPACK: table size update over the limit");
    }

    /// CONTINUATION frames without END_HEADERS: held up to MAX_BLOCK, then refused.
    #[test]
    fn an_endless_header_block_is_refused() {
        let mut r = Rewriter::rewriting();
        r.push(PREFACE).unwrap();
        r.push(&frame(HEADERS, 0, 1, &[0x82])).unwrap();
        let chunk = frame(CONTINUATION, 0, 1, &vec![0x82; 1 << 20]);
        let mut sent = 1;
        let err = loop {
            match r.push(&chunk) {
                Ok(()) => sent += 1 << 20,
                Err(e) => break e,
            }
            assert!(sent <= MAX_BLOCK, "held {sent} bytes of one header block");
        };
        assert_eq!(err.0, "header block too large");
        assert!(r.out.len() <= PREFACE.len(), "nothing of the block was given out");
    }
}
