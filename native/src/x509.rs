//! The few things brain reads out of a certificate or a CRL itself, read
//! as Go's crypto/x509 reads them (etcd decides with Go's values):
//!
//! * the subject's common name: the *last* CN attribute (Go's
//!   `pkix.Name.FillFromRDNSequence` overwrites it with each one);
//! * the subject alternative names: DNS names and IP addresses;
//! * the serial number, as the magnitude `big.Int.Bytes()` gives;
//! * a CRL's revoked serial numbers, from the structure
//!   `x509.ParseRevocationList` requires (DER, version 2), with its
//!   error texts.  Its signature is not checked: etcd does not either.
//!
//! Certificates reach here verified by webpki already, so well formed;
//! a CRL comes from a file and may be anything.

use std::net::IpAddr;

/// (tag, header length, content length) of the DER element at `b`.
fn der_header(b: &[u8]) -> Option<(u8, usize, usize)> {
    let tag = *b.first()?;
    let first = *b.get(1)? as usize;
    if first < 0x80 {
        return Some((tag, 2, first));
    }
    let n = first & 0x7f;
    if n == 0 || n > 4 || b.len() < 2 + n {
        return None;
    }
    let mut len = 0usize;
    for i in 0..n {
        len = (len << 8) | b[2 + i] as usize;
    }
    Some((tag, 2 + n, len))
}

/// The elements of a DER SEQUENCE/SET's content: (tag, content, whole element).
fn der_children(mut b: &[u8]) -> Option<Vec<(u8, &[u8], &[u8])>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let (tag, h, len) = der_header(b)?;
        let end = h.checked_add(len)?;
        if end > b.len() {
            return None;
        }
        out.push((tag, &b[h..end], &b[..end]));
        b = &b[end..];
    }
    Some(out)
}

/// The content of the one DER element `b` holds, if it has tag `tag`
/// (bytes after it are ignored, as Go's cryptobyte reads an element).
fn der_element(b: &[u8], tag: u8) -> Option<&[u8]> {
    let (t, h, len) = der_header(b)?;
    if t != tag {
        return None;
    }
    b.get(h..h.checked_add(len)?)
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];

/// The fields of a DER certificate's tbsCertificate, from the serial
/// number on (the optional [0] version skipped).
fn tbs_fields(cert: &[u8]) -> Option<Vec<(u8, &[u8], &[u8])>> {
    let top = der_children(der_element(cert, SEQUENCE)?)?;
    let (_, tbs, _) = top.first()?;
    let mut fields = der_children(tbs)?;
    if fields.first()?.0 == 0xa0 {
        fields.remove(0);
    }
    Some(fields)
}

/// The subject's common name of a DER certificate, as Go's
/// `Subject.CommonName` (the last CN attribute; None if it has none).
pub fn subject_common_name(cert: &[u8]) -> Option<String> {
    let fields = tbs_fields(cert)?;
    // serial, signature, issuer, validity, subject
    let (_, subject, _) = fields.get(4)?;
    let mut found = None;
    for (_, rdn, _) in der_children(subject)? {
        for (_, atv, _) in der_children(rdn)? {
            let parts = der_children(atv)?;
            if parts.len() == 2 && parts[0].0 == 0x06 && parts[0].1 == OID_CN {
                let (tag, value, _) = parts[1];
                found = Some(match tag {
                    0x1e => {
                        // BMPString: UTF-16BE
                        let units: Vec<u16> =
                            value.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])).collect();
                        String::from_utf16_lossy(&units)
                    }
                    _ => String::from_utf8_lossy(value).into_owned(),
                });
            }
        }
    }
    found
}

/// A certificate's subject alternative names: what Go puts in
/// `Certificate.DNSNames` and `.IPAddresses`.
#[derive(Debug, Default, Clone)]
pub struct AltNames {
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl AltNames {
    /// The IP addresses as Go's `net.IP.String()` prints them (an
    /// IPv4-mapped IPv6 address as plain IPv4), for the log.
    pub fn ip_strings(&self) -> Vec<String> {
        self.ips
            .iter()
            .map(|ip| match ip {
                IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                    Some(v4) => v4.to_string(),
                    None => v6.to_string(),
                },
                IpAddr::V4(v4) => v4.to_string(),
            })
            .collect()
    }
}

