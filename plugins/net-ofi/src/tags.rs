//! The 64-bit tag space shared by every comm on one endpoint.
//!
//! ```text
//! data:    0 | comm id (16) | seq (S) | NCCL tag (32)      S = usable bits - 49
//! control: 1 | 0 …           kind (3) at bit 16 | id (16)
//! ```
//! The receiving side owns the comm id (unique per endpoint), so messages of many
//! comms never match each other's receives. `seq` counts messages per (comm, NCCL
//! tag) on both sides: the k-th send with tag t matches the k-th receive buffer with
//! tag t, which is how NCCL pairs grouped receives, and it makes matching
//! independent of the provider's message ordering.

/// Bits of the comm id field.
pub const COMM_BITS: u32 = 16;
/// Bits of the NCCL tag field.
const NCCL_TAG_BITS: u32 = 32;
/// Fewest sequence bits accepted: 32 requests × 8 buffers in flight per tag must
/// never wrap onto a message still unmatched.
const MIN_SEQ_BITS: u32 = 9;

/// Kinds of control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Ctrl {
    /// Connect request, to a listen id.
    Connect = 1,
    /// Connect reply, to the connecting side's id.
    Accept = 2,
    /// Liveness probe (zero bytes, any id).
    Ping = 3,
    /// A bundle of small sends, to a receive comm's id (`bundle.rs`).
    Bundle = 4,
    /// Clear to write: a posted receive offered as a write target, to the send
    /// comm's id (`engine/write.rs`).
    Cts = 5,
}

/// How tags are laid out for a provider that matches `bits` tag bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagLayout {
    seq_bits: u32,
    ctrl: u64,
}

impl TagLayout {
    /// The layout for `bits` usable tag bits, `None` if too few.
    pub fn new(bits: u32) -> Option<Self> {
        let bits = bits.min(64);
        let seq_bits = bits.checked_sub(1 + COMM_BITS + NCCL_TAG_BITS)?;
        (seq_bits >= MIN_SEQ_BITS).then_some(Self {
            seq_bits,
            ctrl: 1 << (bits - 1),
        })
    }

    /// Tag of the `seq`-th message with NCCL tag `tag` on comm `comm`.
    pub fn data(&self, comm: u16, seq: u32, tag: i32) -> u64 {
        let seq = u64::from(seq) & ((1u64 << self.seq_bits) - 1);
        (u64::from(comm) << (NCCL_TAG_BITS + self.seq_bits))
            | (seq << NCCL_TAG_BITS)
            | u64::from(tag as u32)
    }

    /// The comm id of a data tag; `None` for a control tag.
    pub fn comm_of(&self, tag: u64) -> Option<u16> {
        (tag & self.ctrl == 0).then(|| (tag >> (NCCL_TAG_BITS + self.seq_bits)) as u16)
    }

    /// Tag of a control message of `kind` to `id`.
    pub fn ctrl(&self, kind: Ctrl, id: u16) -> u64 {
        self.ctrl | ((kind as u64) << 16) | u64::from(id)
    }

    /// Ignore mask that makes a receive match every id of one control kind.
    pub fn any_id() -> u64 {
        0xffff
    }
}

/// Per-comm sequence counters, one per NCCL tag seen (NCCL uses a handful).
#[derive(Debug, Default)]
pub struct Seqs(Vec<(i32, u32)>);

impl Seqs {
    /// Returns the next sequence number for `tag` and advances it.
    pub fn next(&mut self, tag: i32) -> u32 {
        if let Some((_, s)) = self.0.iter_mut().find(|(t, _)| *t == tag) {
            let v = *s;
            *s = s.wrapping_add(1);
            return v;
        }
        self.0.push((tag, 1));
        0
    }

    /// The sequence number [`Seqs::next`] would return for `tag`, without taking it.
    pub fn peek(&self, tag: i32) -> u32 {
        self.0
            .iter()
            .find(|(t, _)| *t == tag)
            .map_or(0, |&(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_do_not_overlap() {
        let l = TagLayout::new(64).unwrap();
        let a = l.data(0xffff, u32::MAX, -1);
        assert_eq!(a & l.ctrl, 0, "data never sets the control bit");
        assert_eq!(l.data(1, 0, 0), 1 << 47);
        assert_eq!(l.data(0, 1, 0), 1 << 32);
        assert_eq!(l.data(0, 0, -1), 0xffff_ffff);
        assert_ne!(l.data(1, 0, 7), l.data(2, 0, 7));
        assert_ne!(l.data(1, 0, 7), l.data(1, 1, 7));
        assert_eq!(l.ctrl(Ctrl::Connect, 5), (1 << 63) | (1 << 16) | 5);
        assert_ne!(l.ctrl(Ctrl::Connect, 5), l.ctrl(Ctrl::Accept, 5));
        assert_eq!(l.comm_of(l.data(0xbeef, 77, -3)), Some(0xbeef));
        assert_eq!(l.comm_of(l.ctrl(Ctrl::Bundle, 0xbeef)), None);
        let n = TagLayout::new(60).unwrap();
        assert_eq!(n.comm_of(n.data(0xffff, u32::MAX, -1)), Some(0xffff));
    }

    #[test]
    fn peek_does_not_take() {
        let mut s = Seqs::default();
        assert_eq!(s.peek(5), 0);
        assert_eq!(s.next(5), 0);
        assert_eq!((s.peek(5), s.peek(5), s.peek(6)), (1, 1, 0));
        assert_eq!(s.next(5), 1);
        assert_eq!(s.next(6), 0);
        assert_eq!(s.peek(5), 2);
    }

    #[test]
    fn narrow_providers() {
        let l = TagLayout::new(60).unwrap();
        assert_eq!(l.ctrl, 1 << 59);
        assert_eq!(l.data(0xffff, u32::MAX, -1) >> 59, 0);
        assert!(TagLayout::new(57).is_none());
        assert!(TagLayout::new(58).is_some());
    }

    #[test]
    fn sequences_are_per_tag() {
        let mut s = Seqs::default();
        assert_eq!(s.next(3), 0);
        assert_eq!(s.next(3), 1);
        assert_eq!(s.next(-1), 0);
        assert_eq!(s.next(3), 2);
        assert_eq!(s.next(-1), 1);
    }
}
