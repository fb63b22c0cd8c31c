//! A list that holds one element without allocating: a group usually carries one
//! collective, and its collective list and decisions are built on every call.

use std::ops::Deref;

use crate::tune::Decision;

/// One element inline, or none or several on the heap, read as a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Few<T> {
    One([T; 1]),
    Many(Vec<T>),
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Few::Many(Vec::new())
    }
}

impl<T: Copy> Few<T> {
    /// Appends `x`; the second element moves the list to the heap.
    pub(crate) fn push(&mut self, x: T) {
        match self {
            Few::Many(v) if v.is_empty() => *self = Few::One([x]),
            Few::Many(v) => v.push(x),
            Few::One([a]) => *self = Few::Many(vec![*a, x]),
        }
    }
}

impl<T> Deref for Few<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Few::One(a) => a,
            Few::Many(v) => v,
        }
    }
}

impl<'a, T> IntoIterator for &'a Few<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The decisions a group of collectives ran with, one per collective in the order
/// they were added (p2p-based ones report Ring/Simple). Read it as a slice of
/// [`Decision`]s or iterate it; a group of one keeps its decision inline.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Decisions(pub(crate) Few<Decision>);

impl Deref for Decisions {
    type Target = [Decision];

    fn deref(&self) -> &[Decision] {
        &self.0
    }
}

impl IntoIterator for Decisions {
    type Item = Decision;
    type IntoIter = DecisionsIter;

    fn into_iter(self) -> DecisionsIter {
        DecisionsIter { all: self, next: 0 }
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The decisions of a [`Decisions`], by value, in order.
#[derive(Clone, Debug)]
pub struct DecisionsIter {
    all: Decisions,
    next: usize,
}

impl Iterator for DecisionsIter {
    type Item = Decision;

    fn next(&mut self) -> Option<Decision> {
        let d = self.all.get(self.next).copied()?;
        self.next += 1;
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stays_inline_and_more_spill_in_order() {
        let mut f: Few<u32> = Few::default();
        assert!(f.is_empty());
        f.push(7);
        assert!(matches!(f, Few::One(_)));
        assert_eq!(&*f, &[7]);
        for x in [9, 11, 13] {
            f.push(x);
        }
        assert_eq!(&*f, &[7, 9, 11, 13]);
    }
}
