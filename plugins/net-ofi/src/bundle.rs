//! Bundles: several small sends of one connection carried by one tagged message.
//!
//! A provider that puts every message on a kernel socket (`tcp;ofi_rxm`) spends
//! one `sendmsg` per message, and that system call, not the bytes, is most of a
//! small message's cost. While a connection's earlier sends are still in flight,
//! later small host-memory sends are copied into a bundle instead; the bundle goes
//! out when the connection has nothing else in flight or when it is full, as one
//! message on the receive comm's bundle tag. The receiver copies each record into
//! the receive posted for its tag (cancelling that receive's own post) or keeps it
//! until that receive is posted.
//!
//! ```text
//! bundle:  magic "cBND" (4) | records (2) | 0 (2) | bytes (4) | 0 (4)
//! record:  data tag (8) | length (4) | 0 (4) | payload, padded to 8 bytes
//! ```
//! Little-endian. A record carries the full 64-bit data tag the sender would have
//! posted the message with, so a receive matches it exactly as it would match the
//! message itself (`tags.rs`), whatever the order bundles and direct messages
//! arrive in.

/// Bytes of the bundle header.
pub const HEADER: usize = 16;
/// Bytes of a record header.
pub const RECORD: usize = 16;
/// Most records one bundle may carry (a bound on what a peer can make us scan).
pub const MAX_RECORDS: usize = 1024;

const MAGIC: u32 = u32::from_le_bytes(*b"cBND");

/// Bytes a record of `len` payload bytes takes in a bundle.
pub const fn record_bytes(len: usize) -> usize {
    RECORD + len.next_multiple_of(8)
}

/// A bundle being filled, in a buffer of fixed capacity.
pub struct Writer {
    buf: Box<[u8]>,
    limit: usize,
    used: usize,
    records: usize,
}

impl Writer {
    /// An empty bundle over `buf` that holds at most `limit` bytes (a buffer
    /// kept for larger bundles can carry a smaller one).
    pub fn with_limit(buf: Box<[u8]>, limit: usize) -> Self {
        Self {
            limit: limit.min(buf.len()),
            buf,
            used: HEADER,
            records: 0,
        }
    }

    /// Whether a record of `len` bytes still fits.
    pub fn fits(&self, len: usize) -> bool {
        self.records < MAX_RECORDS && self.used + record_bytes(len) <= self.limit
    }

    /// Bytes used so far (header included).
    pub fn used(&self) -> usize {
        self.used
    }

    /// Records so far.
    pub fn records(&self) -> usize {
        self.records
    }

    /// Appends a record; the caller checked [`fits`](Self::fits).
    pub fn push(&mut self, tag: u64, payload: &[u8]) {
        let at = self.used;
        self.buf[at..at + 8].copy_from_slice(&tag.to_le_bytes());
        self.buf[at + 8..at + 12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        self.buf[at + 12..at + 16].fill(0);
        let data = at + RECORD;
        self.buf[data..data + payload.len()].copy_from_slice(payload);
        // Padding is zeroed: a reused buffer must not carry old bytes to the peer.
        self.buf[data + payload.len()..at + record_bytes(payload.len())].fill(0);
        self.used += record_bytes(payload.len());
        self.records += 1;
    }

    /// The finished bundle: its buffer and how many bytes of it to send.
    pub fn finish(mut self) -> (Box<[u8]>, usize) {
        self.buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        self.buf[4..6].copy_from_slice(&(self.records as u16).to_le_bytes());
        self.buf[6..8].fill(0);
        self.buf[8..12].copy_from_slice(&(self.used as u32).to_le_bytes());
        self.buf[12..16].fill(0);
        (self.buf, self.used)
    }
}

/// One record of a received bundle: its data tag and where its payload lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The 64-bit data tag.
    pub tag: u64,
    /// Offset of the payload in the bundle.
    pub off: usize,
    /// Payload bytes.
    pub len: usize,
}

