//! The first bytes of a connection (brain_wire::http1): HTTP/2 or HTTP/1.1,
//! and an HTTP/1.1 request head.  Never a panic; a head read whole is read
//! the same from any longer buffer, and never claims more than it was given.
#![no_main]

use brain_wire::http1::{parse_head, sniff, Head, Sniff, MAX_BODY, PREFACE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match sniff(data) {
        Sniff::Http2 => assert!(data.starts_with(PREFACE)),
        Sniff::More => assert!(PREFACE.starts_with(data)),
        Sniff::Http1 => assert!(!data.is_empty()),
    }
    let head = parse_head(data);
    if let Head::Request(r) = &head {
        assert!(r.head_len <= data.len());
        assert!(r.body_len <= MAX_BODY);
        // what follows the head does not change it
        assert_eq!(parse_head(&data[..r.head_len]), head);
        // a head cut short is incomplete, or already malformed
        for cut in [r.head_len / 2, r.head_len.saturating_sub(1)] {
            let h = parse_head(&data[..cut]);
            assert!(matches!(h, Head::Partial | Head::Malformed), "{cut}: {h:?}");
        }
    }
});
