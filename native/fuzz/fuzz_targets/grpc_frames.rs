//! gRPC message framing (brain_wire::framing::Decoder) over DATA chunks cut
//! anywhere: the messages it gives out are those of a plain sequential
//! reading of the whole stream, whatever the cuts, up to the first message
//! over the limit (where the transport stops reading).
//!
//! Input: [limit selector][cut seed][stream...].
#![no_main]

use brain_wire::framing::{Decoded, Decoder};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

const LIMITS: [usize; 4] = [0, 7, 300, 2 * 1024 * 1024];

/// The stream read in one piece: every whole message, then what is left.
fn reference(stream: &[u8], max: usize) -> (Vec<Decoded>, usize) {
    let mut out = Vec::new();
    let mut p = stream;
    while p.len() >= 5 {
        let len = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
        if len > max {
            out.push(Decoded::Oversized(len));
            return (out, p.len());
        }
        if p.len() < 5 + len {
            break;
        }
        out.push(if p[0] & 1 != 0 { Decoded::Compressed } else { Decoded::Msg(Bytes::copy_from_slice(&p[5..5 + len])) });
        p = &p[5 + len..];
    }
    (out, p.len())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let max = LIMITS[(data[0] & 3) as usize];
    let mut seed = data[1] as u32 | 1;
    let stream = &data[2..];
    let (want, left) = reference(stream, max);

    let mut dec = Decoder::new(max);
    let mut got = Vec::new();
    let mut rest = stream;
    'feed: while !rest.is_empty() {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let n = 1 + (seed >> 16) as usize % rest.len().min(64);
        dec.push(Bytes::copy_from_slice(&rest[..n]));
        rest = &rest[n..];
        while let Some(d) = dec.next() {
            let stop = matches!(d, Decoded::Oversized(_));
            got.push(d);
            if stop {
                break 'feed;
            }
        }
    }
    let oversized = matches!(got.last(), Some(Decoded::Oversized(_)));
    assert_eq!(got, want);
    if !oversized {
        assert_eq!(dec.buffered(), left);
    }
});
