//! Switches that turn one of the waiting path's turn-taking mechanisms off,
//! so that a benchmark can measure what each one buys
//! (`docs/performance.md`, "What each turn-taking mechanism buys").
//!
//! Compiled in only with the `ablation` feature, which no user needs:
//! without it [`off`] is `false` for every name and the compiler removes
//! the switches. With it, `LEASEHOLD_ABLATE` names the mechanisms to turn
//! off, comma-separated, read once per process (the benchmarks' child
//! processes inherit it).
//!
//! The names: `baton`, `offer`, `yield`, `defer`, `window`, `linger`,
//! `own-notice`, `afresh`.

/// Whether `mechanism` is switched off in this process.
#[cfg(feature = "ablation")]
pub fn off(mechanism: &str) -> bool {
    static OFF: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    OFF.get_or_init(|| {
        std::env::var("LEASEHOLD_ABLATE")
            .unwrap_or_default()
            .split(',')
            .map(|name| name.trim().to_owned())
            .filter(|name| !name.is_empty())
            .collect()
    })
    .iter()
    .any(|name| name == mechanism)
}

/// Whether `mechanism` is switched off in this process: never, without the
/// `ablation` feature.
#[cfg(not(feature = "ablation"))]
#[inline(always)]
pub fn off(_mechanism: &str) -> bool {
    false
}
