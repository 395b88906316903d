//! A header block checked before the `hpack` crate decodes it.
//!
//! hpack 0.3's decoder panics on some malformed blocks (a dynamic table
//! size update cut short: `decode_integer(..).ok().unwrap()`), and it takes
//! any table size a client asks for, where RFC 7541 (4.2, 6.3) allows at
//! most the size the server's SETTINGS announced and only at the start of
//! a block.  Before the rewriter (authority.rs) hands a block to the
//! decoder, `check` walks its representations and refuses what the
//! decoder would choke on or should refuse: an integer or string cut
//! short, an integer longer than the decoder reads (5 octets), a size
//! update over the limit or after a header field.  What passes is decoded
//! by hpack as before (a bad index or Huffman code is its own error).

/// HTTP/2's default SETTINGS_HEADER_TABLE_SIZE, which brain's server
/// keeps: the largest dynamic table a client may ask for.
pub const MAX_TABLE_SIZE: usize = 4096;

/// The longest integer hpack 0.3 decodes, in octets (prefix included).
const MAX_INTEGER_OCTETS: usize = 5;

/// An integer with an `n`-bit prefix at the start of `buf`: (value, octets).
fn integer(buf: &[u8], n: u8) -> Result<(usize, usize), &'static str> {
    let first = *buf.first().ok_or("integer cut short")?;
    let mask = ((1u16 << n) - 1) as u8;
    let mut value = (first & mask) as usize;
    if value < mask as usize {
        return Ok((value, 1));
    }
    let mut shift = 0u32;
    for (i, &b) in buf.iter().enumerate().skip(1) {
        if i + 1 >= MAX_INTEGER_OCTETS && b & 0x80 != 0 {
            return Err("integer too long");
        }
        value += ((b & 0x7f) as usize) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    Err("integer cut short")
}

/// A string literal at the start of `buf`: its octets on the wire.
fn string(buf: &[u8]) -> Result<usize, &'static str> {
    let (len, n) = integer(buf, 7)?;
    if buf.len() - n < len {
        return Err("string cut short");
    }
    Ok(n + len)
}

/// Why `block` must not reach the decoder, if it must not.
pub fn check(block: &[u8], max_table_size: usize) -> Result<(), &'static str> {
    let mut p = 0;
    let mut fields = false;
    while p < block.len() {
        let b = block[p];
        if b & 0x80 != 0 {
            // indexed field
            p += integer(&block[p..], 7)?.1;
            fields = true;
        } else if b & 0xe0 == 0x20 {
            // dynamic table size update
            if fields {
                return Err("table size update after a header field");
            }
            let (size, n) = integer(&block[p..], 5)?;
            if size > max_table_size {
                return Err("table size update over the limit");
            }
            p += n;
        } else {
            // a literal: with incremental indexing (6-bit index), else without or never indexed (4-bit)
            let (index, n) = integer(&block[p..], if b & 0x40 != 0 { 6 } else { 4 })?;
            p += n;
            if index == 0 {
                p += string(&block[p..])?;
            }
            p += string(&block[p..])?;
            fields = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_update_cut_short_is_refused() {
        // 0x3f: a size update whose value goes on, then a continuation octet, then nothing
        assert_eq!(check(&[0x3f, 0x80], MAX_TABLE_SIZE), Err("integer cut short"));
        // hpack itself panics on it (decoder.rs: decode_integer(..).ok().unwrap())
        let block = [0x3f, 0x80];
        let r = std::panic::catch_unwind(|| hpack::Decoder::new().decode(&block).is_ok());
        assert!(r.is_err(), "hpack 0.3 no longer panics here: the check may be simpler now");
    }

    #[test]
    fn table_sizes_up_to_the_limit_only_at_the_start() {
        assert_eq!(check(&[0x3f, 0xe1, 0x1f], MAX_TABLE_SIZE), Ok(())); // 4096
        assert_eq!(check(&[0x3f, 0xe2, 0x1f], MAX_TABLE_SIZE), Err("table size update over the limit"));
        assert_eq!(check(&[0x20, 0x82], MAX_TABLE_SIZE), Ok(()));
        assert_eq!(check(&[0x82, 0x20], MAX_TABLE_SIZE), Err("table size update after a header field"));
    }

    #[test]
    fn what_real_clients_send_passes() {
        let mut e = hpack::Encoder::new();
        let block = e.encode(vec![
            (&b":method"[..], &b"POST"[..]),
            (&b":authority"[..], &b"/run/etcd.sock"[..]),
            (&b"content-type"[..], &b"application/grpc"[..]),
            (&b"x-long"[..], &[b'v'; 300][..]),
        ]);
        assert_eq!(check(&block, MAX_TABLE_SIZE), Ok(()));
        for cut in 1..block.len() {
            assert!(check(&block[..cut], MAX_TABLE_SIZE).is_err() || hpack::Decoder::new().decode(&block[..cut]).is_ok());
        }
    }

    #[test]
    fn integers_longer_than_the_decoder_reads_are_refused() {
        assert_eq!(check(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x01], MAX_TABLE_SIZE), Err("integer too long"));
        assert!(check(&[0xff, 0x80, 0x80, 0x80, 0x01], MAX_TABLE_SIZE).is_ok());
    }
}
