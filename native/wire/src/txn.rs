//! etcd's `TxnRequest` read straight from its protobuf bytes, for the one
//! request that dominates a Kubernetes cluster's writes: every node Lease
//! renewal, pod create and status update is a Txn (a compare on the key's
//! mod revision, a Put, a Range).  Reading it through the Python protobuf
//! runtime and then field by field into brain's own request objects cost
//! about 40% of the front thread's time under that load (issue 24).
//!
//! Only messages a protobuf encoder writes are taken: every field known and
//! with its declared wire type, each `RequestOp` holding at most one
//! request.  Anything else (an unknown or mistyped field, a message field
//! repeated, which protobuf merges, nesting deeper than `MAX_DEPTH`,
//! truncation) returns `None`, and the caller parses the message with the
//! protobuf runtime, which then decides, errors included.  So this decoder
//! never accepts a message the runtime would read differently.
//!
//! Field numbers (etcd's rpc.proto):
//! * TxnRequest: compare = 1, success = 2, failure = 3 (repeated messages);
//! * Compare: result = 1, target = 2 (enums), key = 3, the oneof
//!   target_union version = 4, create_revision = 5, mod_revision = 6 (int64),
//!   value = 7 (bytes), lease = 8 (int64); range_end = 64;
//! * RequestOp: the oneof request_range = 1, request_put = 2,
//!   request_delete_range = 3, request_txn = 4;
//! * RangeRequest: key = 1, range_end = 2, limit = 3, revision = 4,
//!   sort_order = 5, sort_target = 6, serializable = 7, keys_only = 8,
//!   count_only = 9, min/max_mod_revision = 10/11, min/max_create_revision
//!   = 12/13;
//! * PutRequest: key = 1, value = 2, lease = 3, prev_kv = 4,
//!   ignore_value = 5, ignore_lease = 6;
//! * DeleteRangeRequest: key = 1, range_end = 2, prev_kv = 3.

/// Nested Txns deeper than this go to the protobuf runtime (etcd itself
/// refuses deep nesting later, by its own rules).
pub const MAX_DEPTH: usize = 16;

const VARINT: u8 = 0;
const LEN: u8 = 2;

