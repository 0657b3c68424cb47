//! A lease's life, recorded from one real run and drawn as an SVG timeline.
//!
//! Run with `cargo run --example timeline -- docs/lease-life.svg` (it needs
//! `redis-server`; it takes about three seconds).
//!
//! The example starts a throwaway `redis-server` and a TCP proxy in front
//! of it (both from `leasehold-testkit`). The holder talks to Redis through
//! the proxy; a side connection of the example's own talks to the server
//! directly and samples the lease key's PTTL every few milliseconds. That
//! side connection is the witness: what it records is the server's state,
//! which the library neither computes nor shapes.
//!
//! The story: the lease is acquired with a 1 s ttl and renewed by the
//! watchdog every third of it; then the proxy blackholes the holder's
//! connection, so renewals hang. The holder's token fires on its own clock
//! (`Deadline`), and only afterwards does the server let the key expire.
//! The picture shows the PTTL the server reported, each renewal, the fault,
//! the token firing and the key's disappearance, with their times.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::{LeaseManager, LeaseOptions, LossReason, Ttl};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer};
use tokio::sync::watch;
use tokio::time::{Instant, timeout};

const KEY: &str = "reports:nightly";
/// Where the default namespace stores the lease.
const STORED: &str = "leasehold:{reports:nightly}";
/// How long the lease is held, healthy, before the fault.
const HEALTHY: Duration = Duration::from_millis(1200);
/// Bounds every wait, so that a broken mechanism ends the run with an
/// error instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(10);
/// How often the side connection samples PTTL.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// What happened, in milliseconds since the run started.
struct Story {
    ttl: Duration,
    /// (time, PTTL) as the side connection saw them; PTTL -2: no key.
    samples: Vec<(f64, i64)>,
    acquired: f64,
    fencing_token: u64,
    fault: f64,
    fired: f64,
    reason: LossReason,
    gone: f64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or("usage: cargo run --example timeline -- OUTPUT.svg")?;
    let story = record().await?;
    if story.fired >= story.gone {
        return Err(format!(
            "the token fired at {:.0} ms, after the server let the key go at {:.0} ms",
            story.fired, story.gone
        )
        .into());
    }
    std::fs::write(&out, draw(&story))?;
    let renewals = renewals(&story.samples).len();
    println!(
        "acquired at {:.0} ms (fencing token {}), {renewals} renewals seen by the server, \
         holder cut off at {:.0} ms, token fired ({}) at {:.0} ms, key gone on the server \
         at {:.0} ms: {:.0} ms after the token",
        story.acquired,
        story.fencing_token,
        story.fault,
        story.reason,
        story.fired,
        story.gone,
        story.gone - story.fired
    );
    println!("wrote {}", out.display());
    Ok(())
}

/// Runs the story once against a real server and records it.
async fn record() -> Result<Story, Box<dyn std::error::Error>> {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let side = redis::Client::open(server.url())?;
    let mut side = side.get_multiplexed_async_connection().await?;
    let started = Instant::now();
    let since = move |at: Instant| at.duration_since(started).as_secs_f64() * 1000.0;

    // The witness samples from before the acquisition until it is told to
    // stop; a key seen gone after it was seen held ends the story.
    let (stop, stopped) = watch::channel(false);
    let (seen, mut latest) = watch::channel((0.0, -2));
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        while !*stopped.borrow() {
            tick.tick().await;
            let sent = Instant::now();
            let pttl: i64 = redis::cmd("PTTL")
                .arg(STORED)
                .query_async(&mut side)
                .await?;
            samples.push((since(sent), pttl));
            seen.send_replace((since(sent), pttl));
        }
        // The last word is EXISTS, asked after PTTL said the key is gone.
        let exists: i64 = redis::cmd("EXISTS")
            .arg(STORED)
            .query_async(&mut side)
            .await?;
        Ok::<_, redis::RedisError>((samples, exists))
    });

    let ttl = Duration::from_secs(1);
    let backend = RedisBackend::connect(proxy.url()).await?;
    let manager = LeaseManager::new(backend)?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::new(ttl)?)
        .label("timeline")
        .build()?;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let lease = timeout(PATIENCE, manager.acquire(KEY, &options)).await??;
    let acquired = since(Instant::now());
    let fencing_token = lease.fencing_token().get();

    tokio::time::sleep(HEALTHY).await;
    proxy.set_mode(ProxyMode::Blackhole);
    let fault = since(Instant::now());

    let reason = timeout(PATIENCE, lease.lost()).await?;
    let fired = since(Instant::now());

    // Wait until the witness sees the key gone, then watch a little longer.
    timeout(
        PATIENCE,
        latest.wait_for(|&(at, pttl)| at > fault && pttl == -2),
    )
    .await??;
    tokio::time::sleep(Duration::from_millis(250)).await;
    stop.send(true)?;
    let (samples, exists) = timeout(PATIENCE, sampler).await???;
    if exists != 0 {
        return Err(format!("EXISTS {STORED} answered {exists} after PTTL -2").into());
    }
    let gone = samples
        .iter()
        .find(|&&(at, pttl)| at > fault && pttl == -2)
        .map(|&(at, _)| at)
        .ok_or("the side connection never saw the key gone")?;

    proxy.set_mode(ProxyMode::Pass);
    drop(lease);
    manager.shutdown().await;
    Ok(Story {
        ttl,
        samples,
        acquired,
        fencing_token,
        fault,
        fired,
        reason,
        gone,
    })
}