/// Reads the records of the `n` bytes of a received bundle, checking every
/// length against what arrived; `Err` names what is malformed.
pub fn parse(b: &[u8], n: usize) -> Result<Vec<Record>, String> {
    let b = &b[..n.min(b.len())];
    if b.len() < HEADER {
        return Err(format!("{} bytes, shorter than a bundle header", b.len()));
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if u32_at(0) != MAGIC {
        return Err("bad magic".into());
    }
    let count = usize::from(u16::from_le_bytes([b[4], b[5]]));
    let total = u32_at(8) as usize;
    if total != b.len() {
        return Err(format!("header says {total} bytes, {} arrived", b.len()));
    }
    if count > MAX_RECORDS {
        return Err(format!("{count} records (at most {MAX_RECORDS})"));
    }
    let mut out = Vec::with_capacity(count);
    let mut at = HEADER;
    for i in 0..count {
        if at + RECORD > total {
            return Err(format!("record {i} of {count} starts past the end"));
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[at..at + 8]);
        let len = u32_at(at + 8) as usize;
        let off = at + RECORD;
        if len > total - off {
            return Err(format!(
                "record {i} of {count}: {len} bytes at offset {off} of {total}"
            ));
        }
        let next = off + len.next_multiple_of(8);
        if next > total {
            return Err(format!("record {i} of {count}: padding runs past the end"));
        }
        out.push(Record {
            tag: u64::from_le_bytes(t),
            off,
            len,
        });
        at = next;
    }
    if at != total {
        return Err(format!("{} bytes after the last record", total - at));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(records: &[(u64, Vec<u8>)], cap: usize) -> (Box<[u8]>, usize) {
        let mut w = Writer::with_limit(vec![0xee; cap].into_boxed_slice(), cap);
        for (t, p) in records {
            assert!(w.fits(p.len()));
            w.push(*t, p);
        }
        w.finish()
    }

    #[test]
    fn round_trip_odd_sizes() {
        let recs: Vec<(u64, Vec<u8>)> = [0usize, 1, 7, 8, 13, 4095]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                (
                    (i as u64) << 32 | 0xabc,
                    (0..n).map(|j| (j * 31 + i) as u8).collect(),
                )
            })
            .collect();
        let (b, n) = bundle(&recs, 8192);
        let got = parse(&b, n).unwrap();
        assert_eq!(got.len(), recs.len());
        for (r, (t, p)) in got.iter().zip(&recs) {
            assert_eq!(r.tag, *t);
            assert_eq!(&b[r.off..r.off + r.len], &p[..]);
        }
    }

    #[test]
    fn capacity_is_respected() {
        let cap = HEADER + record_bytes(100);
        let mut w = Writer::with_limit(vec![0; cap].into_boxed_slice(), cap);
        assert!(w.fits(100));
        assert!(!w.fits(101 + 8));
        w.push(1, &[5; 100]);
        assert!(!w.fits(0));
        assert_eq!(w.records(), 1);
        // A limit below the buffer's size binds; one above it does not.
        let mut w = Writer::with_limit(vec![0; 4096].into_boxed_slice(), HEADER + record_bytes(24));
        assert!(w.fits(24) && !w.fits(25 + 8));
        w.push(3, &[1; 21]);
        assert_eq!(w.used(), HEADER + record_bytes(21));
        assert!(!w.fits(0));
        let w = Writer::with_limit(vec![0; 64].into_boxed_slice(), 1 << 20);
        assert!(w.fits(64 - HEADER - RECORD) && !w.fits(64 - HEADER - RECORD + 1));
    }

    #[test]
    fn hostile_bundles_are_refused() {
        let (b, n) = bundle(&[(9, vec![1; 20]), (10, vec![2; 3])], 256);
        // Truncated anywhere: the header's total no longer matches.
        for cut in [0, 3, HEADER, n - 1] {
            assert!(parse(&b, cut).is_err(), "cut at {cut}");
        }
        let mut bad = b.to_vec();
        bad[0] ^= 1;
        assert!(parse(&bad, n).unwrap_err().contains("magic"));
        // A record longer than the bundle.
        let mut long = b.to_vec();
        long[HEADER + 8..HEADER + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&long, n).is_err());
        // More records than bytes for them.
        let mut many = b.to_vec();
        many[4..6].copy_from_slice(&3u16.to_le_bytes());
        assert!(parse(&many, n).is_err());
        // Fewer records than bytes: trailing garbage.
        let mut few = b.to_vec();
        few[4..6].copy_from_slice(&1u16.to_le_bytes());
        assert!(
            parse(&few, n)
                .unwrap_err()
                .contains("after the last record")
        );
        let mut huge = b.to_vec();
        huge[4..6].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(parse(&huge, n).is_err());
    }
}