/// The operand of a Compare: which member of `target_union` was set last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand<'a> {
    None,
    /// version (4), create_revision (5), mod_revision (6) or lease (8)
    Int(u32, i64),
    /// value (7)
    Bytes(&'a [u8]),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Compare<'a> {
    pub result: i32,
    pub target: i32,
    pub key: &'a [u8],
    pub range_end: &'a [u8],
    pub operand: Operand<'a>,
}

impl Default for Operand<'_> {
    fn default() -> Self {
        Operand::None
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Range<'a> {
    pub key: &'a [u8],
    pub range_end: &'a [u8],
    pub limit: i64,
    pub revision: i64,
    pub sort_order: i32,
    pub sort_target: i32,
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Put<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteRange<'a> {
    pub key: &'a [u8],
    pub range_end: &'a [u8],
    pub prev_kv: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    /// a RequestOp with no request set
    Empty,
    Range(Range<'a>),
    Put(Put<'a>),
    DeleteRange(DeleteRange<'a>),
    Txn(Txn<'a>),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Txn<'a> {
    pub compare: Vec<Compare<'a>>,
    pub success: Vec<Op<'a>>,
    pub failure: Vec<Op<'a>>,
}

impl Txn<'_> {
    /// etcd's IsTxnReadonly: every op of both branches is a Range (an empty
    /// op or a nested Txn makes it a write).
    pub fn is_readonly(&self) -> bool {
        self.success.iter().chain(&self.failure).all(|op| matches!(op, Op::Range(_)))
    }

    /// Every Range of both branches is serializable.
    pub fn reads_serializable(&self) -> bool {
        self.success.iter().chain(&self.failure).all(|op| matches!(op, Op::Range(r) if r.serializable))
    }
}

/// One field of a message: its number and its value (a varint, or the
/// bytes of a length-delimited field).
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let b = *buf.get(*pos)?;
        *pos += 1;
        if i == 9 && b > 1 {
            return None; // more than 64 bits
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

impl<'a> Iterator for Fields<'a> {
    /// Some(None): a field this decoder does not take (the caller gives up).
    type Item = Option<(u32, Value<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let Some(tag) = varint(self.buf, &mut self.pos) else {
            return Some(None);
        };
        let (number, wire) = (tag >> 3, (tag & 7) as u8);
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Some(None);
        }
        let value = match wire {
            VARINT => match varint(self.buf, &mut self.pos) {
                Some(v) => Value::Varint(v),
                None => return Some(None),
            },
            LEN => {
                let Some(n) = varint(self.buf, &mut self.pos) else {
                    return Some(None);
                };
                let end = match usize::try_from(n).ok().and_then(|n| self.pos.checked_add(n)) {
                    Some(end) if end <= self.buf.len() => end,
                    _ => return Some(None),
                };
                let v = &self.buf[self.pos..end];
                self.pos = end;
                Value::Bytes(v)
            }
            _ => return Some(None),
        };
        Some(Some((number as u32, value)))
    }
}

fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf, pos: 0 }
}

/// A varint field as protobuf reads each scalar type.
fn int64(v: u64) -> i64 {
    v as i64
}
fn enum32(v: u64) -> i32 {
    v as i32
}
fn boolean(v: u64) -> bool {
    v != 0
}

/// Parse a TxnRequest; None: let the protobuf runtime read it.
pub fn parse_txn(buf: &[u8]) -> Option<Txn<'_>> {
    txn(buf, 0)
}

fn txn(buf: &[u8], depth: usize) -> Option<Txn<'_>> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut t = Txn::default();
    for f in fields(buf) {
        match f? {
            (1, Value::Bytes(b)) => t.compare.push(compare(b)?),
            (2, Value::Bytes(b)) => t.success.push(op(b, depth)?),
            (3, Value::Bytes(b)) => t.failure.push(op(b, depth)?),
            _ => return None,
        }
    }
    Some(t)
}

fn compare(buf: &[u8]) -> Option<Compare<'_>> {
    let mut c = Compare::default();
    for f in fields(buf) {
        match f? {
            (1, Value::Varint(v)) => c.result = enum32(v),
            (2, Value::Varint(v)) => c.target = enum32(v),
            (3, Value::Bytes(b)) => c.key = b,
            (n @ (4 | 5 | 6 | 8), Value::Varint(v)) => c.operand = Operand::Int(n, int64(v)),
            (7, Value::Bytes(b)) => c.operand = Operand::Bytes(b),
            (64, Value::Bytes(b)) => c.range_end = b,
            _ => return None,
        }
    }
    Some(c)
}

fn op(buf: &[u8], depth: usize) -> Option<Op<'_>> {
    let mut out = Op::Empty;
    for f in fields(buf) {
        if !matches!(out, Op::Empty) {
            return None; // a second request: protobuf merges or replaces
        }
        out = match f? {
            (1, Value::Bytes(b)) => Op::Range(range(b)?),
            (2, Value::Bytes(b)) => Op::Put(put(b)?),
            (3, Value::Bytes(b)) => Op::DeleteRange(delete_range(b)?),
            (4, Value::Bytes(b)) => Op::Txn(txn(b, depth + 1)?),
            _ => return None,
        };
    }
    Some(out)
}

fn range(buf: &[u8]) -> Option<Range<'_>> {
    let mut r = Range::default();
    for f in fields(buf) {
        match f? {
            (1, Value::Bytes(b)) => r.key = b,
            (2, Value::Bytes(b)) => r.range_end = b,
            (3, Value::Varint(v)) => r.limit = int64(v),
            (4, Value::Varint(v)) => r.revision = int64(v),
            (5, Value::Varint(v)) => r.sort_order = enum32(v),
            (6, Value::Varint(v)) => r.sort_target = enum32(v),
            (7, Value::Varint(v)) => r.serializable = boolean(v),
            (8, Value::Varint(v)) => r.keys_only = boolean(v),
            (9, Value::Varint(v)) => r.count_only = boolean(v),
            (10, Value::Varint(v)) => r.min_mod_revision = int64(v),
            (11, Value::Varint(v)) => r.max_mod_revision = int64(v),
            (12, Value::Varint(v)) => r.min_create_revision = int64(v),
            (13, Value::Varint(v)) => r.max_create_revision = int64(v),
            _ => return None,
        }
    }
    Some(r)
}

fn put(buf: &[u8]) -> Option<Put<'_>> {
    let mut p = Put::default();
    for f in fields(buf) {
        match f? {
            (1, Value::Bytes(b)) => p.key = b,
            (2, Value::Bytes(b)) => p.value = b,
            (3, Value::Varint(v)) => p.lease = int64(v),
            (4, Value::Varint(v)) => p.prev_kv = boolean(v),
            (5, Value::Varint(v)) => p.ignore_value = boolean(v),
            (6, Value::Varint(v)) => p.ignore_lease = boolean(v),
            _ => return None,
        }
    }
    Some(p)
}

