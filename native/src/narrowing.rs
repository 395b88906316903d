//! Who may connect with a client certificate, narrowed as etcd narrows it
//! (client/pkg/transport: listener.go's `VerifyPeerCertificate`,
//! listener_tls.go's CRL check), at the same moments and with the same
//! outcome for the client:
//!
//! * `--client-cert-allowed-cn`: the certificate's common name must equal
//!   one of the names; `--client-cert-allowed-hostname`: one of the names
//!   must match its subject alternative names by Go's
//!   `x509.Certificate.VerifyHostname` (IP addresses against IP SANs only,
//!   DNS names case-insensitively with a left-most `*.` wildcard, never the
//!   common name).  Checked in the handshake, after the chain verified; a
//!   refusal fails it with a bad_certificate alert, as Go's server sends.
//! * `--client-crl-file`: after a successful handshake, every certificate
//!   the client sent is looked up by serial number in the CRL (DER); a
//!   revoked one gets the connection closed (close_notify, then EOF), as
//!   etcd's TLS listener closes it.  The file is re-read when it changes
//!   (etcd reads it on every connection); one that cannot be read or parsed
//!   refuses every client certificate until it can, as etcd's does.
//!
//! A refused certificate's DNS names and IP addresses go to the log line,
//! as etcd logs them: the verifier leaves them in a task-local slot that
//! the connection's handshake (`capture`) takes back.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fs;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::x509::{self, AltNames};

// -- the allowed names ---------------------------------------------------------

/// `--client-cert-allowed-cn` / `--client-cert-allowed-hostname` (at most
/// one of them non-empty: etcd refuses both, and so does brain.config).
#[derive(Clone, Debug, Default)]
pub struct Allowed {
    pub cns: Vec<String>,
    pub hostnames: Vec<String>,
}

impl Allowed {
    pub fn is_empty(&self) -> bool {
        self.cns.is_empty() && self.hostnames.is_empty()
    }

    /// Whether the (verified) leaf certificate may connect.
    pub fn permits(&self, cert: &[u8]) -> bool {
        if !self.cns.is_empty() {
            // Go's Subject.CommonName is "" when there is none
            let cn = x509::subject_common_name(cert).unwrap_or_default();
            return self.cns.iter().any(|c| *c == cn);
        }
        if !self.hostnames.is_empty() {
            let names = x509::alt_names(cert);
            return self.hostnames.iter().any(|h| verify_hostname(&names, h));
        }
        true
    }
}

/// Go's `Certificate.VerifyHostname(h) == nil` (crypto/x509/verify.go).
pub fn verify_hostname(names: &AltNames, h: &str) -> bool {
    // IP addresses may be written in [ ]
    let candidate_ip = if h.len() >= 3 && h.starts_with('[') && h.ends_with(']') { &h[1..h.len() - 1] } else { h };
    if let Ok(ip) = candidate_ip.parse::<IpAddr>() {
        // only against IP SANs (RFC 6125, Appendix B.2); Go compares the
        // 16-byte forms, so 10.0.0.1 and ::ffff:10.0.0.1 are one address
        let want = as16(ip);
        return names.ips.iter().any(|c| as16(*c) == want);
    }
    let candidate = h.to_ascii_lowercase();
    let valid_candidate = valid_hostname(&candidate, false);
    let host_parts: Vec<&str> = candidate.strip_suffix('.').unwrap_or(&candidate).split('.').collect();
    names.dns.iter().any(|pattern| {
        // wildcards and the trailing dot only between valid names; anything
        // else must match exactly
        if valid_candidate && valid_hostname(pattern, true) {
            match_hostnames(pattern, &host_parts)
        } else {
            match_exactly(pattern, &candidate)
        }
    })
}

fn as16(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// Go's `validHostname`: RFC 6125 2.2 names, leniently (`_` allowed); a
/// pattern may start with a `*` label, an input may end with a dot.
fn valid_hostname(host: &str, is_pattern: bool) -> bool {
    let host = if is_pattern { host } else { host.strip_suffix('.').unwrap_or(host) };
    if host.is_empty() || host == "*" {
        return false;
    }
    for (i, part) in host.split('.').enumerate() {
        if part.is_empty() {
            return false;
        }
        if is_pattern && i == 0 && part == "*" {
            continue;
        }
        for (j, c) in part.char_indices() {
            let ok = c.is_ascii_alphanumeric() || (c == '-' && j != 0) || c == '_';
            if !ok {
                return false;
            }
        }
    }
    true
}

fn match_exactly(a: &str, b: &str) -> bool {
    if a.is_empty() || a == "." || b.is_empty() || b == "." {
        return false;
    }
    a.to_ascii_lowercase() == b.to_ascii_lowercase()
}

fn match_hostnames(pattern: &str, host_parts: &[&str]) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    if pattern.is_empty() || host_parts.is_empty() {
        return false;
    }
    let parts: Vec<&str> = pattern.split('.').collect();
    parts.len() == host_parts.len()
        && parts.iter().zip(host_parts).enumerate().all(|(i, (p, h))| (i == 0 && *p == "*") || p == h)
}

