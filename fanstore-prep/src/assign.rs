//! Assigns files to partitions, balanced by bytes.
//!
//! Files arrive in the manifest's depth-first order. Files under a
//! `--replicate-dir` form one group, all others another; each group is cut
//! into contiguous runs of nearly equal weight, where a file weighs its size
//! plus its entry header (so that empty files still spread out). Regular
//! partitions get ids `0..N`, replicated ones follow.
//!
//! How many partitions:
//! - `--partitions N`: exactly `N` regular partitions (some may be empty if
//!   there are fewer files than `N`);
//! - `--partition-size S`: `ceil(regular bytes / S)` regular partitions;
//! - neither: one per [`DEFAULT_PARTITION_BYTES`] (256 MiB) of regular bytes.
//!
//! Replicated partitions are sized like regular ones: `ceil(replicated bytes
//! / S)` where `S` is the partition size given, implied by `N`, or the
//! default. Outside `--partitions N` a group never gets more partitions than
//! files, and there is always at least one regular partition, so even an
//! empty tree gives a valid dataset.

use fanstore_core::partition::ENTRY_HEADER_LEN;
use std::ops::Range;

/// Default logical bytes per partition.
pub const DEFAULT_PARTITION_BYTES: u64 = 256 << 20;
/// Upper bound on the number of partitions of one group.
pub const MAX_PARTITIONS: u64 = 1 << 20;

/// How the user asked to size partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionCount {
    /// One partition per [`DEFAULT_PARTITION_BYTES`].
    Auto,
    /// Exactly this many regular partitions.
    Count(u32),
    /// Partitions of about this many logical bytes.
    Size(u64),
}

/// A file as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileWeight {
    pub size: u64,
    /// Under a `--replicate-dir`.
    pub replicated: bool,
}

/// One planned partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPartition {
    pub id: u32,
    pub replicated: bool,
    /// Indices into the planner's input, ascending.
    pub files: Vec<usize>,
    pub logical_bytes: u64,
}

/// Why no plan can be made.
#[derive(Debug, thiserror::Error)]
pub enum AssignError {
    #[error("--partitions must be at least 1")]
    ZeroPartitions,
    #[error("--partition-size must be at least 1 byte")]
    ZeroSize,
    #[error("{0} partitions is more than the supported {MAX_PARTITIONS}")]
    TooMany(u64),
}

fn weight(size: u64) -> u64 {
    size.saturating_add(ENTRY_HEADER_LEN as u64)
}

/// Plans the partitions of `files` (in pack order).
pub fn plan(files: &[FileWeight], count: PartitionCount) -> Result<Vec<PlannedPartition>, AssignError> {
    let regular: Vec<usize> = (0..files.len()).filter(|&i| !files[i].replicated).collect();
    let replicated: Vec<usize> = (0..files.len()).filter(|&i| files[i].replicated).collect();
    let bytes = |idx: &[usize]| idx.iter().map(|&i| files[i].size).fold(0u64, u64::saturating_add);
    let (regular_bytes, replicated_bytes) = (bytes(&regular), bytes(&replicated));
    let by_size = |total: u64, size: u64, n_files: usize| -> u64 { total.div_ceil(size).clamp(1, (n_files as u64).max(1)) };
    let (n_regular, size_for_replicated) = match count {
        PartitionCount::Count(0) => return Err(AssignError::ZeroPartitions),
        PartitionCount::Size(0) => return Err(AssignError::ZeroSize),
        PartitionCount::Count(n) => {
            let implied = if regular_bytes == 0 { DEFAULT_PARTITION_BYTES } else { regular_bytes.div_ceil(n as u64) };
            (n as u64, implied.max(1))
        }
        PartitionCount::Size(s) => (by_size(regular_bytes, s, regular.len()), s),
        PartitionCount::Auto => (by_size(regular_bytes, DEFAULT_PARTITION_BYTES, regular.len()), DEFAULT_PARTITION_BYTES),
    };
    let n_replicated = if replicated.is_empty() { 0 } else { by_size(replicated_bytes, size_for_replicated, replicated.len()) };
    for n in [n_regular, n_replicated] {
        if n > MAX_PARTITIONS {
            return Err(AssignError::TooMany(n));
        }
    }
    let mut out = Vec::new();
    for (group, n, replicated) in [(&regular, n_regular, false), (&replicated, n_replicated, true)] {
        if n == 0 {
            continue;
        }
        let weights: Vec<u64> = group.iter().map(|&i| weight(files[i].size)).collect();
        for run in split_contiguous(&weights, n as usize) {
            let members: Vec<usize> = group[run].to_vec();
            out.push(PlannedPartition {
                id: out.len() as u32,
                replicated,
                logical_bytes: bytes(&members),
                files: members,
            });
        }
    }
    Ok(out)
}

