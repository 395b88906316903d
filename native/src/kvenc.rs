//! Protobuf wire bytes of a list of `mvccpb.KeyValue`s: the one part of a
//! response whose size grows with the data (a Range page, a RangeStream
//! chunk).  Python hands over the columns of a list (keys, revisions,
//! versions, leases, values) and the message's other fields already
//! encoded, and gets back the whole message in one buffer.
//!
//! Encoding only: which keys, which revisions and what they hold is decided
//! above, in Python.  The bytes are those a protobuf encoder writes for
//! the same message (fields in number order, zero and empty fields left
//! out), so a client cannot tell the two apart.
//!
//! `KeyValue`: key = 1 (bytes), create_revision = 2, mod_revision = 3,
//! version = 4, value = 5 (bytes), lease = 6 (all int64 varints).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one
    ((64 - (v | 1).leading_zeros() as usize) + 6) / 7
}

fn put_varint(out: &mut [u8], mut pos: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        out[pos] = (v as u8) | 0x80;
        v >>= 7;
        pos += 1;
    }
    out[pos] = v as u8;
    pos + 1
}

fn put_bytes(out: &mut [u8], pos: usize, data: &[u8]) -> usize {
    out[pos..pos + data.len()].copy_from_slice(data);
    pos + data.len()
}

/// Size of one KeyValue's fields (without its own tag and length).
fn kv_len(key: &[u8], create: u64, modrev: u64, version: u64, value: &[u8], lease: u64) -> usize {
    let mut n = 0;
    if !key.is_empty() {
        n += 1 + varint_len(key.len() as u64) + key.len();
    }
    for v in [create, modrev, version] {
        if v != 0 {
            n += 1 + varint_len(v);
        }
    }
    if !value.is_empty() {
        n += 1 + varint_len(value.len() as u64) + value.len();
    }
    if lease != 0 {
        n += 1 + varint_len(lease);
    }
    n
}

/// The KeyValues of the columns as the repeated message field `field`
/// (2: RangeResponse.kvs), written between `prefix` and `suffix` (the
/// message's other fields, already encoded); with `wrap` not 0 all of it
/// is itself the length-delimited field `wrap` (1: RangeStreamResponse's
/// range_response).  Returns the bytes and the size of the KeyValues
/// alone.  `values` None: every value empty (keys_only).  Every column
/// must have one entry per key; a negative int64 is written in ten bytes,
/// as protobuf writes it.  One output buffer, written once: a page of
/// 10,000 pods is about 28 MB.
#[pyfunction]
#[pyo3(signature = (field, keys, create_revisions, mod_revisions, versions, leases, values=None, prefix=None, suffix=None, wrap=0))]
#[allow(clippy::too_many_arguments)]
pub fn encode_key_values<'py>(
    py: Python<'py>,
    field: u32,
    keys: Vec<PyBackedBytes>,
    create_revisions: Vec<i64>,
    mod_revisions: Vec<i64>,
    versions: Vec<i64>,
    leases: Vec<i64>,
    values: Option<Vec<PyBackedBytes>>,
    prefix: Option<PyBackedBytes>,
    suffix: Option<PyBackedBytes>,
    wrap: u32,
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    let n = keys.len();
    if create_revisions.len() != n
        || mod_revisions.len() != n
        || versions.len() != n
        || leases.len() != n
        || values.as_ref().is_some_and(|v| v.len() != n)
    {
        return Err(PyValueError::new_err("encode_key_values: columns of different lengths"));
    }
    if field == 0 || field >= (1 << 29) || wrap >= (1 << 29) {
        return Err(PyValueError::new_err("encode_key_values: bad field number"));
    }
    let tag = ((field as u64) << 3) | 2;
    let empty: &[u8] = &[];
    let prefix: &[u8] = prefix.as_deref().unwrap_or(empty);
    let suffix: &[u8] = suffix.as_deref().unwrap_or(empty);
    let value_of = |i: usize| -> &[u8] { values.as_ref().map_or(empty, |v| &v[i][..]) };
    let mut lens = Vec::with_capacity(n);
    let mut kvs_total = 0usize;
    for i in 0..n {
        let len = kv_len(
            &keys[i],
            create_revisions[i] as u64,
            mod_revisions[i] as u64,
            versions[i] as u64,
            value_of(i),
            leases[i] as u64,
        );
        lens.push(len);
        kvs_total += varint_len(tag) + varint_len(len as u64) + len;
    }
    let inner = prefix.len() + kvs_total + suffix.len();
    let wrap_tag = ((wrap as u64) << 3) | 2;
    let total = if wrap != 0 { varint_len(wrap_tag) + varint_len(inner as u64) + inner } else { inner };
    let out = PyBytes::new_with(py, total, |out: &mut [u8]| {
        let mut pos = 0;
        if wrap != 0 {
            pos = put_varint(out, pos, wrap_tag);
            pos = put_varint(out, pos, inner as u64);
        }
        pos = put_bytes(out, pos, prefix);
        for i in 0..n {
            pos = put_varint(out, pos, tag);
            pos = put_varint(out, pos, lens[i] as u64);
            let key: &[u8] = &keys[i];
            if !key.is_empty() {
                out[pos] = 0x0a;
                pos = put_varint(out, pos + 1, key.len() as u64);
                pos = put_bytes(out, pos, key);
            }
            for (fk, v) in [(0x10u8, create_revisions[i]), (0x18, mod_revisions[i]), (0x20, versions[i])] {
                if v != 0 {
                    out[pos] = fk;
                    pos = put_varint(out, pos + 1, v as u64);
                }
            }
            let value = value_of(i);
            if !value.is_empty() {
                out[pos] = 0x2a;
                pos = put_varint(out, pos + 1, value.len() as u64);
                pos = put_bytes(out, pos, value);
            }
            if leases[i] != 0 {
                out[pos] = 0x30;
                pos = put_varint(out, pos + 1, leases[i] as u64);
            }
        }
        pos = put_bytes(out, pos, suffix);
        debug_assert_eq!(pos, total);
        Ok(())
    })?;
    Ok((out, kvs_total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths() {
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
        assert_eq!(varint_len(u64::MAX), 10);
        let mut buf = [0u8; 10];
        assert_eq!(put_varint(&mut buf, 0, 300), 2);
        assert_eq!(&buf[..2], &[0xac, 0x02]);
        assert_eq!(put_varint(&mut buf, 0, (-1i64) as u64), 10);
    }
}