// -- the handshake check --------------------------------------------------------

tokio::task_local! {
    /// Set around one connection's handshake: the names of the certificate
    /// the verifier refused, for the log line.
    static REFUSED: RefCell<Option<AltNames>>;
}

/// Run a handshake; also returns the names of a certificate refused by
/// the allowed names during it (None if none was).
pub async fn capture<F: Future>(handshake: F) -> (F::Output, Option<AltNames>) {
    REFUSED
        .scope(RefCell::new(None), async move {
            let out = handshake.await;
            (out, REFUSED.with(|r| r.borrow_mut().take()))
        })
        .await
}

/// webpki's verifier, then the allowed names.
#[derive(Debug)]
pub struct NarrowingVerifier {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub allowed: Allowed,
}

impl ClientCertVerifier for NarrowingVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        if self.allowed.permits(end_entity.as_ref()) {
            return Ok(verified);
        }
        let _ = REFUSED.try_with(|r| *r.borrow_mut() = Some(x509::alt_names(end_entity.as_ref())));
        // rustls answers this one with bad_certificate, Go's alert here
        // (webpki never reports it for a client certificate: it checks no name)
        Err(Error::InvalidCertificate(CertificateError::NotValidForName))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// etcd's text for a certificate the allowed names refuse.
pub const NOT_ALLOWED: &str = "client certificate authentication failed";

// -- the CRL ----------------------------------------------------------------------

type FileStamp = Option<(SystemTime, u64, u64)>;

/// (mtime, size, inode) of a file: a change of any means it was rewritten
/// or replaced (a rename over it included).
pub fn file_stamp(path: &str) -> FileStamp {
    fs::metadata(path).ok().and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())))
}

type Serials = Result<Arc<HashSet<Vec<u8>>>, String>;

/// `--client-crl-file`, re-read when it changes.
pub struct Revocations {
    path: String,
    current: Mutex<(FileStamp, Serials)>,
}

/// Go's words for an errno (os.PathError: "open PATH: no such file or directory").
fn go_os_error(op: &str, path: &str, e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut c = text.chars();
    let text = match c.next() {
        Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
        None => String::new(),
    };
    format!("{op} {path}: {text}")
}

/// The serial numbers a CRL file revokes, or why it cannot be used (in
/// the words etcd's check logs).
fn read_crl(path: &str) -> Serials {
    let data = fs::read(path).map_err(|e| {
        // a directory opens, then its read fails (EISDIR), as in Go
        let op = if e.raw_os_error() == Some(21) { "read" } else { "open" };
        go_os_error(op, path, &e)
    })?;
    Ok(Arc::new(x509::revoked_serials(&data)?.into_iter().collect()))
}

impl Revocations {
    /// Load the file (at start-up an unusable one is an error).
    pub fn load(path: &str) -> Result<Self, String> {
        let stamp = file_stamp(path);
        let serials = read_crl(path).map_err(|e| format!("--client-crl-file {path}: {e}"))?;
        Ok(Revocations { path: path.to_string(), current: Mutex::new((stamp, Ok(serials))) })
    }

    fn serials(&self) -> Serials {
        let now = file_stamp(&self.path);
        let mut cur = self.current.lock();
        if now != cur.0 {
            let next = read_crl(&self.path);
            match &next {
                Ok(s) => eprintln!("brain transport: --client-crl-file {} changed; reloaded ({} revoked)", self.path, s.len()),
                Err(e) => eprintln!(
                    "brain transport: --client-crl-file {} changed and cannot be used ({e}); client certificates are refused until it can",
                    self.path
                ),
            }
            *cur = (now, next);
        }
        cur.1.clone()
    }

    /// None when the client's certificates (as it sent them) may stay
    /// connected; else the metric's reason and why not, as etcd says it.
    pub fn refusal(&self, certs: &[CertificateDer<'_>]) -> Option<(&'static str, String)> {
        if certs.is_empty() {
            return None;
        }
        let revoked = match self.serials() {
            Ok(s) => s,
            Err(e) => return Some(("crl_unusable", e)),
        };
        let serial = certs.iter().filter_map(|c| x509::serial(c.as_ref())).find(|s| revoked.contains(s))?;
        Some(("revoked", format!("transport: certificate serial {} revoked", x509::hex(&serial))))
    }
}
