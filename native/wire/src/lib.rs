//! brain-wire: the parsers of the native transport that read what a client
//! sends, as pure functions of bytes (no sockets, no tasks), so that the
//! transport (native/src) and its fuzz targets (native/fuzz) run the same
//! code.
//!
//! * `framing`: gRPC's length-prefixed messages in HTTP/2 DATA chunks;
//! * `authority`: the HPACK rewriter that mends unix-socket authorities, and
//!   `hpack_check`, what it checks of a header block before decoding it;
//! * `http1`: telling HTTP/2 from HTTP/1.1 by the first bytes, and an
//!   HTTP/1.1 request head;
//! * `txn`: etcd's TxnRequest read from its protobuf bytes (the requests
//!   Kubernetes writes most), or left to the protobuf runtime.

pub mod authority;
pub mod framing;
pub mod hpack_check;
pub mod http1;
pub mod txn;
