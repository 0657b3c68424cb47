//! Which leases to renew at once when the backend reports a change.
//!
//! The watchdog keeps an index from lease key to its leases only while the
//! backend reports changes; a change names a key (or every lease), and the
//! leases it names are renewed at once instead of at their next renewal,
//! so a holder learns of a deleted or overwritten lease within a round trip
//! of the change. Changes that arrive together are collected into one set,
//! so that a burst of them (a flush, a lost connection) shares batches.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use leasehold_core::{ChangeWatch, LeaseChange, LeaseKey};
use tracing::debug;

/// The backend's change watch and the index it needs.
pub(crate) struct Changes {
    watch: ChangeWatch,
    /// The lease of each key: a key usually has one, kept here without a
    /// vector of its own (24 bytes a key, where a vector would add its 24
    /// and an allocation).
    by_key: HashMap<LeaseKey, u64>,
    /// The key's other leases, when it has several: an ended lease whose
    /// handle still lives may share its key with a newer one.
    more: HashMap<LeaseKey, Vec<u64>>,
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
            more: HashMap::new(),
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
            self.more = HashMap::new();
        }
        change
    }

    /// Starts watching lease `id` of `key`.
    pub(crate) fn insert(&mut self, key: &LeaseKey, id: u64) {
        if self.is_open() {
            match self.by_key.entry(key.clone()) {
                Entry::Vacant(first) => {
                    first.insert(id);
                }
                Entry::Occupied(_) => self.more.entry(key.clone()).or_default().push(id),
            }
        }
    }

    /// Stops watching lease `id` of `key`.
    pub(crate) fn remove(&mut self, key: &LeaseKey, id: u64) {
        let Some(first) = self.by_key.get_mut(key) else {
            return;
        };
        if *first == id {
            // Another lease of the key, if any, takes its place.
            match self.more.get_mut(key).and_then(Vec::pop) {
                Some(next) => *first = next,
                None => {
                    self.by_key.remove(key);
                }
            }
        } else if let Some(ids) = self.more.get_mut(key) {
            ids.retain(|&i| i != id);
        }
        if self.more.get(key).is_some_and(Vec::is_empty) {
            self.more.remove(key);
        }
    }

    /// The leases of `key`.
    fn of(&self, key: &LeaseKey) -> impl Iterator<Item = u64> {
        let more = self.more.get(key).map_or(&[][..], Vec::as_slice);
        self.by_key
            .get(key)
            .copied()
            .into_iter()
            .chain(more.iter().copied())
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
                    let mut ids: Vec<u64> = self
                        .by_key
                        .values()
                        .chain(self.more.values().flatten())
                        .copied()
                        .collect();
                    ids.sort_unstable();
                    return ids;
                }
            }
            change = self.watch.try_next();
        }
        let mut ids: Vec<u64> = keys.iter().flat_map(|key| self.of(key)).collect();
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
        // A key's second lease takes the first one's place, and a key's
        // last lease gone leaves nothing of it.
        changes.insert(&key("a"), 11);
        changes.remove(&key("a"), 7);
        send("a");
        let first = changes.next().await.expect("a change");
        assert_eq!(changes.affected(first), vec![11]);
        changes.remove(&key("a"), 11);
        assert!(!changes.by_key.contains_key(&key("a")));
        assert!(changes.more.is_empty());

        drop(report);
        assert_eq!(changes.next().await, None);
        assert!(!changes.is_open());
        assert!(changes.by_key.is_empty() && changes.more.is_empty());
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
