//! `leasehold status`, `release --force` and `watch`.

use std::time::{Duration, SystemTime};

use leasehold_core::{LeaseBackend, LeaseInfo, LeaseKey, RwInfo, WriteIntent};
use leasehold_redis::RedisBackend;
use leasehold_watchdog::LeaseManager;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{self, Failure};

/// How long `watch` waits before trying again when its first read of the
/// lease failed (the server is down or unreachable). Once watching, it is
/// told of changes rather than looking.
const WATCH_RETRY: Duration = Duration::from_secs(1);

pub(crate) async fn status(
    url: &Option<String>,
    namespace: Option<&str>,
    keys: &[LeaseKey],
    permits: Option<u32>,
    rw: bool,
    json: bool,
) -> Result<u8, Failure> {
    let backend = exit::connect(url, namespace).await?;
    if rw {
        return status_rw(&backend, keys, json).await;
    }
    let mut rows = Vec::with_capacity(keys.len());
    let mut all_held = true;
    for key in keys {
        // A semaphore's holders are those of its permit keys.
        let shown = match permits {
            None => vec![key.clone()],
            Some(n) => (0..n)
                .map(|i| key.permit(i))
                .collect::<Result<_, _>>()
                .map_err(|e| Failure::new(exit::USAGE, e.to_string()))?,
        };
        let mut any_held = false;
        for shown in shown {
            let info = backend
                .inspect(&shown)
                .await
                .map_err(|e| exit::backend(&e))?;
            any_held |= info.is_some();
            rows.push((shown, info));
        }
        all_held &= any_held;
    }
    if json {
        for (key, info) in &rows {
            println!("{}", to_json(key, info.as_ref()));
        }
    } else {
        let rows: Vec<_> = rows.iter().map(|(k, i)| (k, i.clone())).collect();
        print!("{}", table(&rows));
    }
    Ok(if all_held { 0 } else { 1 })
}

/// `status --rw`: each key is a read-write lease, read at one instant on
/// the server; it counts as held while a writer or a reader holds it.
async fn status_rw(backend: &RedisBackend, keys: &[LeaseKey], json: bool) -> Result<u8, Failure> {
    let mut leases = Vec::with_capacity(keys.len());
    for key in keys {
        // Refuses a key too long to have readers, as `run --shared` does.
        key.writer_key()
            .map_err(|e| Failure::new(exit::USAGE, e.to_string()))?;
        let info = backend
            .inspect_rw(key)
            .await
            .map_err(|e| exit::backend(&e))?;
        leases.push((key, info));
    }
    if json {
        for (key, info) in &leases {
            println!("{}", rw_json(key, info));
        }
    } else {
        print!("{}", rw_table(&leases));
    }
    Ok(if leases.iter().all(|(_, info)| info.is_held()) {
        0
    } else {
        1
    })
}

/// The `status` table: a header and one row per key, columns padded to
/// their widest cell. A lease that is not held shows `-` for what it lacks.
fn table(rows: &[(&LeaseKey, Option<LeaseInfo>)]) -> String {
    const HEADER: [&str; 5] = ["KEY", "STATE", "HOLDER", "FENCING TOKEN", "TTL LEFT"];
    let mut cells: Vec<[String; 5]> = vec![HEADER.map(str::to_owned)];
    for (key, info) in rows {
        cells.push(match info {
            None => [
                key_text(key),
                "free".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
            ],
            Some(info) => [
                key_text(key),
                "held".to_owned(),
                holder_text(info.label.as_deref()),
                token_text(info),
                ttl_text(info),
            ],
        });
    }
    lined_up(&cells)
}

