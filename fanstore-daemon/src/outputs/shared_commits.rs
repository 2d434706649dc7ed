//! Outputs committed while another process still wrote them, remembered
//! for that process's late commit (see [`SharedCommits`]).

/// How many outputs committed while still written elsewhere are remembered.
const SHARED_MAX: usize = 1024;

/// Outputs committed here while another process still had the file open
/// for writing (no COMMIT_SOLE): path -> (device, inode of the committed
/// file, output id). A program started by exec with such a file as its
/// stdout commits it again at its last close (COMMIT_LATE), and that commit
/// is stored only if the path's current version is the one noted here from
/// the same file. At most [`SHARED_MAX`], the oldest forgotten first.
#[derive(Default)]
pub struct SharedCommits {
    order: std::collections::VecDeque<Vec<u8>>,
    map: std::collections::HashMap<Vec<u8>, (u64, u64, u64)>,
}

impl SharedCommits {
    pub(crate) fn note(&mut self, path: &[u8], file: (u64, u64), id: u64) {
        if self.map.insert(path.to_vec(), (file.0, file.1, id)).is_none() {
            self.order.push_back(path.to_vec());
        }
        while self.order.len() > SHARED_MAX {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    pub(crate) fn forget(&mut self, path: &[u8]) {
        if self.map.remove(path).is_some() {
            self.order.retain(|p| p != path);
        }
    }

    /// The output id committed from `file` at `path`, if that is noted.
    pub(crate) fn id_from(&self, path: &[u8], file: (u64, u64)) -> Option<u64> {
        self.map.get(path).filter(|e| (e.0, e.1) == file).map(|e| e.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_commit_is_found_only_for_its_own_file_and_the_oldest_are_forgotten() {
        let mut s = SharedCommits::default();
        s.note(b"out/log", (7, 42), 3);
        assert_eq!(s.id_from(b"out/log", (7, 42)), Some(3));
        assert_eq!(s.id_from(b"out/log", (7, 43)), None, "another file at the same path");
        assert_eq!(s.id_from(b"out/other", (7, 42)), None);
        s.note(b"out/log", (7, 42), 9);
        assert_eq!(s.id_from(b"out/log", (7, 42)), Some(9), "the newest version");
        s.forget(b"out/log");
        assert_eq!(s.id_from(b"out/log", (7, 42)), None);
        for i in 0..SHARED_MAX as u64 + 10 {
            s.note(format!("f{i}").as_bytes(), (1, i), i);
        }
        assert_eq!(s.map.len(), SHARED_MAX);
        assert_eq!(s.order.len(), SHARED_MAX);
        assert_eq!(s.id_from(b"f0", (1, 0)), None, "the oldest went first");
        assert_eq!(s.id_from(format!("f{}", SHARED_MAX + 9).as_bytes(), (1, SHARED_MAX as u64 + 9)), Some(SHARED_MAX as u64 + 9));
    }
}
