//! A bounded table of one context's events, addressed by generation-checked tokens.
//!
//! NCCL only stores and passes back the `void*` it gets from `startEvent`, so the
//! handle need not be a pointer. Here it is `ctx | slot | generation` packed into
//! 64 bits: a stale, doubled or foreign handle fails the generation check instead of
//! reaching freed memory. Stopped events stay in their slot (a proxy operation
//! starts after its collective stopped and still names it as parent) until the
//! slot is the oldest stopped one and a new event needs room.

use std::collections::VecDeque;
use std::sync::Arc;

/// Bits of a handle: context index + 1 (16) | slot (32) | generation (16).
const CTX_SHIFT: u32 = 48;
const SLOT_SHIFT: u32 = 16;
/// Generation value reserved for context tokens (events never use it).
pub(crate) const CTX_MARK: u64 = 0xFFFF;

/// Largest number of contexts alive at once in one process (16 bits of a handle).
pub(crate) const MAX_CONTEXTS: usize = 0xFFFE;

/// Packs a context token (never NULL).
pub(crate) fn ctx_token(index: usize) -> u64 {
    ((index as u64 + 1) << CTX_SHIFT) | CTX_MARK
}

/// The context index of a context token, if it is one.
pub(crate) fn ctx_of_token(token: u64) -> Option<usize> {
    (token & 0xFFFF_FFFF_FFFF == CTX_MARK && token >> CTX_SHIFT != 0)
        .then(|| (token >> CTX_SHIFT) as usize - 1)
}

/// A decoded event handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventToken {
    /// Context index.
    pub ctx: usize,
    slot: u32,
    generation: u16,
}

impl EventToken {
    /// Decodes a handle (`None` for NULL, context tokens and non-tokens).
    pub fn decode(raw: u64) -> Option<Self> {
        let ctx = raw >> CTX_SHIFT;
        let generation = (raw & 0xFFFF) as u16;
        // `then`, not `then_some`: the subtraction must only run for ctx != 0.
        (ctx != 0 && u64::from(generation) != CTX_MARK).then(|| Self {
            ctx: ctx as usize - 1,
            slot: ((raw >> SLOT_SHIFT) & 0xFFFF_FFFF) as u32,
            generation,
        })
    }

    /// The handle value.
    pub fn encode(self) -> u64 {
        ((self.ctx as u64 + 1) << CTX_SHIFT)
            | (u64::from(self.slot) << SLOT_SHIFT)
            | u64::from(self.generation)
    }
}

struct Slot<E> {
    generation: u16,
    event: Option<Arc<E>>,
    stopped: bool,
}

/// Why a handle did not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Miss {
    /// No such slot or an older generation: stale or foreign handle.
    Unknown,
    /// The event was already stopped.
    Stopped,
}

/// One context's events.
pub(crate) struct Slab<E> {
    ctx: usize,
    cap: usize,
    slots: Vec<Slot<E>>,
    free: Vec<u32>,
    retired: VecDeque<u32>,
}

impl<E> Slab<E> {
    /// An empty table for context `ctx` holding at most `cap` events (1 … 2^32-1).
    pub fn new(ctx: usize, cap: usize) -> Self {
        Self {
            ctx,
            cap: cap.clamp(1, u32::MAX as usize),
            slots: Vec::new(),
            free: Vec::new(),
            retired: VecDeque::new(),
        }
    }

    /// Reserves a slot for an event about to start; `None` when every slot holds a
    /// live or reserved event. The second value is an evicted stopped event, to be
    /// dropped outside any lock. Reserving before the profiler runs means it never
    /// accepts an event that then gets no handle.
    pub fn reserve(&mut self) -> (Option<EventToken>, Option<Arc<E>>) {
        let mut evicted = None;
        let slot = if let Some(s) = self.free.pop() {
            s
        } else if self.slots.len() < self.cap {
            self.slots.push(Slot {
                generation: 0,
                event: None,
                stopped: false,
            });
            (self.slots.len() - 1) as u32
        } else if let Some(s) = self.retired.pop_front() {
            evicted = self.slots[s as usize].event.take();
            s
        } else {
            return (None, None);
        };
        let entry = &mut self.slots[slot as usize];
        // Skip the context mark so an event handle never looks like a context.
        entry.generation = (entry.generation.wrapping_add(1)) % (CTX_MARK as u16);
        entry.event = None;
        entry.stopped = false;
        let token = EventToken {
            ctx: self.ctx,
            slot,
            generation: entry.generation,
        };
        (Some(token), evicted)
    }