/// The subject alternative names of a DER certificate (empty if none).
pub fn alt_names(cert: &[u8]) -> AltNames {
    let mut out = AltNames::default();
    let Some(fields) = tbs_fields(cert) else { return out };
    // extensions: [3] EXPLICIT SEQUENCE OF Extension
    let Some((_, exts, _)) = fields.iter().find(|f| f.0 == 0xa3) else { return out };
    let Some(list) = der_element(exts, SEQUENCE).and_then(der_children) else { return out };
    for (_, ext, _) in list {
        let Some(parts) = der_children(ext) else { continue };
        if parts.first().map(|p| (p.0, p.1)) != Some((0x06, OID_SAN)) {
            continue;
        }
        // extnValue: the last part, an OCTET STRING holding GeneralNames
        let Some(names) = parts.last().and_then(|p| der_element(p.1, SEQUENCE)).and_then(der_children) else {
            continue;
        };
        for (tag, value, _) in names {
            match tag {
                0x82 => out.dns.push(String::from_utf8_lossy(value).into_owned()),
                0x87 => match value.len() {
                    4 => out.ips.push(IpAddr::from(<[u8; 4]>::try_from(value).unwrap())),
                    16 => out.ips.push(IpAddr::from(<[u8; 16]>::try_from(value).unwrap())),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    out
}

/// An INTEGER's content as the magnitude Go's `big.Int.Bytes()` returns:
/// big-endian, no leading zeros (a negative number's absolute value).
fn magnitude(b: &[u8]) -> Vec<u8> {
    let mut v = b.to_vec();
    if v.first().is_some_and(|x| x & 0x80 != 0) {
        // two's complement: invert and add one
        for x in v.iter_mut() {
            *x = !*x;
        }
        for x in v.iter_mut().rev() {
            let (s, carry) = x.overflowing_add(1);
            *x = s;
            if !carry {
                break;
            }
        }
    }
    let lead = v.iter().take_while(|x| **x == 0).count();
    v.drain(..lead);
    v
}

/// Go's `checkASN1Integer`: at least one byte, minimally encoded.
fn minimal_integer(b: &[u8]) -> bool {
    match b {
        [] => false,
        [_] => true,
        [0, x, ..] => x & 0x80 != 0,
        [0xff, x, ..] => x & 0x80 == 0,
        _ => true,
    }
}

/// A DER certificate's serial number as `big.Int.Bytes()` (None if unreadable).
pub fn serial(cert: &[u8]) -> Option<Vec<u8>> {
    let fields = tbs_fields(cert)?;
    let (tag, value, _) = fields.first()?;
    (*tag == INTEGER).then(|| magnitude(value))
}

/// Go's `%x` of a byte string: lower-case hex, two digits a byte.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The serial numbers a DER CRL revokes (as `big.Int.Bytes()`), or the
/// error `x509.ParseRevocationList` gives for it.
pub fn revoked_serials(der: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let err = |s: &str| Err(format!("x509: {s}"));
    let Some(outer) = der_element(der, SEQUENCE).and_then(der_children) else {
        return err("malformed crl");
    };
    let mut outer = outer.into_iter();
    let Some(tbs) = outer.next().filter(|e| e.0 == SEQUENCE).and_then(|e| der_children(e.1)) else {
        return err("malformed tbs crl");
    };
    let mut tbs = tbs.into_iter().peekable();
    // version: required, and 1 (v2)
    let Some(version) = tbs.next().filter(|e| e.0 == INTEGER) else {
        return err("unsupported crl version");
    };
    if !minimal_integer(version.1) || version.1.len() > 8 {
        return err("malformed crl");
    }
    let v = version.1.iter().fold(if version.1[0] & 0x80 != 0 { -1i64 } else { 0 }, |acc, b| (acc << 8) | *b as i64);
    if v != 1 {
        return Err(format!("x509: unsupported crl version: {v}"));
    }
    let Some(sig_ai) = tbs.next().filter(|e| e.0 == SEQUENCE) else {
        return err("malformed signature algorithm identifier");
    };
    let Some(outer_ai) = outer.next().filter(|e| e.0 == SEQUENCE) else {
        return err("malformed algorithm identifier");
    };
    if outer_ai.1 != sig_ai.1 {
        return err("inner and outer signature algorithm identifiers don't match");
    }
    if outer.next().filter(|e| e.0 == BIT_STRING).is_none() {
        return err("malformed signature");
    }
    if tbs.next().filter(|e| e.0 == SEQUENCE).is_none() {
        return err("malformed issuer");
    }
    let is_time = |t: u8| t == UTC_TIME || t == GENERALIZED_TIME;
    if tbs.next().filter(|e| is_time(e.0)).is_none() {
        return err("unsupported time format");
    }
    if tbs.peek().is_some_and(|e| is_time(e.0)) {
        tbs.next();
    }
    let mut serials = Vec::new();
    if let Some(revoked) = tbs.next_if(|e| e.0 == SEQUENCE) {
        let Some(entries) = der_children(revoked.1) else { return err("malformed crl") };
        for (tag, entry, _) in entries {
            let parts = if tag == SEQUENCE { der_children(entry) } else { None };
            let Some(parts) = parts else { return err("malformed crl") };
            let mut parts = parts.into_iter();
            match parts.next() {
                Some((INTEGER, s, _)) if minimal_integer(s) => serials.push(magnitude(s)),
                _ => return err("malformed serial number"),
            }
            if !parts.next().is_some_and(|e| is_time(e.0)) {
                return err("unsupported time format");
            }
            if parts.next().is_some_and(|e| e.0 != SEQUENCE) {
                return err("malformed extensions");
            }
        }
    }
    Ok(serials)
}
