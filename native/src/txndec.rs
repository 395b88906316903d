//! A `TxnRequest`'s bytes straight into brain's request objects
//! (brain.mvcc.requests), which the front would otherwise build from a
//! parsed protobuf message field by field: under a Kubernetes write load
//! that building was the largest share of the Python thread's time.  The
//! parsing is brain-wire's `txn` (pure, fuzzed); this module only makes the
//! Python objects.  `decode` answers None for any message the parser leaves
//! to the protobuf runtime.

use brain_wire::txn::{self, Op, Operand};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyList, PyString, PyTuple};

/// The request classes of brain.mvcc.requests the decoder builds, and the
/// names of Compare's `target_union` members as protobuf's WhichOneof
/// gives them.
#[pyclass(frozen, module = "brain._transport")]
pub struct TxnDecoder {
    txn: Py<PyAny>,
    compare: Py<PyAny>,
    range: Py<PyAny>,
    put: Py<PyAny>,
    delete_range: Py<PyAny>,
    /// version, create_revision, mod_revision, value, lease
    unions: [Py<PyString>; 5],
}

fn bytes<'py>(py: Python<'py>, b: &[u8]) -> Bound<'py, PyAny> {
    PyBytes::new(py, b).into_any()
}

fn int<'py>(py: Python<'py>, v: i64) -> Bound<'py, PyAny> {
    match v.into_pyobject(py) {
        Ok(o) => o.into_any(),
        Err(never) => match never {},
    }
}

fn boolean(py: Python<'_>, v: bool) -> Bound<'_, PyAny> {
    PyBool::new(py, v).to_owned().into_any()
}

impl TxnDecoder {
    fn build_txn<'py>(&self, py: Python<'py>, t: &txn::Txn<'_>) -> PyResult<Bound<'py, PyAny>> {
        let compare = t.compare.iter().map(|c| self.build_compare(py, c)).collect::<PyResult<Vec<_>>>()?;
        let success = t.success.iter().map(|o| self.build_op(py, o)).collect::<PyResult<Vec<_>>>()?;
        let failure = t.failure.iter().map(|o| self.build_op(py, o)).collect::<PyResult<Vec<_>>>()?;
        self.txn.bind(py).call1((PyList::new(py, compare)?, PyList::new(py, success)?, PyList::new(py, failure)?))
    }

    fn build_compare<'py>(&self, py: Python<'py>, c: &txn::Compare<'_>) -> PyResult<Bound<'py, PyAny>> {
        let (union, operand) = match c.operand {
            Operand::None => (py.None().into_bound(py), int(py, 0)),
            Operand::Int(n, v) => {
                let i = match n {
                    4 => 0,
                    5 => 1,
                    6 => 2,
                    _ => 4, // 8: lease
                };
                (self.unions[i].bind(py).clone().into_any(), int(py, v))
            }
            Operand::Bytes(b) => (self.unions[3].bind(py).clone().into_any(), bytes(py, b)),
        };
        self.compare.bind(py).call1((
            int(py, i64::from(c.result)),
            int(py, i64::from(c.target)),
            bytes(py, c.key),
            bytes(py, c.range_end),
            union,
            operand,
        ))
    }

    fn build_op<'py>(&self, py: Python<'py>, op: &Op<'_>) -> PyResult<Bound<'py, PyAny>> {
        match op {
            Op::Empty => Ok(py.None().into_bound(py)),
            Op::Range(r) => {
                let args = PyTuple::new(
                    py,
                    [
                        bytes(py, r.key),
                        bytes(py, r.range_end),
                        int(py, r.limit),
                        int(py, r.revision),
                        int(py, i64::from(r.sort_order)),
                        int(py, i64::from(r.sort_target)),
                        boolean(py, r.serializable),
                        boolean(py, r.keys_only),
                        boolean(py, r.count_only),
                        int(py, r.min_mod_revision),
                        int(py, r.max_mod_revision),
                        int(py, r.min_create_revision),
                        int(py, r.max_create_revision),
                    ],
                )?;
                self.range.bind(py).call1(args)
            }
            Op::Put(p) => self.put.bind(py).call1((
                bytes(py, p.key),
                bytes(py, p.value),
                int(py, p.lease),
                boolean(py, p.prev_kv),
                boolean(py, p.ignore_value),
                boolean(py, p.ignore_lease),
            )),
            Op::DeleteRange(d) => {
                self.delete_range.bind(py).call1((bytes(py, d.key), bytes(py, d.range_end), boolean(py, d.prev_kv)))
            }
            Op::Txn(t) => self.build_txn(py, t),
        }
    }
}

#[pymethods]
impl TxnDecoder {
    #[new]
    fn new(
        py: Python<'_>,
        txn: Py<PyAny>,
        compare: Py<PyAny>,
        range: Py<PyAny>,
        put: Py<PyAny>,
        delete_range: Py<PyAny>,
    ) -> Self {
        let name = |s: &str| PyString::intern(py, s).unbind();
        TxnDecoder {
            txn,
            compare,
            range,
            put,
            delete_range,
            unions: [name("version"), name("create_revision"), name("mod_revision"), name("value"), name("lease")],
        }
    }

    /// ``(request, readonly, reads_serializable)`` for a TxnRequest's
    /// bytes, or None: the protobuf runtime must read this one.
    /// ``readonly`` is etcd's IsTxnReadonly (every op a Range);
    /// ``reads_serializable``: every Range serializable.
    fn decode<'py>(&self, py: Python<'py>, payload: &[u8]) -> PyResult<Option<(Bound<'py, PyAny>, bool, bool)>> {
        let Some(t) = txn::parse_txn(payload) else {
            return Ok(None);
        };
        let request = self.build_txn(py, &t)?;
        Ok(Some((request, t.is_readonly(), t.reads_serializable())))
    }
}