/// The `status --rw` table: per key, a row for the writer, one per reader
/// (by rising fencing token) and one for a waiting writer's intent (its
/// ttl is the intent's), or a single `free` row.
fn rw_table(leases: &[(&LeaseKey, RwInfo)]) -> String {
    const HEADER: [&str; 5] = ["KEY", "ROLE", "HOLDER", "FENCING TOKEN", "TTL LEFT"];
    let mut cells: Vec<[String; 5]> = vec![HEADER.map(str::to_owned)];
    for (key, info) in leases {
        let held = |role: &str, info: &LeaseInfo| {
            [
                key_text(key),
                role.to_owned(),
                holder_text(info.label.as_deref()),
                token_text(info),
                ttl_text(info),
            ]
        };
        cells.extend(info.writer.iter().map(|w| held("writer", w)));
        cells.extend(info.readers.iter().map(|r| held("reader", r)));
        if let Some(intent) = &info.waiting_writer {
            cells.push([
                key_text(key),
                "waiting-writer".to_owned(),
                holder_text(intent.label.as_deref()),
                "-".to_owned(),
                duration_text(intent.ttl_left),
            ]);
        }
        if !info.is_held() && info.waiting_writer.is_none() {
            cells.push([
                key_text(key),
                "free".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
            ]);
        }
    }
    lined_up(&cells)
}

/// Rows of cells, columns padded to their widest cell and two spaces apart.
pub(crate) fn lined_up<const N: usize>(cells: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in cells {
        let mut line = String::new();
        for (column, (cell, width)) in row.iter().zip(widths).enumerate() {
            if column > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', width - cell.chars().count()));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub(crate) async fn release(
    url: &Option<String>,
    namespace: Option<&str>,
    key: &LeaseKey,
    force: bool,
) -> Result<u8, Failure> {
    if !force {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "refusing to release lease {:?} without --force: its holder is not told and may still be working",
                key.as_str()
            ),
        ));
    }
    let backend = exit::connect(url, namespace).await?;
    let info = backend.inspect(key).await.map_err(|e| exit::backend(&e))?;
    if let Some(info) = &info {
        eprintln!(
            "leasehold: warning: deleting lease {:?} held by {} (fencing token {}, {} left). \
             The holder is not told; it stops at its next renewal, within a third of its ttl, \
             and may write until then (stores that check fencing tokens refuse it after a new holder writes).",
            key.as_str(),
            label_text(info),
            token_text(info),
            ttl_text(info),
        );
    }
    let deleted = backend
        .force_release(key)
        .await
        .map_err(|e| exit::backend(&e))?;
    if deleted {
        println!("lease {:?} released", key.as_str());
        Ok(0)
    } else {
        println!("lease {:?} was not held", key.as_str());
        Ok(1)
    }
}

pub(crate) async fn watch(
    url: &Option<String>,
    namespace: Option<&str>,
    key: &LeaseKey,
) -> Result<u8, Failure> {
    let signal_error =
        |e: std::io::Error| Failure::internal(format!("could not handle signals: {e}"));
    let mut interrupt = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(signal_error)?;
    let backend = exit::connect(url, namespace).await?;
    // A manager only to watch: it holds no lease, so its watchdog idles.
    let manager = LeaseManager::new(backend)
        .map_err(|e| Failure::internal(format!("could not start: {}", exit::chain(&e))))?;
    let mut failing: Option<String> = None;
    let mut leader = loop {
        tokio::select! {
            _ = interrupt.recv() => return Ok(0),
            _ = terminate.recv() => return Ok(0),
            watched = manager.watch_leader(key.as_str()) => match watched {
                Ok(leader) => break leader,
                Err(e) => {
                    // A watcher outlives short outages: say so once per kind
                    // of failure, and try again.
                    let message = exit::chain(&e);
                    if failing.as_ref() != Some(&message) {
                        eprintln!("leasehold: {message}");
                        failing = Some(message);
                    }
                }
            },
        }
        tokio::select! {
            _ = interrupt.recv() => return Ok(0),
            _ = terminate.recv() => return Ok(0),
            () = tokio::time::sleep(WATCH_RETRY) => {}
        }
    };
    loop {
        let now = humantime::format_rfc3339_millis(SystemTime::now());
        match &*leader.borrow_and_update() {
            None => println!("{now} {:?} free", key.as_str()),
            Some(holder) => println!(
                "{now} {:?} held by {} (fencing token {}, {} left)",
                key.as_str(),
                holder
                    .label
                    .as_deref()
                    .map_or_else(|| "(no label)".to_owned(), |l| format!("{l:?}")),
                holder
                    .fencing_token
                    .map_or_else(|| "none".to_owned(), |t| t.to_string()),
                duration_text(holder.ttl_left)
            ),
        }
        tokio::select! {
            _ = interrupt.recv() => return Ok(0),
            _ = terminate.recv() => return Ok(0),
            changed = leader.changed() => {
                if changed.is_err() {
                    return Err(Failure::internal("the watch of the lease stopped"));
                }
            }
        }
    }
}

