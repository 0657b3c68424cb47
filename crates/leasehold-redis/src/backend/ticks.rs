//! Scheduled jobs' records: `tick.lua`, `tick_complete.lua`,
//! `tick_rerun.lua` and `tick_record.lua`.
//!
//! Each job keeps its record (a hash) and its run lease under the hash tag
//! `{<job>}` (see [`KeyLayout::job_record`](crate::KeyLayout::job_record)),
//! so one script reaches both on every topology. Every decision reads the
//! server's clock (`TIME`) in the script that makes it.

use std::collections::BTreeSet;

use futures_util::future::join_all;
use leasehold_core::{
    BackendError, Completion, FencingToken, HolderId, JobName, JobRecord, LeaseBackend, RerunReply,
    RerunRequest, TickAnswer, TickBackend, TickReply, TickRequest,
};
use redis::Value;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use tokio::time::Instant;

use super::{RedisBackend, WriteRoute};
use crate::connection::Conn;
use crate::notices::Notices;
use crate::reply::{self, Failure};
use crate::scripts;

/// How many keys each `SCAN` step of [`TickBackend::job_records`] asks a
/// server to look at.
const SCAN_COUNT: usize = 500;

/// How many records [`TickBackend::job_records`] reads at once.
const READS_AT_ONCE: usize = 32;

impl TickBackend for RedisBackend {
    /// One `tick.lua` call, over the connection and with the replica
    /// acknowledgement of [`try_acquire`](Self::try_acquire): a run whose
    /// grant too few replicas acknowledged is given back (its run is then
    /// seen abandoned) and the call fails.
    async fn decide_tick(&self, request: &TickRequest) -> Result<TickAnswer, BackendError> {
        const OP: &str = "decide_tick";
        request.check(OP)?;
        let run_key = request.job.run_key();
        if let Some(notices) = &self.shared.notices
            && notices.needs_restore()
        {
            // As in try_acquire.
            Box::pin(notices.restore()).await;
        }
        let layout = &self.shared.layout;
        let route = self
            .lease_writes(true, || layout.lease(&run_key))
            .await
            .map_err(|f| f.for_key(OP, &run_key))?;
        let call = scripts::tick(layout, request, matches!(route, WriteRoute::Tracked { .. }));
        let sent_at = Instant::now();
        let reply = self
            .eval_write(&call, route, self.shared.wait)
            .await
            .map_err(|f| f.for_key(OP, &run_key))?;
        let answer =
            reply::ticked(request, sent_at, &reply.value).map_err(|f| f.for_key(OP, &run_key))?;
        if let TickReply::Granted { grant, .. } = &answer.reply
            && let Some(failure) = self.missing_ack(&reply, "; the run's lease was given back")
        {
            // As in try_acquire: give back a grant a failover could lose.
            let _ = self.release(&grant.key, &request.run.holder).await;
            return Err(failure.for_key(OP, &run_key));
        }
        Ok(answer)
    }

    /// One `tick_complete.lua` call, over the connection of a release; the
    /// release is announced on the run lease's channel as a release is.
    async fn complete_tick(
        &self,
        job: &JobName,
        holder: &HolderId,
        fencing_token: FencingToken,
    ) -> Result<Completion, BackendError> {
        const OP: &str = "complete_tick";
        let run_key = job.run_key();
        let layout = &self.shared.layout;
        let route = self
            .lease_writes(false, || layout.lease(&run_key))
            .await
            .map_err(|f| f.for_key(OP, &run_key))?;
        let notices = self.shared.notices.as_ref();
        let call = scripts::tick_complete(
            layout,
            job,
            holder,
            fencing_token,
            notices.is_some(),
            notices.is_some_and(Notices::sharded),
        );
        let reply = self
            .eval_write(&call, route, None)
            .await
            .map_err(|f| f.for_key(OP, &run_key))?;
        reply::completion(&reply.value).map_err(|f| f.for_key(OP, &run_key))
    }

    /// One `tick_rerun.lua` call, over the connection and with the replica
    /// acknowledgement of [`decide_tick`](Self::decide_tick).
    async fn claim_rerun(&self, request: &RerunRequest) -> Result<RerunReply, BackendError> {
        const OP: &str = "claim_rerun";
        request.check(OP)?;
        let run_key = request.job.run_key();
        let layout = &self.shared.layout;
        let route = self
            .lease_writes(true, || layout.lease(&run_key))
            .await
            .map_err(|f| f.for_key(OP, &run_key))?;
        let call =
            scripts::tick_rerun(layout, request, matches!(route, WriteRoute::Tracked { .. }));
        let sent_at = Instant::now();
        let reply = self
            .eval_write(&call, route, self.shared.wait)
            .await
            .map_err(|f| f.for_key(OP, &run_key))?;
        let outcome =
            reply::rerun(request, sent_at, &reply.value).map_err(|f| f.for_key(OP, &run_key))?;
        if let RerunReply::Granted { grant, .. } = &outcome
            && let Some(failure) = self.missing_ack(&reply, "; the run's lease was given back")
        {
            let _ = self.release(&grant.key, &request.run.holder).await;
            return Err(failure.for_key(OP, &run_key));
        }
        Ok(outcome)
    }

    /// One `tick_record.lua` call: the record and the run lease read at
    /// one instant.
    async fn job_record(&self, job: &JobName) -> Result<Option<JobRecord>, BackendError> {
        const OP: &str = "job_record";
        let run_key = job.run_key();
        let call = scripts::tick_record(&self.shared.layout, job);
        let reply = self
            .eval(&call)
            .await
            .map_err(|f| f.for_key(OP, &run_key))?;
        reply::job_record(job, &reply).map_err(|f| f.for_key(OP, &run_key))
    }

