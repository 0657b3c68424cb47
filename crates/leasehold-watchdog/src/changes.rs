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
