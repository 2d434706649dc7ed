//! The node-level caches, keyed by node id: copies of dataset files (named
//! files in the copy directory, [`crate::inputs::copies`]) and read-back outputs
//! (sealed memfds).
//!
//! Every client of a node shares one copy of a remote or decompressed file:
//! the first request loads it, concurrent requests for the same id wait for
//! that load instead of starting their own (counted as hits), later requests
//! find it ready. Values are reference counted (`Arc`): evicting an entry only
//! drops the cache's reference, so a reply being sent keeps its fd alive, and
//! a client keeps the pages alive for as long as it holds its own fd.
//! The cache holds at most `budget` bytes and `max_entries` entries, evicting
//! least recently used entries; a value larger than the whole budget is
//! served but not kept. An eviction hook runs under the cache's lock for each
//! entry evicted, so "in the cache" and "its file exists" change together.
//! [`Cache::shed`] evicts the older half on demand (the daemon calls it when
//! it runs out of file descriptors or space).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Hit / miss / eviction counters.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    /// Hits that joined a load already in flight.
    pub coalesced: AtomicU64,
}

struct Entry<V> {
    value: V,
    size: u64,
    tick: u64,
}

struct Pending<V, E> {
    slot: Mutex<Option<Result<V, E>>>,
    cv: Condvar,
}

struct Inner<V, E> {
    ready: HashMap<u32, Entry<V>>,
    lru: BTreeMap<u64, u32>,
    pending: HashMap<u32, Arc<Pending<V, E>>>,
    bytes: u64,
    tick: u64,
}

/// Called with each evicted key and value, under the cache's lock.
pub type EvictHook<V> = Box<dyn Fn(u32, &V) + Send + Sync>;

/// A byte- and count-budgeted LRU cache with load coalescing.
pub struct Cache<V, E> {
    inner: Mutex<Inner<V, E>>,
    budget: u64,
    max_entries: usize,
    on_evict: Option<EvictHook<V>>,
    pub stats: CacheStats,
}

impl<V: Clone, E: Clone> Cache<V, E> {
    pub fn new(budget: u64) -> Self {
        Self::with_limits(budget, usize::MAX, None)
    }

    /// At most `budget` bytes and `max_entries` entries; `on_evict` sees every evicted entry.
    pub fn with_limits(budget: u64, max_entries: usize, on_evict: Option<EvictHook<V>>) -> Self {
        Cache {
            inner: Mutex::new(Inner {
                ready: HashMap::new(),
                lru: BTreeMap::new(),
                pending: HashMap::new(),
                bytes: 0,
                tick: 0,
            }),
            budget,
            max_entries: max_entries.max(1),
            on_evict,
            stats: CacheStats::default(),
        }
    }

    fn evict_one(&self, g: &mut Inner<V, E>) -> bool {
        let Some((_, victim)) = g.lru.pop_first() else { return false };
        if let Some(e) = g.ready.remove(&victim) {
            g.bytes -= e.size;
            self.stats.evictions.fetch_add(1, Relaxed);
            if let Some(hook) = &self.on_evict {
                hook(victim, &e.value);
            }
        }
        true
    }

    /// Evicts the least recently used half of the entries (at least one, if
    /// any): what the daemon does when it runs out of fds or space. Returns
    /// how many were evicted.
    pub fn shed(&self) -> usize {
        let mut g = self.lock();
        let n = g.ready.len().div_ceil(2);
        let mut done = 0;
        while done < n && self.evict_one(&mut g) {
            done += 1;
        }
        done
    }

    /// Evicts every entry.
    pub fn clear(&self) {
        let mut g = self.lock();
        while self.evict_one(&mut g) {}
    }

    /// Drops `key`'s entry if it is the one holding `value` (found stale by its user).
    pub fn invalidate(&self, key: u32, is_it: impl Fn(&V) -> bool) {
        let mut g = self.lock();
        let stale = g.ready.get(&key).is_some_and(|e| is_it(&e.value));
        if stale {
            if let Some(e) = g.ready.remove(&key) {
                g.lru.remove(&e.tick);
                g.bytes -= e.size;
                if let Some(hook) = &self.on_evict {
                    hook(key, &e.value);
                }
            }
        }
    }

