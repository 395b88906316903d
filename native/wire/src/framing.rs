//! gRPC's length-prefixed messages: `[flag][u32 length][message]`, written
//! whole, read from HTTP/2 DATA chunks cut anywhere.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// `[flag][u32 length][message]`, the gRPC length-prefixed message.
pub fn frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Msg(Bytes),
    /// A message longer than the decoder's maximum (its announced length):
    /// nothing more is read from the stream.
    Oversized(usize),
    /// A message with the compressed flag set (brain installs no decompressor).
    Compressed,
}

/// Splits DATA chunks into messages; whole messages inside one chunk are
/// sliced out of it without a copy.
pub struct Decoder {
    head: Bytes,
    tail: BytesMut,
    max: usize,
}

impl Decoder {
    pub fn new(max: usize) -> Self {
        Decoder { head: Bytes::new(), tail: BytesMut::new(), max }
    }

    pub fn push(&mut self, chunk: Bytes) {
        if self.head.is_empty() && self.tail.is_empty() {
            self.head = chunk;
        } else {
            if !self.head.is_empty() {
                self.tail.extend_from_slice(&self.head);
                self.head = Bytes::new();
            }
            self.tail.extend_from_slice(&chunk);
        }
    }

    /// Bytes pushed and not yet returned as a message.
    pub fn buffered(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    pub fn next(&mut self) -> Option<Decoded> {
        if !self.head.is_empty() {
            if self.head.len() >= 5 {
                let flag = self.head[0];
                let len = u32::from_be_bytes([self.head[1], self.head[2], self.head[3], self.head[4]]) as usize;
                if len > self.max {
                    return Some(Decoded::Oversized(len));
                }
                if self.head.len() >= 5 + len {
                    let m = self.head.slice(5..5 + len);
                    self.head.advance(5 + len);
                    return Some(if flag & 1 != 0 { Decoded::Compressed } else { Decoded::Msg(m) });
                }
            }
            self.tail.extend_from_slice(&self.head);
            self.head = Bytes::new();
        }
        if self.tail.len() < 5 {
            return None;
        }
        let flag = self.tail[0];
        let len = u32::from_be_bytes([self.tail[1], self.tail[2], self.tail[3], self.tail[4]]) as usize;
        if len > self.max {
            return Some(Decoded::Oversized(len));
        }
        if self.tail.len() < 5 + len {
            self.tail.reserve(5 + len - self.tail.len());
            return None;
        }
        self.tail.advance(5);
        let m = self.tail.split_to(len).freeze();
        Some(if flag & 1 != 0 { Decoded::Compressed } else { Decoded::Msg(m) })
    }
}
