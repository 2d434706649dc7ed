//! A process-wide pool of byte buffers, bounded in total capacity.
//!
//! Remote payloads are received into, and compressed payloads decoded into,
//! buffers taken from here and given back after use: the pages stay
//! allocated (warm) instead of being faulted in afresh for every file, which
//! costs as much as the transfer itself on some machines. At most `limit`
//! bytes of capacity are kept, whatever the number of client connections.

use std::sync::Mutex;

pub struct BufPool {
    bufs: Mutex<Vec<Vec<u8>>>,
    limit: usize,
}

impl BufPool {
    pub const fn new(limit: usize) -> BufPool {
        BufPool { bufs: Mutex::new(Vec::new()), limit }
    }

    /// A buffer of exactly `len` bytes: the smallest kept one that is large
    /// enough, else the largest kept one (grown), else a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut v = {
            let mut g = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
            let fit = g.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i);
            let pick = fit.or_else(|| g.iter().enumerate().max_by_key(|(_, b)| b.capacity()).map(|(i, _)| i));
            pick.map(|i| g.swap_remove(i)).unwrap_or_default()
        };
        v.resize(len, 0); // zeroing warm pages is cheap; shrinking keeps the capacity
        v
    }

    /// Returns a buffer; kept if the pool stays within its limit (evicting
    /// smaller buffers to make room for a larger one).
    pub fn put(&self, v: Vec<u8>) {
        if v.capacity() > self.limit || v.capacity() == 0 {
            return;
        }
        let mut g = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        let mut total: usize = g.iter().map(|b| b.capacity()).sum();
        while total + v.capacity() > self.limit {
            let Some((i, _)) = g.iter().enumerate().min_by_key(|(_, b)| b.capacity()) else { break };
            if g[i].capacity() >= v.capacity() {
                return; // everything kept is at least as useful
            }
            total -= g.swap_remove(i).capacity();
        }
        g.push(v);
    }

    /// Capacity currently kept.
    pub fn kept(&self) -> usize {
        self.bufs.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|b| b.capacity()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_best_fit_and_limit() {
        let p = BufPool::new(100);
        let a = p.take(40);
        assert_eq!(a.len(), 40);
        let cap_a = a.capacity();
        p.put(a);
        let b = p.take(10);
        assert_eq!((b.len(), b.capacity()), (10, cap_a), "reused, not reallocated");
        p.put(b);
        p.put(vec![0u8; 50]);
        assert!(p.kept() <= 100);
        let c = p.take(45);
        assert!(c.capacity() >= 50 && c.capacity() < cap_a + 50);
        p.put(c);
        p.put(vec![0u8; 200]); // over the limit: dropped
        assert!(p.kept() <= 100);
        p.put(vec![0u8; 90]); // evicts smaller ones to fit
        assert!(p.kept() <= 100);
        assert_eq!(p.take(90).capacity(), 90);
    }
}
