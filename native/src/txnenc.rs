//! A `TxnResponse`'s bytes straight from brain's result objects
//! (brain.mvcc.requests: TxnResult, RangeResult, PutResult,
//! DeleteRangeResult, EmptyResult, KeyValue), which the front would
//! otherwise copy into protobuf messages field by field and then serialize:
//! every write of a Kubernetes cluster is a Txn, and that copy ran on the
//! one Python thread that carries them all.
//!
//! Encoding only, and the bytes are those the protobuf runtime writes for
//! the message brain.api.convert.txn_response builds (fields in number
//! order, zeros left out, a sub-message present wherever the builder
//! touches it): tests/api/test_txn_encoder.py compares the two.
//!
//! What etcd's messages hold (field numbers from its rpc.proto, kv.proto):
//!
//! ```text
//! ResponseHeader       cluster_id = 1, member_id = 2, revision = 3, raft_term = 4
//! TxnResponse          header = 1, succeeded = 2, responses = 3 (ResponseOp)
//! ResponseOp           response_range = 1, response_put = 2,
//!                      response_delete_range = 3, response_txn = 4
//! RangeResponse        header = 1, kvs = 2, more = 3, count = 4
//! PutResponse          header = 1, prev_kv = 2
//! DeleteRangeResponse  header = 1, deleted = 2, prev_kvs = 3
//! KeyValue             key = 1, create_revision = 2, mod_revision = 3,
//!                      version = 4, value = 5, lease = 6
//! ```
//!
//! A response inside a Txn carries a header with only its revision; a
//! nested Txn's header is present and empty (etcd allocates it and never
//! fills it); an empty RequestOp answers with an empty ResponseOp.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList, PyString, PyType};

/// The result classes of brain.mvcc.requests, to tell the ops apart, and
/// their attribute names, interned once.
#[pyclass(frozen, module = "brain._transport")]
pub struct TxnEncoder {
    txn: Py<PyType>,
    range: Py<PyType>,
    put: Py<PyType>,
    delete_range: Py<PyType>,
    empty: Py<PyType>,
    names: Names,
}

struct Names {
    revision: Py<PyString>,
    succeeded: Py<PyString>,
    responses: Py<PyString>,
    kvs: Py<PyString>,
    more: Py<PyString>,
    count: Py<PyString>,
    prev_kv: Py<PyString>,
    deleted: Py<PyString>,
    prev_kvs: Py<PyString>,
    key: Py<PyString>,
    create_revision: Py<PyString>,
    mod_revision: Py<PyString>,
    version: Py<PyString>,
    value: Py<PyString>,
    lease: Py<PyString>,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint field, left out when zero (proto3); an int64 below zero is
/// written as its ten-byte two's complement, as protobuf writes it.
fn put_uint(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        out.push(field << 3);
        put_varint(out, v);
    }
}