    /// Stores the started event in its reserved slot.
    pub fn fill(&mut self, token: EventToken, event: Arc<E>) {
        if let Some(s) = self.slots.get_mut(token.slot as usize)
            && s.generation == token.generation
        {
            s.event = Some(event);
        }
    }

    /// Returns a reserved slot the profiler declined.
    pub fn release(&mut self, token: EventToken) {
        if let Some(s) = self.slots.get_mut(token.slot as usize)
            && s.generation == token.generation
            && s.event.is_none()
        {
            self.free.push(token.slot);
        }
    }

    /// Reserves and fills in one step.
    #[cfg(test)]
    fn insert(&mut self, event: Arc<E>) -> (Option<EventToken>, Option<Arc<E>>) {
        let (token, evicted) = self.reserve();
        if let Some(t) = token {
            self.fill(t, event);
        }
        (token, evicted)
    }

    fn slot(&self, token: EventToken) -> Result<&Slot<E>, Miss> {
        match self.slots.get(token.slot as usize) {
            Some(s)
                if token.ctx == self.ctx
                    && s.generation == token.generation
                    && s.event.is_some() =>
            {
                Ok(s)
            }
            _ => Err(Miss::Unknown),
        }
    }

    /// A live event (for `recordEventState`).
    pub fn live(&self, token: EventToken) -> Result<Arc<E>, Miss> {
        let s = self.slot(token)?;
        if s.stopped {
            return Err(Miss::Stopped);
        }
        s.event.clone().ok_or(Miss::Unknown)
    }

    /// A live or stopped-but-kept event (for a parent).
    pub fn any(&self, token: EventToken) -> Option<Arc<E>> {
        self.slot(token).ok().and_then(|s| s.event.clone())
    }

    /// Marks a live event stopped and queues its slot for reuse.
    pub fn stop(&mut self, token: EventToken) -> Result<Arc<E>, Miss> {
        let event = self.live(token)?;
        self.slots[token.slot as usize].stopped = true;
        self.retired.push_back(token.slot);
        Ok(event)
    }

    /// Events currently held (live and stopped).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.event.is_some()).count()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_never_look_like_contexts() {
        for (ctx, slot, generation) in
            [(0usize, 0u32, 1u16), (5, 77, 0xFFFE), (0xFFFD, u32::MAX, 0)]
        {
            let t = EventToken {
                ctx,
                slot,
                generation,
            };
            let raw = t.encode();
            assert_ne!(raw, 0);
            assert_eq!(EventToken::decode(raw), Some(t));
            assert_eq!(ctx_of_token(raw), None);
        }
        let c = ctx_token(41);
        assert_eq!(ctx_of_token(c), Some(41));
        assert_eq!(EventToken::decode(c), None);
        assert_eq!(EventToken::decode(0), None);
    }

    #[test]
    fn full_table_declines_then_reuses_the_oldest_stopped_slot() {
        let mut slab = Slab::new(3, 3);
        let toks: Vec<_> = (0..3)
            .map(|i| slab.insert(Arc::new(i)).0.unwrap())
            .collect();
        assert_eq!(slab.insert(Arc::new(99)).0, None, "all live: declined");
        assert_eq!(*slab.stop(toks[1]).unwrap(), 1);
        assert_eq!(slab.stop(toks[1]).unwrap_err(), Miss::Stopped);
        assert_eq!(*slab.stop(toks[2]).unwrap(), 2);
        // A stopped event still resolves as a parent until its slot is reused.
        assert_eq!(slab.any(toks[1]).as_deref(), Some(&1));
        let (t4, evicted) = slab.insert(Arc::new(4));
        let t4 = t4.unwrap();
        assert_eq!(evicted.as_deref(), Some(&1), "oldest stopped evicted first");
        assert_eq!(slab.any(toks[1]), None, "stale handle no longer resolves");
        assert_eq!(slab.live(toks[1]).unwrap_err(), Miss::Unknown);
        assert_eq!(*slab.live(t4).unwrap(), 4);
        assert_eq!(slab.len(), 3);
        // A declined reservation frees its slot again; its token never resolves.
        slab.stop(t4).unwrap();
        let (r, _) = slab.reserve();
        let r = r.unwrap();
        assert_eq!(slab.live(r).unwrap_err(), Miss::Unknown);
        slab.release(r);
        assert_eq!(slab.free, vec![r.slot]);
        // A handle of another context never resolves here.
        let foreign = EventToken { ctx: 4, ..t4 };
        assert_eq!(slab.any(foreign), None);
    }
}
