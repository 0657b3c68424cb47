//! Which leases to renew at once when the backend reports a change.
//!
//! The watchdog keeps an index from lease key to its leases only while the
//! backend reports changes; a change names a key (or every lease), and the
//! leases it names are renewed at once instead of at their next renewal,
//! so a holder learns of a deleted or overwritten lease within a round trip
//! of the change. Changes that arrive together are collected into one set,
//! so that a burst of them (a flush, a lost connection) shares batches.

use std::collections::HashMap;

use leasehold_core::{ChangeWatch, LeaseChange, LeaseKey};
use tracing::debug;

/// The backend's change watch and the index it needs.
pub(crate) struct Changes {
    watch: ChangeWatch,
    /// The leases of each key. A key usually has one; an ended lease whose
    /// handle still lives may share its key with a newer one.
    by_key: HashMap<LeaseKey, Vec<u64>>,
}

impl Changes {
    /// No changes: the index stays empty.
    pub(crate) fn none() -> Self {
        Self::new(ChangeWatch::unsupported())
    }

    pub(crate) fn new(watch: ChangeWatch) -> Self {
        Self {
            watch,
            by_key: HashMap::new(),
        }
    }

    /// Whether changes may still arrive.
    pub(crate) fn is_open(&self) -> bool {
        self.watch.is_supported()
    }

    /// Waits for the next change; `None` once the backend stopped reporting.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`ChangeWatch::next`].
    pub(crate) async fn next(&mut self) -> Option<LeaseChange> {
        let change = self.watch.next().await;
        if change.is_none() {
            // Nothing will use the index again.
            self.by_key = HashMap::new();
        }
        change
    }

    /// Starts watching lease `id` of `key`.
    pub(crate) fn insert(&mut self, key: &LeaseKey, id: u64) {
        if self.is_open() {
            self.by_key.entry(key.clone()).or_default().push(id);
        }
    }

    /// Stops watching lease `id` of `key`.
    pub(crate) fn remove(&mut self, key: &LeaseKey, id: u64) {
        if let Some(ids) = self.by_key.get_mut(key) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// The leases named by `first` and by every change already reported
    /// after it, each once.
    pub(crate) fn affected(&mut self, first: LeaseChange) -> Vec<u64> {
        let mut keys: Vec<LeaseKey> = Vec::new();
        let mut change = Some(first);
        while let Some(next) = change {
            match next {
                LeaseChange::Changed(key) => keys.push(key),
                // Anything else is a kind of change this watchdog does not
                // know; renewing everything is always safe.
                _ => {
                    // Drain what is queued: it is covered too.
                    while self.watch.try_next().is_some() {}
                    debug!(
                        leases = self.by_key.len(),
                        "every lease may have changed; renewing all"
                    );
                    let mut ids: Vec<u64> = self.by_key.values().flatten().copied().collect();
                    ids.sort_unstable();
                    return ids;
                }
            }
            change = self.watch.try_next();
        }
        let mut ids: Vec<u64> = keys
            .iter()
            .filter_map(|key| self.by_key.get(key))
            .flatten()
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;

    fn key(k: &str) -> LeaseKey {
        LeaseKey::new(k).expect("valid key")
    }

    /// A change names the leases still watched under its key, and those of
    /// the changes queued behind it, each once; a change of every lease
    /// names them all. The index forgets a key with its last lease, and
    /// everything once the backend stops reporting.
    #[tokio::test]
    async fn a_change_names_exactly_the_leases_of_its_keys() {
        let (report, receiver) = mpsc::unbounded_channel();
        let mut changes = Changes::new(ChangeWatch::new(receiver));
        assert!(changes.is_open());
        for (k, id) in [("a", 5), ("a", 7), ("b", 9), ("c", 3)] {
            changes.insert(&key(k), id);
        }
        changes.remove(&key("a"), 5);
        let send = |k: &str| {
            report
                .send(LeaseChange::Changed(key(k)))
                .expect("the watch is open");
        };

        send("a");
        let first = changes.next().await.expect("a change");
        assert_eq!(changes.affected(first), vec![7]);

        for k in ["b", "a", "b", "unwatched"] {
            send(k);
        }
        let first = changes.next().await.expect("a change");
        assert_eq!(changes.affected(first), vec![7, 9]);

        report.send(LeaseChange::All).expect("the watch is open");
        send("b");
        let first = changes.next().await.expect("a change");
        assert_eq!(changes.affected(first), vec![3, 7, 9]);
        // The change queued behind was covered, and taken.
        assert_eq!(changes.watch.try_next(), None);

        changes.remove(&key("b"), 9);
        assert!(!changes.by_key.contains_key(&key("b")));
        assert_eq!(changes.by_key.len(), 2);

        drop(report);
        assert_eq!(changes.next().await, None);
        assert!(!changes.is_open());
        assert!(changes.by_key.is_empty());
    }

    /// Without changes, the index stays empty however many leases come.
    #[test]
    fn without_changes_nothing_is_indexed() {
        let mut changes = Changes::none();
        assert!(!changes.is_open());
        changes.insert(&key("a"), 1);
        assert!(changes.by_key.is_empty());
    }
}