    /// Marks `key` as just used, if it is cached (a hit served without a load).
    pub fn touch(&self, key: u32) {
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some(e) = g.ready.get_mut(&key) {
            let old = std::mem::replace(&mut e.tick, tick);
            g.lru.remove(&old);
            g.lru.insert(tick, key);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<V, E>> {
        // A panic while holding the lock leaves consistent maps (every update
        // is a few non-panicking statements), so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes currently held and number of entries.
    pub fn usage(&self) -> (u64, usize) {
        let g = self.lock();
        (g.bytes, g.ready.len())
    }

    /// The value for `key`: cached, or being loaded by another caller (waits
    /// at most `wait`, then `timeout_err`), or loaded now by `load`, which
    /// returns the value and its size in bytes. Errors are not cached.
    pub fn get_or_load(
        &self,
        key: u32,
        wait: Duration,
        timeout_err: E,
        load: impl FnOnce() -> Result<(V, u64), E>,
    ) -> Result<V, E> {
        let pending = {
            let mut g = self.lock();
            g.tick += 1;
            let tick = g.tick;
            if let Some(e) = g.ready.get_mut(&key) {
                let old = std::mem::replace(&mut e.tick, tick);
                let v = e.value.clone();
                g.lru.remove(&old);
                g.lru.insert(tick, key);
                self.stats.hits.fetch_add(1, Relaxed);
                return Ok(v);
            }
            if let Some(p) = g.pending.get(&key) {
                let p = p.clone();
                drop(g);
                self.stats.hits.fetch_add(1, Relaxed);
                self.stats.coalesced.fetch_add(1, Relaxed);
                return wait_for(&p, wait, timeout_err);
            }
            let p = Arc::new(Pending { slot: Mutex::new(None), cv: Condvar::new() });
            g.pending.insert(key, p.clone());
            self.stats.misses.fetch_add(1, Relaxed);
            p
        };
        // Resolves the pending slot even if `load` panics, so waiters never hang.
        let mut guard = PendingGuard { cache: self, key, pending: &pending, result: Some(Err(timeout_err)) };
        let res = load();
        let out = res.as_ref().map(|(v, _)| v.clone()).map_err(|e| e.clone());
        let mut g = self.lock();
        if let Ok((v, size)) = res {
            if size <= self.budget {
                g.tick += 1;
                let tick = g.tick;
                if let Some(old) = g.ready.insert(key, Entry { value: v, size, tick }) {
                    g.lru.remove(&old.tick);
                    g.bytes -= old.size;
                }
                g.lru.insert(tick, key);
                g.bytes += size;
                while (g.bytes > self.budget || g.ready.len() > self.max_entries) && self.evict_one(&mut g) {}
            }
        }
        drop(g);
        guard.result = Some(out.clone());
        drop(guard);
        out
    }
}

fn wait_for<V: Clone, E: Clone>(p: &Pending<V, E>, wait: Duration, timeout_err: E) -> Result<V, E> {
    let deadline = Instant::now() + wait;
    let mut slot = p.slot.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(r) = slot.as_ref() {
            return r.clone();
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(timeout_err);
        }
        slot = p.cv.wait_timeout(slot, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
    }
}

struct PendingGuard<'a, V: Clone, E: Clone> {
    cache: &'a Cache<V, E>,
    key: u32,
    pending: &'a Arc<Pending<V, E>>,
    result: Option<Result<V, E>>,
}

impl<V: Clone, E: Clone> Drop for PendingGuard<'_, V, E> {
    fn drop(&mut self) {
        self.cache.lock().pending.remove(&self.key);
        *self.pending.slot.lock().unwrap_or_else(|e| e.into_inner()) = self.result.take();
        self.pending.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn stats(c: &Cache<u32, i32>) -> (u64, u64, u64) {
        (c.stats.hits.load(Relaxed), c.stats.misses.load(Relaxed), c.stats.evictions.load(Relaxed))
    }

    #[test]
    fn hit_miss_and_lru_eviction() {
        let c: Cache<u32, i32> = Cache::new(100);
        let w = Duration::from_secs(1);
        assert_eq!(c.get_or_load(1, w, -1, || Ok((10, 40))), Ok(10));
        assert_eq!(c.get_or_load(2, w, -1, || Ok((20, 40))), Ok(20));
        assert_eq!(c.get_or_load(1, w, -1, || panic!("cached")), Ok(10)); // 1 is now most recent
        assert_eq!(c.get_or_load(3, w, -1, || Ok((30, 40))), Ok(30)); // evicts 2
        assert_eq!(stats(&c), (1, 3, 1));
        assert_eq!(c.usage(), (80, 2));
        assert_eq!(c.get_or_load(2, w, -1, || Ok((21, 40))), Ok(21)); // reloaded, evicts 1
        assert_eq!(c.get_or_load(3, w, -1, || panic!("cached")), Ok(30));
        assert_eq!(stats(&c), (2, 4, 2));
    }

    #[test]
    fn count_bound_shed_invalidate_and_the_eviction_hook() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let c: Cache<u32, i32> =
            Cache::with_limits(1000, 3, Some(Box::new(move |k, v: &u32| s2.lock().unwrap().push((k, *v)))));
        let w = Duration::from_secs(1);
        for k in 1..=5u32 {
            assert_eq!(c.get_or_load(k, w, -1, || Ok((k * 10, 1))), Ok(k * 10));
        }
        assert_eq!(c.usage(), (3, 3), "three entries at most");
        assert_eq!(*seen.lock().unwrap(), vec![(1, 10), (2, 20)]);
        c.touch(3); // 3 becomes the most recent: 4 and 5 are older
        assert_eq!(c.shed(), 2);
        assert_eq!(*seen.lock().unwrap(), vec![(1, 10), (2, 20), (4, 40), (5, 50)]);
        c.invalidate(3, |v| *v == 99); // not that value: kept
        assert_eq!(c.usage(), (1, 1));
        c.invalidate(3, |v| *v == 30);
        assert_eq!(c.usage(), (0, 0));
        assert_eq!(seen.lock().unwrap().last(), Some(&(3, 30)));
        c.get_or_load(6, w, -1, || Ok((60, 1))).unwrap();
        c.clear();
        assert_eq!(c.usage(), (0, 0));
        assert_eq!(seen.lock().unwrap().len(), 6);
    }

    #[test]
    fn oversized_values_are_served_not_kept_and_errors_not_cached() {
        let c: Cache<u32, i32> = Cache::new(100);
        let w = Duration::from_secs(1);
        assert_eq!(c.get_or_load(1, w, -1, || Ok((1, 500))), Ok(1));
        assert_eq!(c.usage(), (0, 0));
        assert_eq!(c.get_or_load(2, w, -1, || Err(5)), Err(5));
        assert_eq!(c.get_or_load(2, w, -1, || Ok((2, 1))), Ok(2));
        assert_eq!(stats(&c), (0, 3, 0));
    }

    #[test]
    fn concurrent_requests_share_one_load() {
        let c: Arc<Cache<u32, i32>> = Arc::new(Cache::new(1000));
        let loads = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (c, loads) = (c.clone(), loads.clone());
                std::thread::spawn(move || {
                    c.get_or_load(7, Duration::from_secs(5), -1, || {
                        loads.fetch_add(1, Relaxed);
                        std::thread::sleep(Duration::from_millis(100));
                        Ok((77, 10))
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(77));
        }
        assert_eq!(loads.load(Relaxed), 1);
        assert_eq!(stats(&c), (7, 1, 0));
        assert_eq!(c.stats.coalesced.load(Relaxed), 7);
    }

    #[test]
    fn waiters_time_out_and_a_panicking_load_releases_them() {
        let c: Arc<Cache<u32, i32>> = Arc::new(Cache::new(1000));
        let c2 = c.clone();
        let slow = std::thread::spawn(move || {
            c2.get_or_load(1, Duration::from_secs(1), -1, || {
                std::thread::sleep(Duration::from_millis(300));
                Ok((1, 1))
            })
        });
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        assert_eq!(c.get_or_load(1, Duration::from_millis(50), -9, || panic!("joins")), Err(-9));
        assert!(t.elapsed() < Duration::from_millis(250));
        assert_eq!(slow.join().unwrap(), Ok(1));

        let c3 = c.clone();
        let boom = std::thread::spawn(move || {
            let _ = c3.get_or_load(2, Duration::from_secs(1), -1, || {
                std::thread::sleep(Duration::from_millis(100));
                panic!("load failed hard")
            });
        });
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(c.get_or_load(2, Duration::from_secs(5), -2, || panic!("joins")), Err(-1), "the loader's error value");
        assert!(boom.join().is_err());
        assert_eq!(c.get_or_load(2, Duration::from_secs(1), -1, || Ok((3, 1))), Ok(3));
    }
}