fn key_text(key: &LeaseKey) -> String {
    key.as_str().escape_debug().to_string()
}

fn holder_text(label: Option<&str>) -> String {
    label.map_or_else(|| "(no label)".to_owned(), |l| l.escape_debug().to_string())
}

fn label_text(info: &LeaseInfo) -> String {
    info.label
        .as_deref()
        .map_or_else(|| "(no label)".to_owned(), |l| format!("{l:?}"))
}

fn token_text(info: &LeaseInfo) -> String {
    info.fencing_token
        .map_or_else(|| "none".to_owned(), |t| t.to_string())
}

fn ttl_text(info: &LeaseInfo) -> String {
    duration_text(info.ttl_left)
}

fn duration_text(ttl_left: Option<Duration>) -> String {
    ttl_left.map_or_else(
        || "no expiry".to_owned(),
        |d| {
            humantime::format_duration(Duration::from_millis(
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            ))
            .to_string()
        },
    )
}

/// A lease as `status --json` prints it: `"key"`, `"held"`, and a held
/// lease's fields.
#[derive(serde::Serialize)]
struct LeaseJson<'a> {
    key: &'a str,
    held: bool,
    #[serde(flatten)]
    holder: Option<HolderJson<'a>>,
}

/// `"label"`, `"fencing_token"` and `"ttl_left_ms"` of a held lease.
#[derive(serde::Serialize)]
struct HolderJson<'a> {
    label: Option<&'a str>,
    fencing_token: Option<u64>,
    ttl_left_ms: Option<u64>,
}

impl<'a> HolderJson<'a> {
    fn of(info: &'a LeaseInfo) -> Self {
        Self {
            label: info.label.as_deref(),
            fencing_token: info.fencing_token.map(|t| t.0),
            ttl_left_ms: ms(info.ttl_left),
        }
    }
}

/// A read-write lease: `"writer"` (a held lease's fields, or null),
/// `"readers"` (a list of them) and `"waiting_writer"` (`"label"` and
/// `"ttl_left_ms"` of the intent, or null).
#[derive(serde::Serialize)]
struct RwJson<'a> {
    key: &'a str,
    held: bool,
    writer: Option<HolderJson<'a>>,
    readers: Vec<HolderJson<'a>>,
    waiting_writer: Option<IntentJson<'a>>,
}

#[derive(serde::Serialize)]
struct IntentJson<'a> {
    label: Option<&'a str>,
    ttl_left_ms: Option<u64>,
}

