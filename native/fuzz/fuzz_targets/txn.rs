//! etcd's TxnRequest from client bytes (brain_wire::txn).  Never a panic; a
//! message taken holds no more requests than its bytes can encode and nests
//! no deeper than MAX_DEPTH; its classifications agree with its ops.
#![no_main]

use brain_wire::txn::{parse_txn, Op, Txn, MAX_DEPTH};
use libfuzzer_sys::fuzz_target;

fn check(t: &Txn<'_>, depth: usize) -> usize {
    assert!(depth <= MAX_DEPTH + 1);
    let mut n = t.compare.len();
    for op in t.success.iter().chain(&t.failure) {
        n += 1;
        if let Op::Txn(inner) = op {
            n += check(inner, depth + 1);
        }
    }
    n
}

fuzz_target!(|data: &[u8]| {
    if let Some(t) = parse_txn(data) {
        // every compare and op takes at least its tag and length
        assert!(check(&t, 0) * 2 <= data.len());
        let all_ranges = t.success.iter().chain(&t.failure).all(|op| matches!(op, Op::Range(_)));
        assert_eq!(t.is_readonly(), all_ranges);
        if t.reads_serializable() {
            assert!(t.is_readonly());
        }
    }
});
