//! TLS for https:// and unixs:// listeners: rustls with the ring provider.
//!
//! * Certificates are re-read when their files change (etcd reads them on
//!   every handshake): each accepted connection stats the certificate, key
//!   and CA bundle files, and a changed mtime, size or inode builds a new
//!   config for the handshakes that follow (a broken new file is logged
//!   and the previous config kept); connections already open keep theirs.
//! * `--client-cert-auth` requires a client certificate chaining to the
//!   trusted CA; without it no certificate is asked for (as Go's
//!   tls.NoClientCert, etcd's setting then).  The allowed names and the
//!   CRL narrow who may connect with one (`narrowing`).
//! * Cipher suites restrict TLS 1.2 only; TLS 1.3 suites are not
//!   configurable, as in Go.  Names arrive here already checked and mapped
//!   by Python (brain.config), as rustls' names.

use std::fs;
use std::io::BufReader;
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::narrowing::{self, Allowed, NarrowingVerifier, Revocations};
pub use crate::x509::subject_common_name;

#[derive(Clone, Debug)]
pub struct TlsSettings {
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: Option<String>,
    pub client_auth: bool,
    pub cipher_suites: Vec<String>,
    pub min_tls13: bool,
    pub max_tls12: bool,
    pub allowed: Allowed,
    pub crl_file: Option<String>,
}

type Stamp = Vec<Option<(std::time::SystemTime, u64, u64)>>;

pub struct TlsState {
    settings: TlsSettings,
    current: Mutex<(Arc<ServerConfig>, Stamp)>,
    crl: Option<Revocations>,
}

fn stamp(settings: &TlsSettings) -> Stamp {
    let mut files = vec![settings.cert_file.as_str(), settings.key_file.as_str()];
    if let Some(ca) = &settings.ca_file {
        files.push(ca.as_str());
    }
    files.into_iter().map(narrowing::file_stamp).collect()
}

fn provider(settings: &TlsSettings) -> Result<CryptoProvider, String> {
    let mut p = rustls::crypto::ring::default_provider();
    if !settings.cipher_suites.is_empty() {
        let wanted: Vec<&str> = settings.cipher_suites.iter().map(|s| s.as_str()).collect();
        p.cipher_suites.retain(|cs: &SupportedCipherSuite| match cs {
            SupportedCipherSuite::Tls13(_) => true,
            SupportedCipherSuite::Tls12(_) => {
                let name = format!("{:?}", cs.suite());
                wanted.contains(&name.as_str())
            }
        });
    }
    Ok(p)
}

fn read_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let data = fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let certs: Vec<_> = CertificateDer::pem_reader_iter(&mut BufReader::new(&data[..]))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{path}: {e:?}"))?;
    if certs.is_empty() {
        return Err(format!("{path}: no certificate found"));
    }
    Ok(certs)
}

pub fn build(settings: &TlsSettings) -> Result<ServerConfig, String> {
    let provider = Arc::new(provider(settings)?);
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = match (settings.min_tls13, settings.max_tls12) {
        (true, _) => vec![&rustls::version::TLS13],
        (false, true) => vec![&rustls::version::TLS12],
        (false, false) => vec![&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("TLS settings: {e}"))?;
    let builder = if settings.client_auth {
        let ca = settings.ca_file.as_deref().ok_or("--client-cert-auth needs --trusted-ca-file")?;
        let mut roots = RootCertStore::empty();
        for c in read_certs(ca)? {
            roots.add(c).map_err(|e| format!("{ca}: {e}"))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("{ca}: {e}"))?;
        if settings.allowed.is_empty() {
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_client_cert_verifier(Arc::new(NarrowingVerifier { inner: verifier, allowed: settings.allowed.clone() }))
        }
    } else {
        builder.with_no_client_auth()
    };
    let certs = read_certs(&settings.cert_file)?;
    let key_data = fs::read(&settings.key_file).map_err(|e| format!("{}: {e}", settings.key_file))?;
    let key = PrivateKeyDer::from_pem_slice(&key_data).map_err(|e| format!("{}: {e:?}", settings.key_file))?;
    let mut cfg = builder.with_single_cert(certs, key).map_err(|e| format!("{}: {e}", settings.cert_file))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

impl TlsState {
    pub fn new(settings: TlsSettings) -> Result<Self, String> {
        let st = stamp(&settings);
        let cfg = build(&settings)?;
        let crl = settings.crl_file.as_deref().map(Revocations::load).transpose()?;
        Ok(TlsState { settings, current: Mutex::new((Arc::new(cfg), st)), crl })
    }

    /// After a handshake: None when the client may stay, else the reason
    /// and why it may not (a certificate it sent is revoked, or the CRL is
    /// unusable).
    pub fn refusal(&self, peer_certs: Option<&[CertificateDer<'_>]>) -> Option<(&'static str, String)> {
        self.crl.as_ref()?.refusal(peer_certs?)
    }

    /// The config for a new handshake, rebuilt first if a file changed.
    pub fn config(&self) -> Arc<ServerConfig> {
        let now = stamp(&self.settings);
        let mut cur = self.current.lock();
        if now != cur.1 {
            match build(&self.settings) {
                Ok(cfg) => {
                    eprintln!("brain transport: TLS certificate files changed; reloaded");
                    *cur = (Arc::new(cfg), now);
                }
                Err(e) => {
                    eprintln!("brain transport: TLS files changed but cannot be loaded ({e}); keeping the previous ones");
                    cur.1 = now;
                }
            }
        }
        cur.0.clone()
    }
}

/// Why a handshake failed, as a metric label.
pub fn failure_reason(err: &std::io::Error) -> &'static str {
    use rustls::Error as E;
    if let Some(e) = err.get_ref().and_then(|e| e.downcast_ref::<E>()) {
        return match e {
            E::NoCertificatesPresented => "no_client_certificate",
            E::InvalidCertificate(rustls::CertificateError::NotValidForName) => "not_allowed",
            E::InvalidCertificate(_) => "bad_certificate",
            E::InvalidMessage(_) => "not_tls",
            E::PeerIncompatible(_) => "incompatible",
            E::AlertReceived(_) => "alert_received",
            E::NoApplicationProtocol => "incompatible",
            _ => "other",
        };
    }
    match err.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => "closed",
        std::io::ErrorKind::InvalidData => "not_tls",
        _ => "other",
    }
}

/// Why a handshake failed, for the log: Go's words for the refusals
/// etcd's log shows most (no client certificate, one from an unknown CA),
/// rustls' own for the rest, all after "tls: " as Go's are.
pub fn failure_text(err: &std::io::Error) -> String {
    use rustls::{CertificateError as C, Error as E};
    match err.get_ref().and_then(|e| e.downcast_ref::<E>()) {
        Some(E::NoCertificatesPresented) => "tls: client didn't provide a certificate".into(),
        // only the allowed names refuse a client certificate this way (narrowing)
        Some(E::InvalidCertificate(C::NotValidForName)) => narrowing::NOT_ALLOWED.into(),
        Some(E::InvalidCertificate(C::UnknownIssuer)) => {
            "tls: failed to verify certificate: x509: certificate signed by unknown authority".into()
        }
        Some(E::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        )) => {
            "tls: failed to verify certificate: x509: certificate has expired or is not yet valid".into()
        }
        Some(e) => format!("tls: {e}"),
        None if err.kind() == std::io::ErrorKind::UnexpectedEof => "EOF".into(),
        None => format!("tls: {err}"),
    }
}