/// Cuts `weights` into `n` contiguous runs of nearly equal total weight.
/// Each cut is placed at the prefix sum nearest to `k * total / n`. When
/// there are at least `n` items no run is empty.
pub fn split_contiguous(weights: &[u64], n: usize) -> Vec<Range<usize>> {
    let n = n.max(1);
    let len = weights.len();
    let mut prefix = Vec::with_capacity(len + 1);
    prefix.push(0u128);
    for &w in weights {
        let last = prefix[prefix.len() - 1];
        prefix.push(last + w as u128);
    }
    let total = prefix[len];
    let mut cuts = Vec::with_capacity(n + 1);
    cuts.push(0usize);
    for k in 1..n {
        let target = total * k as u128 / n as u128;
        // First prefix index at or past the target, then the nearer neighbour.
        let above = prefix.partition_point(|&p| p < target);
        let mut cut = if above > 0 && target - prefix[above - 1] <= prefix.get(above).map_or(u128::MAX, |&p| p - target) {
            above - 1
        } else {
            above
        };
        let prev = cuts[k - 1];
        let (lo, hi) = if len >= n { (prev + 1, len - (n - k)) } else { (prev, len) };
        cut = cut.clamp(lo, hi);
        cuts.push(cut);
    }
    cuts.push(len);
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64]) -> Vec<FileWeight> {
        sizes.iter().map(|&size| FileWeight { size, replicated: false }).collect()
    }

    /// A deterministic pseudo-random size stream (no dependency on a RNG crate).
    fn sizes(n: usize, seed: u64) -> Vec<u64> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                4096 + x % (1 << 20)
            })
            .collect()
    }

    #[test]
    fn runs_are_contiguous_and_cover_everything() {
        for n in [1, 2, 3, 7, 64] {
            let w = sizes(1000, n as u64);
            let runs = split_contiguous(&w, n);
            assert_eq!(runs.len(), n);
            assert_eq!(runs[0].start, 0);
            assert_eq!(runs[n - 1].end, w.len());
            for pair in runs.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
            }
            assert!(runs.iter().all(|r| !r.is_empty()));
        }
    }

    #[test]
    fn partitions_are_balanced_by_bytes_not_count() {
        // Many small files then a few big ones: equal counts would be badly unbalanced.
        let mut s = vec![10_000u64; 900];
        s.extend(vec![10_000_000u64; 100]);
        s.extend(sizes(2000, 9));
        let p = plan(&files(&s), PartitionCount::Count(8)).unwrap();
        let total: u64 = s.iter().sum();
        let ideal = total / 8;
        let biggest = *s.iter().max().unwrap();
        for part in &p {
            let dev = part.logical_bytes.abs_diff(ideal);
            assert!(dev <= biggest, "partition {} has {} bytes, ideal {ideal}", part.id, part.logical_bytes);
        }
        assert_eq!(p.iter().map(|x| x.files.len()).sum::<usize>(), s.len());
    }

    #[test]
    fn plan_is_deterministic() {
        let s = sizes(5000, 42);
        let a = plan(&files(&s), PartitionCount::Size(100 << 20)).unwrap();
        let b = plan(&files(&s), PartitionCount::Size(100 << 20)).unwrap();
        assert_eq!(a, b);
        let total: u64 = s.iter().sum();
        assert_eq!(a.len() as u64, total.div_ceil(100 << 20));
    }

    #[test]
    fn replicated_files_get_their_own_partitions() {
        let mut f = files(&sizes(100, 3));
        for x in f.iter_mut().skip(60).take(20) {
            x.replicated = true;
        }
        let p = plan(&f, PartitionCount::Count(4)).unwrap();
        let regular: Vec<_> = p.iter().filter(|x| !x.replicated).collect();
        let replicated: Vec<_> = p.iter().filter(|x| x.replicated).collect();
        assert_eq!(regular.len(), 4);
        assert!(!replicated.is_empty());
        assert!(p.iter().map(|x| x.id).eq(0..p.len() as u32), "ids are 0..P in order");
        assert!(replicated.iter().all(|x| x.files.iter().all(|&i| f[i].replicated)));
        assert!(regular.iter().all(|x| x.files.iter().all(|&i| !f[i].replicated)));
        assert!(regular.iter().all(|r| replicated.iter().all(|q| r.id < q.id)));
    }

    #[test]
    fn edge_cases() {
        // Empty tree: one empty regular partition.
        let p = plan(&[], PartitionCount::Auto).unwrap();
        assert_eq!(p.len(), 1);
        assert!(p[0].files.is_empty());
        // More partitions than files: exactly N, the extra ones empty.
        let p = plan(&files(&[5, 6]), PartitionCount::Count(4)).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p.iter().map(|x| x.files.len()).sum::<usize>(), 2);
        // All-empty files still spread across partitions.
        let p = plan(&files(&[0; 10]), PartitionCount::Count(5)).unwrap();
        assert!(p.iter().all(|x| x.files.len() == 2));
        // Auto never makes more partitions than files.
        let p = plan(&files(&[1 << 40, 1]), PartitionCount::Auto).unwrap();
        assert_eq!(p.len(), 2);
        assert!(matches!(plan(&[], PartitionCount::Count(0)), Err(AssignError::ZeroPartitions)));
        assert!(matches!(plan(&[], PartitionCount::Size(0)), Err(AssignError::ZeroSize)));
    }
}