fn ms(ttl_left: Option<Duration>) -> Option<u64> {
    ttl_left.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One line of JSON. These types always serialize; an error would be shown
/// as its message in place of the line.
fn json_line(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
}

fn to_json(key: &LeaseKey, info: Option<&LeaseInfo>) -> String {
    json_line(&LeaseJson {
        key: key.as_str(),
        held: info.is_some(),
        holder: info.map(HolderJson::of),
    })
}

fn rw_json(key: &LeaseKey, info: &RwInfo) -> String {
    json_line(&RwJson {
        key: key.as_str(),
        held: info.is_held(),
        writer: info.writer.as_ref().map(HolderJson::of),
        readers: info.readers.iter().map(HolderJson::of).collect(),
        waiting_writer: info.waiting_writer.as_ref().map(
            |WriteIntent {
                 label, ttl_left, ..
             }| IntentJson {
                label: label.as_deref(),
                ttl_left_ms: ms(*ttl_left),
            },
        ),
    })
}

#[cfg(test)]
mod tests {
    use leasehold_core::FencingToken;

    use super::*;

    #[test]
    fn the_table_lines_up_its_columns() -> Result<(), leasehold_core::InputError> {
        let held = LeaseKey::new("reports:nightly")?;
        let free = LeaseKey::new("k")?;
        let mut info = LeaseInfo::default();
        info.label = Some("worker-7".to_owned());
        info.fencing_token = Some(FencingToken(42));
        info.ttl_left = Some(Duration::from_millis(29_873));
        assert_eq!(
            table(&[(&held, Some(info)), (&free, None)]),
            "KEY              STATE  HOLDER    FENCING TOKEN  TTL LEFT\n\
             reports:nightly  held   worker-7  42             29s 873ms\n\
             k                free   -         -              -\n"
        );
        Ok(())
    }

    #[test]
    fn a_read_write_lease_has_a_row_per_holder_and_one_for_the_waiting_writer()
    -> Result<(), leasehold_core::InputError> {
        let doc = LeaseKey::new("doc")?;
        let free = LeaseKey::new("k")?;
        let held = |label: &str, token, ms| {
            let mut info = LeaseInfo::default();
            info.label = Some(label.to_owned());
            info.fencing_token = Some(FencingToken(token));
            info.ttl_left = Some(Duration::from_millis(ms));
            info
        };
        let mut info = RwInfo::default();
        info.readers = vec![held("a", 3, 1_500), held("b", 4, 900)];
        let mut intent = WriteIntent::default();
        intent.label = Some("w".to_owned());
        intent.ttl_left = Some(Duration::from_millis(2_000));
        info.waiting_writer = Some(intent);
        assert_eq!(
            rw_table(&[(&doc, info.clone()), (&free, RwInfo::default())]),
            "KEY  ROLE            HOLDER  FENCING TOKEN  TTL LEFT\n\
             doc  reader          a       3              1s 500ms\n\
             doc  reader          b       4              900ms\n\
             doc  waiting-writer  w       -              2s\n\
             k    free            -       -              -\n"
        );
        assert_eq!(
            rw_json(&doc, &info),
            r#"{"key":"doc","held":true,"writer":null,"readers":[{"label":"a","fencing_token":3,"ttl_left_ms":1500},{"label":"b","fencing_token":4,"ttl_left_ms":900}],"waiting_writer":{"label":"w","ttl_left_ms":2000}}"#
        );
        let mut written = RwInfo::default();
        written.writer = Some(held("w", 5, 30_000));
        assert_eq!(
            rw_json(&doc, &written),
            r#"{"key":"doc","held":true,"writer":{"label":"w","fencing_token":5,"ttl_left_ms":30000},"readers":[],"waiting_writer":null}"#
        );
        Ok(())
    }

    #[test]
    fn json_is_escaped() -> Result<(), leasehold_core::InputError> {
        let key = LeaseKey::new("a\"b\\c")?;
        assert_eq!(to_json(&key, None), r#"{"key":"a\"b\\c","held":false}"#);
        let mut info = LeaseInfo::default();
        info.label = Some("host\u{1}".to_owned());
        info.fencing_token = Some(FencingToken(7));
        info.ttl_left = Some(Duration::from_millis(1500));
        assert_eq!(
            to_json(&key, Some(&info)),
            r#"{"key":"a\"b\\c","held":true,"label":"host\u0001","fencing_token":7,"ttl_left_ms":1500}"#
        );
        Ok(())
    }
}
