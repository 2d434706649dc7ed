//! The ids every rank agrees on: the MPI tags of the daemon's messages and
//! the bits that say what a node id in a request names. The protocol itself
//! is described in [`crate::comm`].

/// A fetch request (file, output or partition range), holder-bound.
pub const TAG_REQUEST: i32 = 1;
/// Control messages ([`CTRL_STOP`]).
pub const TAG_CTRL: i32 = 2;
/// A metadata request to the owner rank of an output path.
pub const TAG_META_REQ: i32 = 3;
/// The owner's reply to a [`TAG_META_REQ`].
pub const TAG_META_REP: i32 = 4;
/// Node ids with this bit set are output files (the rest is the output id).
pub const OUT_BIT: u32 = 1 << 31;
/// Node ids with this bit set (and [`OUT_BIT`] clear) name a partition range.
pub const PART_BIT: u32 = 1 << 30;
/// The control message that stops every rank.
pub const CTRL_STOP: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_id_bits_do_not_overlap_and_tags_differ() {
        assert_eq!(OUT_BIT & PART_BIT, 0);
        let tags = [TAG_REQUEST, TAG_CTRL, TAG_META_REQ, TAG_META_REP];
        for (i, a) in tags.iter().enumerate() {
            assert!(tags[i + 1..].iter().all(|b| a != b));
        }
    }
}