    /// `SCAN … MATCH <namespace>:job:{*}:record` on the server (on every
    /// master of a cluster), then one `tick_record.lua` call per job found,
    /// in order of job name. A record that expires between the scan and
    /// its read is left out.
    async fn job_records(&self) -> Result<Vec<JobRecord>, BackendError> {
        const OP: &str = "job_records";
        let pattern = self.shared.layout.job_records_pattern();
        let keys = self
            .scan_every_master(&pattern)
            .await
            .map_err(|f| f.for_name(OP, &pattern))?;
        let jobs: BTreeSet<JobName> = keys
            .iter()
            .filter_map(|key| self.shared.layout.job_of_record(key))
            .collect();
        let jobs: Vec<JobName> = jobs.into_iter().collect();
        let mut records = Vec::with_capacity(jobs.len());
        for chunk in jobs.chunks(READS_AT_ONCE) {
            for record in join_all(chunk.iter().map(|job| self.job_record(job))).await {
                records.extend(record?);
            }
        }
        Ok(records)
    }
}

impl RedisBackend {
    /// The keys matching `pattern` on the server: `SCAN` to the end on a
    /// standalone server or the master behind Sentinel, and on each master
    /// of a cluster (a first step on every master at once, then each on by
    /// its address). Each step is bounded by the op timeout.
    // Without the cluster feature the cluster branch cannot be reached.
    #[cfg_attr(
        not(feature = "cluster"),
        allow(unused_variables, unused_mut, unused_assignments, unreachable_code)
    )]
    async fn scan_every_master(&self, pattern: &str) -> Result<Vec<String>, Failure> {
        let scan = |cursor: &str| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            cmd
        };
        let mut keys = Vec::new();
        let Conn::Cluster(cluster) = &self.shared.conn else {
            let mut cursor = "0".to_owned();
            loop {
                let reply = self
                    .bounded(self.shared.conn.command(&scan(&cursor), ""))
                    .await?;
                cursor = scanned(&reply, &mut keys)?;
                if cursor == "0" {
                    return Ok(keys);
                }
            }
        };
        let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // Boxed, as the connection boxes the cluster client's futures.
        let mut conn = cluster.clone();
        let first = self
            .bounded(Box::pin(conn.route_command(scan("0"), every)))
            .await?;
        let Value::Map(masters) = first else {
            return Err(Failure::Unexpected(
                "a SCAN sent to every cluster master did not answer per master".to_owned(),
            ));
        };
        for (node, reply) in masters {
            let address = match &node {
                Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => {
                    return Err(Failure::Unexpected(
                        "a cluster master was not named by its address".to_owned(),
                    ));
                }
            };
            let (host, port) = address
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host.to_owned(), port.parse::<u16>().ok()?)))
                .ok_or_else(|| {
                    Failure::Unexpected(format!("a cluster master's address {address:?}"))
                })?;
            let reply = reply
                .extract_error()
                .map_err(|err| Failure::from_redis(err, self.shared.op_timeout))?;
            let mut cursor = scanned(&reply, &mut keys)?;
            while cursor != "0" {
                let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                });
                let reply = self
                    .bounded(Box::pin(async {
                        cluster
                            .clone()
                            .route_command(scan(&cursor), node)
                            .await?
                            .extract_error()
                    }))
                    .await?;
                cursor = scanned(&reply, &mut keys)?;
            }
        }
        Ok(keys)
    }
}

/// One `SCAN` step's reply, `[cursor, [key, ...]]`: its keys are added to
/// `keys`, and the next cursor returned ("0" at the end).
fn scanned(reply: &Value, keys: &mut Vec<String>) -> Result<String, Failure> {
    let shape = || Failure::Unexpected("expected a SCAN reply [cursor, [key, ...]]".to_owned());
    let Value::Array(parts) = reply else {
        return Err(shape());
    };
    let [cursor, Value::Array(found)] = parts.as_slice() else {
        return Err(shape());
    };
    let cursor = match cursor {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        _ => return Err(shape()),
    };
    for key in found {
        if let Value::BulkString(bytes) = key
            && let Ok(key) = std::str::from_utf8(bytes)
        {
            keys.push(key.to_owned());
        }
    }
    Ok(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `SCAN` step gives its cursor, as a bulk or a status string, and
    /// its keys; any other shape is refused.
    #[test]
    fn a_scan_step_gives_its_cursor_and_keys() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let mut keys = Vec::new();
        let step = Value::Array(vec![bulk("17"), Value::Array(vec![bulk("a"), bulk("b")])]);
        assert_eq!(scanned(&step, &mut keys).ok().as_deref(), Some("17"));
        let last = Value::Array(vec![
            Value::SimpleString("0".to_owned()),
            Value::Array(vec![bulk("c")]),
        ]);
        assert_eq!(scanned(&last, &mut keys).ok().as_deref(), Some("0"));
        assert_eq!(keys, ["a", "b", "c"]);
        for bad in [
            Value::Int(0),
            Value::Array(vec![Value::Int(0), Value::Array(Vec::new())]),
            Value::Array(vec![bulk("0")]),
        ] {
            assert!(
                matches!(scanned(&bad, &mut keys), Err(Failure::Unexpected(_))),
                "{bad:?}"
            );
        }
    }
}
