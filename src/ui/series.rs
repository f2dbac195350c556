//! A bounded history of samples for sparklines.

use std::collections::VecDeque;

/// The last `capacity` values of one measurement, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    values: VecDeque<u64>,
    capacity: usize,
}

impl Series {
    pub fn new(capacity: usize) -> Series {
        Series {
            values: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
        }
    }

    pub fn push(&mut self, v: u64) {
        if self.values.len() == self.capacity {
            self.values.pop_front();
        }
        self.values.push_back(v);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn last(&self) -> Option<u64> {
        self.values.back().copied()
    }

    pub fn max(&self) -> u64 {
        self.values.iter().copied().max().unwrap_or(0)
    }

    /// The newest `n` values, oldest first (what fits a sparkline `n` columns wide).
    pub fn tail(&self, n: usize) -> Vec<u64> {
        let skip = self.values.len().saturating_sub(n);
        self.values.iter().skip(skip).copied().collect()
    }
}

impl Default for Series {
    fn default() -> Self {
        Series::new(240)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_values() {
        let mut s = Series::new(3);
        for v in 1..=5 {
            s.push(v);
        }
        assert_eq!(s.tail(10), [3, 4, 5]);
        assert_eq!(s.tail(2), [4, 5]);
        assert_eq!(s.max(), 5);
        assert_eq!(s.last(), Some(5));
        assert_eq!(s.len(), 3);
    }
}
