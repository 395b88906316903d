//! The HPACK authority rewriter (brain_wire::authority) on whatever a client
//! sends after HTTP/2's preface.  Never a panic; the same output whatever
//! the cuts in the input; and when it accepts the input, the header blocks
//! h2 reads decode (with h2's own, separate table) to the client's headers
//! with every invalid authority made "localhost", or, on a TCP connection
//! whose first authority is valid, are the client's bytes untouched.
//!
//! Input: [mode and cut seed][bytes after the preface...].
#![no_main]

use brain_wire::authority::{Mode, Rewriter};
use brain_wire::http1::PREFACE;
use libfuzzer_sys::fuzz_target;

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// The complete header blocks of `bytes` (preface skipped), HEADERS'
/// padding and priority taken off, with the byte offset where the frames
/// read end; None when a frame is not what the rewriter accepts.
fn blocks(bytes: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    let mut p = PREFACE.len();
    let mut out = Vec::new();
    let mut open: Option<(u32, Vec<u8>)> = None;
    let mut done = p;
    while bytes.len() >= p + 9 {
        let len = ((bytes[p] as usize) << 16) | ((bytes[p + 1] as usize) << 8) | bytes[p + 2] as usize;
        let (kind, flags) = (bytes[p + 3], bytes[p + 4]);
        let sid = u32::from_be_bytes([bytes[p + 5], bytes[p + 6], bytes[p + 7], bytes[p + 8]]) & 0x7fff_ffff;
        if bytes.len() < p + 9 + len {
            break;
        }
        let mut body = &bytes[p + 9..p + 9 + len];
        p += 9 + len;
        if open.as_ref().is_some_and(|(s, _)| kind != 0x9 || *s != sid) {
            return None; // the rewriter refuses a header block interrupted
        }
        match kind {
            0x1 => {
                if flags & 0x8 != 0 {
                    let pad = *body.first()? as usize;
                    if 1 + pad > body.len() {
                        return None;
                    }
                    body = &body[1..body.len() - pad];
                }
                if flags & 0x20 != 0 {
                    body = body.get(5..)?;
                }
                open = Some((sid, body.to_vec()));
            }
            0x9 => match open.as_mut() {
                Some((s, b)) if *s == sid => b.extend_from_slice(body),
                _ => return None,
            },
            _ => {
                done = p;
                continue;
            }
        }
        if flags & 0x4 != 0 {
            out.push(open.take()?.1);
            done = p;
        }
    }
    Some((out, done))
}

fn decode_all(blocks: &[Vec<u8>]) -> Option<Vec<Headers>> {
    let mut d = hpack::Decoder::new();
    blocks.iter().map(|b| d.decode(b).ok()).collect()
}

fn valid(authority: &[u8]) -> bool {
    http::uri::Authority::try_from(authority).is_ok()
}

fn run(mode: bool, seed: u8, input: &[u8]) -> (Result<(), String>, Vec<u8>, Mode) {
    let mut r = if mode { Rewriter::inspecting() } else { Rewriter::rewriting() };
    let mut s = seed as u32 | 1;
    let mut rest = input;
    let mut res = Ok(());
    while !rest.is_empty() {
        s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let n = if seed == 0 { rest.len() } else { 1 + (s >> 16) as usize % rest.len().min(4096) };
        if let Err(e) = r.push(&rest[..n]) {
            res = Err(e.0);
            break;
        }
        rest = &rest[n..];
    }
    (res, r.out.to_vec(), r.mode())
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(rest);
    let inspect = sel & 1 != 0;
    let whole = run(inspect, 0, &input);
    let cut = run(inspect, sel >> 1, &input);
    assert_eq!(whole, cut, "the cuts changed the outcome");
    let (res, out, mode) = whole;
    if res.is_err() {
        return;
    }
    assert!(out.starts_with(PREFACE));
    let Some((sent, _)) = blocks(&input) else { return };
    if mode == Mode::Pass {
        // a valid first authority: everything through as it came
        assert_eq!(out, input);
        return;
    }
    let Some(want) = decode_all(&sent) else { return };
    let (read, _) = blocks(&out).expect("the rewriter wrote frames h2 cannot follow");
    let got = decode_all(&read).expect("the rewriter wrote a block its own table cannot decode");
    let want: Vec<Headers> = want
        .into_iter()
        .map(|hs| {
            hs.into_iter()
                .map(|(n, v)| if n == b":authority" && !valid(&v) { (n, b"localhost".to_vec()) } else { (n, v) })
                .collect()
        })
        .collect();
    assert_eq!(got, want);
});
