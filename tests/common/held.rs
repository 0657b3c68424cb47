//! Leases as the data nodes hold them, read on the test's own connections:
//! the witness of the failover tests (Cluster and Sentinel), which the
//! library under test does not shape.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::Lease;
use leasehold::redis::redis::aio::MultiplexedConnection;

type Error = Box<dyn std::error::Error>;

/// A lease as a data node holds it: the stored value (holder id, fencing
/// token, label) and its PTTL in milliseconds (-2 when the key is gone).
pub(crate) async fn held_on(
    conn: &mut MultiplexedConnection,
    stored: &str,
) -> Result<(Option<String>, i64), Error> {
    let (value, pttl): (Option<String>, i64) = leasehold::redis::redis::pipe()
        .cmd("GET")
        .arg(stored)
        .cmd("PTTL")
        .arg(stored)
        .query_async(conn)
        .await?;
    Ok((value, pttl))
}

/// The fencing token in a stored lease value `<holder>:<token>:<label>`.
pub(crate) fn stored_token(value: &str) -> Option<u64> {
    value.split(':').nth(1)?.parse().ok()
}

/// After a failover, judged by the nodes serving the leases now: each
/// lease `i` (named `{name}-{i}`, stored at `stored[i]` on the node
/// `conns[serving[i]]`) is there with the value its holder wrote,
/// `written[i]`, and its fencing token, and its PTTL rises within `limit`
/// (only a renewal reaching that node can raise it); and no holder was
/// told of a loss.
pub(crate) async fn held_and_renewed(
    conns: &mut BTreeMap<usize, MultiplexedConnection>,
    serving: &[usize],
    stored: &[String],
    written: &[String],
    leases: &[Lease],
    name: &str,
    limit: Duration,
) -> Result<(), Error> {
    let mut last: Vec<Option<i64>> = vec![None; leases.len()];
    let mut renewed = vec![false; leases.len()];
    let until = tokio::time::Instant::now() + limit;
    loop {
        for (i, (key, node)) in stored.iter().zip(serving).enumerate() {
            let conn = conns.get_mut(node).ok_or("no connection to the node")?;
            let (value, pttl) = held_on(conn, key).await?;
            assert_eq!(
                value.as_deref(),
                Some(written[i].as_str()),
                "{name}-{i}: the master serving it now does not hold the holder's lease"
            );
            assert_eq!(
                value.as_deref().and_then(stored_token),
                Some(leases[i].fencing_token().get()),
                "{name}-{i}"
            );
            renewed[i] |= last[i].is_some_and(|before| pttl > before);
            last[i] = Some(pttl);
        }
        if !renewed.contains(&false) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "not renewed on the master serving it now within {limit:?}: {:?}",
            renewed
                .iter()
                .enumerate()
                .filter(|(_, r)| !**r)
                .map(|(i, _)| format!("{name}-{i}"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, lease) in leases.iter().enumerate() {
        assert_eq!(
            lease.loss_reason(),
            None,
            "{name}-{i}: a loss was reported after the failover"
        );
        assert!(!lease.token().is_cancelled(), "{name}-{i}: its token fired");
    }
    Ok(())
}