fn put_len(out: &mut Vec<u8>, field: u8, data: &[u8]) {
    out.push(field << 3 | 2);
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn header(cluster_id: u64, member_id: u64, revision: i64, term: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(32);
    put_uint(&mut h, 1, cluster_id);
    put_uint(&mut h, 2, member_id);
    put_uint(&mut h, 3, revision as u64);
    put_uint(&mut h, 4, term);
    h
}

impl TxnEncoder {
    fn int(&self, obj: &Bound<'_, PyAny>, name: &Py<PyString>) -> PyResult<i64> {
        obj.getattr(name.bind(obj.py()))?.extract()
    }

    fn flag(&self, obj: &Bound<'_, PyAny>, name: &Py<PyString>) -> PyResult<bool> {
        obj.getattr(name.bind(obj.py()))?.is_truthy()
    }

    /// A KeyValue's fields (the message itself is always written, even
    /// with every field zero: the builder assigns its key, which makes it
    /// present).
    fn key_value(&self, kv: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
        let n = &self.names;
        let key: PyBackedBytes = kv.getattr(n.key.bind(kv.py()))?.extract()?;
        let value: PyBackedBytes = kv.getattr(n.value.bind(kv.py()))?.extract()?;
        let mut out = Vec::with_capacity(key.len() + value.len() + 40);
        if !key.is_empty() {
            put_len(&mut out, 1, &key);
        }
        put_uint(&mut out, 2, self.int(kv, &n.create_revision)? as u64);
        put_uint(&mut out, 3, self.int(kv, &n.mod_revision)? as u64);
        put_uint(&mut out, 4, self.int(kv, &n.version)? as u64);
        if !value.is_empty() {
            put_len(&mut out, 5, &value);
        }
        put_uint(&mut out, 6, self.int(kv, &n.lease)? as u64);
        Ok(out)
    }

    fn key_values(&self, out: &mut Vec<u8>, field: u8, list: &Bound<'_, PyAny>) -> PyResult<()> {
        for kv in list.try_iter()? {
            put_len(out, field, &self.key_value(&kv?)?);
        }
        Ok(())
    }

    /// The header of a response inside a Txn: its revision alone.
    fn op_header(&self, out: &mut Vec<u8>, r: &Bound<'_, PyAny>) -> PyResult<()> {
        put_len(out, 1, &header(0, 0, self.int(r, &self.names.revision)?, 0));
        Ok(())
    }

    /// A TxnResponse's fields after its header: succeeded, responses.
    fn txn_body(&self, out: &mut Vec<u8>, res: &Bound<'_, PyAny>, depth: u32) -> PyResult<()> {
        let py = res.py();
        let n = &self.names;
        if self.flag(res, &n.succeeded)? {
            out.extend_from_slice(&[0x10, 0x01]);
        }
        let responses = res.getattr(n.responses.bind(py))?;
        let responses = responses.downcast::<PyList>()?;
        for r in responses.iter() {
            let t = r.get_type();
            let mut sub = Vec::new();
            let field = if t.is(&self.range) {
                self.op_header(&mut sub, &r)?;
                self.key_values(&mut sub, 2, &r.getattr(n.kvs.bind(py))?)?;
                if self.flag(&r, &n.more)? {
                    sub.extend_from_slice(&[0x18, 0x01]);
                }
                put_uint(&mut sub, 4, self.int(&r, &n.count)? as u64);
                1
            } else if t.is(&self.put) {
                self.op_header(&mut sub, &r)?;
                let prev = r.getattr(n.prev_kv.bind(py))?;
                if !prev.is_none() {
                    put_len(&mut sub, 2, &self.key_value(&prev)?);
                }
                2
            } else if t.is(&self.delete_range) {
                self.op_header(&mut sub, &r)?;
                put_uint(&mut sub, 2, self.int(&r, &n.deleted)? as u64);
                self.key_values(&mut sub, 3, &r.getattr(n.prev_kvs.bind(py))?)?;
                3
            } else if t.is(&self.txn) {
                if depth >= 64 {
                    return Err(PyTypeError::new_err("txn results nested too deeply"));
                }
                sub.extend_from_slice(&[0x0a, 0x00]); // present and empty
                self.txn_body(&mut sub, &r, depth + 1)?;
                4
            } else if t.is(&self.empty) {
                0
            } else {
                return Err(PyTypeError::new_err(format!("unexpected txn op result {}", r.repr()?)));
            };
            let mut op = Vec::with_capacity(sub.len() + 6);
            if field != 0 {
                put_len(&mut op, field, &sub);
            }
            put_len(out, 3, &op);
        }
        Ok(())
    }
}

#[pymethods]
impl TxnEncoder {
    #[new]
    fn new(
        py: Python<'_>,
        txn: Py<PyType>,
        range: Py<PyType>,
        put: Py<PyType>,
        delete_range: Py<PyType>,
        empty: Py<PyType>,
    ) -> Self {
        let name = |s: &str| PyString::intern(py, s).unbind();
        TxnEncoder {
            txn,
            range,
            put,
            delete_range,
            empty,
            names: Names {
                revision: name("revision"),
                succeeded: name("succeeded"),
                responses: name("responses"),
                kvs: name("kvs"),
                more: name("more"),
                count: name("count"),
                prev_kv: name("prev_kv"),
                deleted: name("deleted"),
                prev_kvs: name("prev_kvs"),
                key: name("key"),
                create_revision: name("create_revision"),
                mod_revision: name("mod_revision"),
                version: name("version"),
                value: name("value"),
                lease: name("lease"),
            },
        }
    }

    /// The TxnResponse of ``result`` (a TxnResult) under the header
    /// (cluster_id, member_id, result's revision, term) as wire bytes.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        cluster_id: u64,
        member_id: u64,
        term: u64,
        result: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::with_capacity(64);
        put_len(&mut out, 1, &header(cluster_id, member_id, self.int(result, &self.names.revision)?, term));
        self.txn_body(&mut out, result, 0)?;
        Ok(PyBytes::new(py, &out))
    }
}