fn delete_range(buf: &[u8]) -> Option<DeleteRange<'_>> {
    let mut d = DeleteRange::default();
    for f in fields(buf) {
        match f? {
            (1, Value::Bytes(b)) => d.key = b,
            (2, Value::Bytes(b)) => d.range_end = b,
            (3, Value::Varint(v)) => d.prev_kv = boolean(v),
            _ => return None,
        }
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(out: &mut Vec<u8>, mut x: u64) {
        while x >= 0x80 {
            out.push(x as u8 | 0x80);
            x >>= 7;
        }
        out.push(x as u8);
    }
    fn field_bytes(out: &mut Vec<u8>, n: u64, b: &[u8]) {
        v(out, n << 3 | 2);
        v(out, b.len() as u64);
        out.extend_from_slice(b);
    }
    fn field_varint(out: &mut Vec<u8>, n: u64, x: u64) {
        v(out, n << 3);
        v(out, x);
    }

    /// The heartbeat: If(ModRevision(k) == 7) Then(Put(k, v)) Else(Get(k)).
    fn heartbeat() -> Vec<u8> {
        let mut cmp = vec![];
        field_varint(&mut cmp, 2, 2);
        field_bytes(&mut cmp, 3, b"k");
        field_varint(&mut cmp, 6, 7);
        let mut put = vec![];
        field_bytes(&mut put, 1, b"k");
        field_bytes(&mut put, 2, b"v");
        let mut op_put = vec![];
        field_bytes(&mut op_put, 2, &put);
        let mut get = vec![];
        field_bytes(&mut get, 1, b"k");
        let mut op_get = vec![];
        field_bytes(&mut op_get, 1, &get);
        let mut t = vec![];
        field_bytes(&mut t, 1, &cmp);
        field_bytes(&mut t, 2, &op_put);
        field_bytes(&mut t, 3, &op_get);
        t
    }

    #[test]
    fn the_heartbeat_txn() {
        let buf = heartbeat();
        let t = parse_txn(&buf).unwrap();
        assert_eq!(t.compare.len(), 1);
        assert_eq!((t.compare[0].target, t.compare[0].key), (2, &b"k"[..]));
        assert_eq!(t.compare[0].operand, Operand::Int(6, 7));
        assert!(matches!(&t.success[0], Op::Put(p) if p.key == b"k" && p.value == b"v"));
        assert!(matches!(&t.failure[0], Op::Range(r) if r.key == b"k"));
        assert!(!t.is_readonly());
    }

    #[test]
    fn negative_int64_and_enum_truncation() {
        let mut p = vec![];
        field_varint(&mut p, 3, (-5i64) as u64);
        assert_eq!(put(&p).unwrap().lease, -5);
        let mut r = vec![];
        field_varint(&mut r, 5, (1u64 << 32) | 2);
        assert_eq!(range(&r).unwrap().sort_order, 2);
    }

    #[test]
    fn anything_unusual_is_left_to_protobuf() {
        let buf = heartbeat();
        for cut in 1..buf.len() {
            // a truncated message is either refused or a shorter valid one
            if let Some(t) = parse_txn(&buf[..cut]) {
                assert!(t.compare.len() + t.success.len() + t.failure.len() < 3);
            }
        }
        let mut unknown = heartbeat();
        field_varint(&mut unknown, 9, 1);
        assert!(parse_txn(&unknown).is_none());
        let mut mistyped = vec![];
        field_varint(&mut mistyped, 1, 1);
        assert!(parse_txn(&mistyped).is_none());
        let mut two = vec![];
        field_bytes(&mut two, 1, b"");
        field_bytes(&mut two, 2, b"");
        let mut t = vec![];
        field_bytes(&mut t, 2, &two);
        assert!(parse_txn(&t).is_none());
        assert!(parse_txn(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_none());
    }

    #[test]
    fn nesting_past_the_depth_is_left_to_protobuf() {
        let mut t: Vec<u8> = vec![];
        for _ in 0..=MAX_DEPTH + 1 {
            let mut op = vec![];
            field_bytes(&mut op, 4, &t);
            t = vec![];
            field_bytes(&mut t, 2, &op);
        }
        assert!(parse_txn(&t).is_none());
    }
}