/// The times at which the server's PTTL went up: a renewal landed between
/// two samples.
fn renewals(samples: &[(f64, i64)]) -> Vec<f64> {
    samples
        .windows(2)
        .filter(|w| w[0].1 >= 0 && w[1].1 > w[0].1 + 20)
        .map(|w| w[1].0)
        .collect()
}

// The drawing: plain SVG text, no plotting dependency.

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 920.0;
const TOP: f64 = 115.0;
const BOTTOM: f64 = 335.0;

fn draw(story: &Story) -> String {
    let end = story.gone + 300.0;
    let start = 0.0;
    let x = |ms: f64| LEFT + (ms - start) / (end - start) * (RIGHT - LEFT);
    let ttl_ms = story.ttl.as_secs_f64() * 1000.0;
    let y = |pttl: f64| BOTTOM - pttl / ttl_ms * (BOTTOM - TOP);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="30" font-size="17" font-weight="bold">A lease's life: acquired, renewed, cut off, given up before the server lets it go</text>
<text x="{LEFT}" y="52" fill="#555">One recorded run: ttl 1 s, renewed every third; the holder reaches Redis through a proxy that then blackholes it.</text>
<text x="{LEFT}" y="70" fill="#555">The curve is the key's PTTL sampled every 5 ms on a separate connection to the server.</text>
"##
    );
    // The fault, shaded from its start to the end of the picture.
    let _ = write!(
        svg,
        r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#fde8e8"/>
<text x="{:.1}" y="{:.1}" fill="#b42318">proxy blackholes the holder</text>
"##,
        x(story.fault),
        RIGHT - x(story.fault),
        BOTTOM - TOP,
        x(story.fault) + 6.0,
        BOTTOM - 10.0,
    );
    // Axes and grid.
    for pttl in [0.0, 250.0, 500.0, 750.0, 1000.0] {
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{RIGHT}" y2="{0:.1}" stroke="#e5e5e5"/>
<text x="{1:.1}" y="{2:.1}" text-anchor="end" fill="#555">{pttl} ms</text>
"##,
            y(pttl),
            LEFT - 8.0,
            y(pttl) + 4.0,
        );
    }
    let mut tick = 0.0;
    while tick <= end {
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{BOTTOM}" x2="{0:.1}" y2="{1:.1}" stroke="#333"/>
<text x="{0:.1}" y="{2:.1}" text-anchor="middle" fill="#555">{3:.1} s</text>
"##,
            x(tick),
            BOTTOM + 5.0,
            BOTTOM + 19.0,
            tick / 1000.0,
        );
        tick += 500.0;
    }
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}" stroke="#333"/>
<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}" stroke="#333"/>
<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle" fill="#333">PTTL on the server</text>
"##,
        (TOP + BOTTOM) / 2.0,
    );
    // The PTTL curve, broken where the key did not exist.
    let mut runs: Vec<Vec<(f64, i64)>> = vec![Vec::new()];
    for &(at, pttl) in &story.samples {
        if pttl >= 0 {
            if let Some(run) = runs.last_mut() {
                run.push((at, pttl));
            }
        } else if runs.last().is_some_and(|r| !r.is_empty()) {
            runs.push(Vec::new());
        }
    }
    for run in runs.iter().filter(|r| r.len() > 1) {
        let points: Vec<String> = run
            .iter()
            .map(|&(at, pttl)| format!("{:.1},{:.1}", x(at), y(pttl as f64)))
            .collect();
        let _ = writeln!(
            svg,
            r##"<polyline points="{}" fill="none" stroke="#1f6feb" stroke-width="2"/>"##,
            points.join(" ")
        );
    }
    // Renewals, as the server saw them: a mark on top of each jump.
    for at in renewals(&story.samples) {
        let _ = writeln!(
            svg,
            r##"<path d="M{0:.1},{1:.1} l-5,-9 h10 z" fill="#1f6feb"/>"##,
            x(at),
            TOP - 2.0,
        );
    }
    if let Some(&first) = renewals(&story.samples).first() {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" fill="#1f6feb">renewed: the server's PTTL is back to 1000 ms</text>"##,
            x(first) - 6.0,
            TOP - 20.0,
        );
    }
    // The events, each a vertical line with its time below the axis.
    let events = [
        (
            story.acquired,
            "#1a7f37",
            format!("acquired, fencing token {}", story.fencing_token),
            0,
        ),
        (
            story.fault,
            "#b42318",
            "holder cut off: renewals hang".to_owned(),
            1,
        ),
        (
            story.fired,
            "#bc4c00",
            format!("holder's token fires: {}", story.reason.as_str()),
            2,
        ),
        (
            story.gone,
            "#6e40c9",
            "key gone on the server (PTTL -2, EXISTS 0)".to_owned(),
            3,
        ),
    ];
    for (at, colour, text, row) in &events {
        let text_y = BOTTOM + 48.0 + 38.0 * f64::from(*row);
        let anchor = if x(*at) > (LEFT + RIGHT) / 2.0 {
            "end"
        } else {
            "start"
        };
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{1:.1}" stroke="{colour}" stroke-width="1.5" stroke-dasharray="4 3"/>
<text x="{0:.1}" y="{2:.1}" text-anchor="{anchor}" fill="{colour}" font-weight="bold">{text}</text>
<text x="{0:.1}" y="{3:.1}" text-anchor="{anchor}" fill="{colour}">at {4:.0} ms</text>
"##,
            x(*at),
            text_y - 14.0,
            text_y,
            text_y + 15.0,
            at,
        );
    }
    // What the safety margin bought: the holder stopped this long before
    // anyone else could have the lease.
    let bracket_y = y(900.0);
    let _ = write!(
        svg,
        r##"<line x1="{0:.1}" y1="{2:.1}" x2="{1:.1}" y2="{2:.1}" stroke="#333" stroke-width="1.5"/>
<line x1="{0:.1}" y1="{3:.1}" x2="{0:.1}" y2="{4:.1}" stroke="#333"/>
<line x1="{1:.1}" y1="{3:.1}" x2="{1:.1}" y2="{4:.1}" stroke="#333"/>
<text x="{8:.1}" y="{5:.1}" text-anchor="end" fill="#333">stopped {6:.0} ms before</text>
<text x="{8:.1}" y="{7:.1}" text-anchor="end" fill="#333">the server let it go</text>
"##,
        x(story.fired),
        x(story.gone),
        bracket_y,
        bracket_y - 5.0,
        bracket_y + 5.0,
        bracket_y + 22.0,
        story.gone - story.fired,
        bracket_y + 38.0,
        x(story.fired) - 6.0,
    );
    svg.push_str("</svg>\n");
    svg
}

/// Run by `cargo test --all-targets`: the recorded run keeps the promise the
/// picture illustrates, judged by the side connection's samples.
#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_token_fires_before_the_server_lets_the_key_go()
    -> Result<(), Box<dyn std::error::Error>> {
        let story = timeout(2 * PATIENCE, record()).await??;
        assert_eq!(story.reason, LossReason::Deadline);
        assert!(
            renewals(&story.samples).len() >= 2,
            "renewals seen: {:?}",
            renewals(&story.samples)
        );
        // The last sample that still saw the key came after the token fired.
        let last_held = story
            .samples
            .iter()
            .rev()
            .find(|&&(_, pttl)| pttl >= 0)
            .map(|&(at, _)| at)
            .ok_or("the key was never seen")?;
        assert!(
            story.fired < last_held && last_held < story.gone,
            "token fired at {:.1} ms, key last seen at {last_held:.1} ms, gone at {:.1} ms",
            story.fired,
            story.gone
        );
        let svg = draw(&story);
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("token fires: deadline"), "{svg}");
        Ok(())
    }
}
