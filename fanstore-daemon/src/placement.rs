//! Which ranks hold which partitions.
//!
//! With N ranks and replication K (clamped to 1..=N), partition p's primary
//! holder is `p mod N`, and its copies are on the K-1 ranks that follow it:
//! rank r holds p when `(r - p mod N) mod N < K`, i.e. rank r loads its own
//! partitions plus those of ranks r-1 .. r-K+1. A replicated partition
//! (FLAG_REPLICATED, from `--replicate-dir`) is held by every rank.

/// The placement of a dataset's partitions over a job's ranks.
#[derive(Debug, Clone)]
pub struct Placement {
    nranks: u32,
    k: u32,
    replicated: Vec<bool>,
}

impl Placement {
    /// `replicated[p]` tells whether partition p is on every rank.
    pub fn new(nranks: u32, replication: u32, replicated: Vec<bool>) -> Placement {
        let nranks = nranks.max(1);
        Placement { nranks, k: replication.clamp(1, nranks), replicated }
    }

    pub fn replication(&self) -> u32 {
        self.k
    }

    pub fn partition_count(&self) -> u32 {
        self.replicated.len() as u32
    }

    /// Does `rank` hold partition `p`?
    pub fn holds(&self, rank: u32, p: u32) -> bool {
        if self.replicated.get(p as usize).copied().unwrap_or(false) {
            return true;
        }
        let primary = p % self.nranks;
        (rank + self.nranks - primary) % self.nranks < self.k
    }

    /// The partitions `rank` loads, in increasing order.
    pub fn partitions_of(&self, rank: u32) -> Vec<u32> {
        (0..self.partition_count()).filter(|&p| self.holds(rank, p)).collect()
    }

    /// The ranks holding partition `p`, in the order a reader of `node_id`
    /// should try them: reads of different files spread over the holders,
    /// and each later entry is a fail-over choice.
    pub fn holders_for(&self, p: u32, node_id: u32) -> Vec<u32> {
        if self.replicated.get(p as usize).copied().unwrap_or(false) {
            return (0..self.nranks).collect();
        }
        let primary = p % self.nranks;
        let start = spread(node_id) % self.k;
        (0..self.k).map(|i| (primary + (start + i) % self.k) % self.nranks).collect()
    }
}

/// A cheap integer hash so consecutive node ids land on different replicas.
fn spread(node_id: u32) -> u32 {
    (node_id.wrapping_mul(0x9e37_79b1) >> 16) ^ node_id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_copy_is_round_robin() {
        let p = Placement::new(4, 1, vec![false; 10]);
        assert_eq!(p.partitions_of(0), vec![0, 4, 8]);
        assert_eq!(p.partitions_of(3), vec![3, 7]);
        assert_eq!(p.holders_for(6, 123), vec![2]);
    }

    #[test]
    fn replication_adds_the_previous_ranks_partitions() {
        let p = Placement::new(4, 2, vec![false; 8]);
        assert_eq!(p.partitions_of(0), vec![0, 3, 4, 7]);
        assert_eq!(p.partitions_of(1), vec![0, 1, 4, 5]);
        for part in 0..8 {
            let holders: Vec<u32> = (0..4).filter(|&r| p.holds(r, part)).collect();
            assert_eq!(holders.len(), 2);
            let mut h = p.holders_for(part, 5);
            h.sort();
            assert_eq!(h, holders);
        }
        // Reads spread over both holders.
        let firsts: std::collections::HashSet<u32> = (0..64).map(|n| p.holders_for(1, n)[0]).collect();
        assert_eq!(firsts.len(), 2);
    }

    #[test]
    fn replication_is_clamped_and_replicated_partitions_are_everywhere() {
        let p = Placement::new(2, 5, vec![false, false, true]);
        assert_eq!(p.replication(), 2);
        assert_eq!(p.partitions_of(0), vec![0, 1, 2]);
        let q = Placement::new(3, 1, vec![false, false, false, true]);
        assert_eq!(q.partitions_of(1), vec![1, 3]);
        assert_eq!(q.holders_for(3, 9), vec![0, 1, 2]);
        let s = Placement::new(1, 1, vec![false; 3]);
        assert_eq!(s.partitions_of(0), vec![0, 1, 2]);
    }
}
