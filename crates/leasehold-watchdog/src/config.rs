//! Lease settings from a TOML file or environment variables.
//!
//! A name that is no lease setting is refused, from TOML and from the
//! environment alike ([`ConfigError::Unknown`], naming it and the setting
//! it is nearest to), so that a typo does not leave a default in force.
//! The rule for the environment, and the names it passes over, are stated
//! once, on [`LeaseConfig`] ("Unknown names"), where users read it; the
//! `leasehold` command applies it with names of leasehold's own test suite
//! left out (crates/leasehold-cli/src/environment.rs).

use std::ffi::OsString;
use std::time::Duration;

use leasehold_core::{LockDelay, Ttl};
use serde::Deserialize;

use crate::{Backoff, LeaseError, LeaseOptions};

/// Lease settings as an operator writes them: durations as humantime
/// strings (`"30s"`, `"1m 30s"`, `"500ms"`), every field optional, every
/// value checked with an error that names the field and the value.
///
/// Read it with [`from_toml_str`](Self::from_toml_str),
/// [`from_env`](Self::from_env) or [`from_vars`](Self::from_vars), or
/// embed it in your own serde configuration (it deserialises from the same
/// fields, and unknown fields are refused there too, in serde's words).
/// Turn it into
/// [`LeaseOptions`] with [`lease_options`](Self::lease_options).
///
/// | TOML field        | environment (`LEASEHOLD_` prefix) | default          |
/// |-------------------|-----------------------------------|------------------|
/// | `ttl`             | `LEASEHOLD_TTL`                   | `"30s"`          |
/// | `max_renewals`    | `LEASEHOLD_MAX_RENEWALS`          | no limit         |
/// | `safety_margin`   | `LEASEHOLD_SAFETY_MARGIN`         | a tenth of ttl   |
/// | `wait`            | `LEASEHOLD_WAIT`                  | one attempt      |
/// | `backoff_initial` | `LEASEHOLD_BACKOFF_INITIAL`       | `"25ms"`         |
/// | `backoff_max`     | `LEASEHOLD_BACKOFF_MAX`           | `"500ms"`        |
/// | `name`            | `LEASEHOLD_NAME`                  | `"default"`      |
/// | `label`           | `LEASEHOLD_LABEL`                 | none             |
/// | `lock_delay`      | `LEASEHOLD_LOCK_DELAY`            | `"0s"` (none)    |
/// | `renew_interval`  | `LEASEHOLD_RENEW_INTERVAL`        | a third of ttl   |
/// | `hold_at_least`   | `LEASEHOLD_HOLD_AT_LEAST`         | none             |
/// | `hold_at_most`    | `LEASEHOLD_HOLD_AT_MOST`          | none             |
/// | `progress_window` | `LEASEHOLD_PROGRESS_WINDOW`       | none             |
/// | `fair`            | `LEASEHOLD_FAIR`                  | `false`          |
/// | `fair_place_ttl`  | `LEASEHOLD_FAIR_PLACE_TTL`        | `"2s"`           |
/// | `fair_handover`   | `LEASEHOLD_FAIR_HANDOVER`         | `true`           |
/// | `redis_url`       | `LEASEHOLD_REDIS_URL`             | none             |
///
/// # Unknown names
///
/// A name that is no lease setting is refused with
/// [`ConfigError::Unknown`], which names it and, for a typo, the setting
/// meant: a TOML field such as `tll`, and an environment variable under
/// the prefix such as `LEASEHOLD_TTL_` alike.
///
/// In the environment the rule is about the prefix (`LEASEHOLD_` for the
/// `leasehold` command): every variable whose name starts with it must be
/// a setting (the prefix followed by the field in capitals) or one of the
/// [`COMMAND_VARIABLES`](Self::COMMAND_VARIABLES), the names the
/// `leasehold` command reads (`LEASEHOLD_URL`) or sets for the command it
/// runs (`LEASEHOLD_KEY`, `LEASEHOLD_FENCING_TOKEN`, `LEASEHOLD_JOB`,
/// `LEASEHOLD_TICK`), which are passed over so that a program started by
/// `leasehold run` reads its settings as any other. Anything else under
/// the prefix is refused; variables not under it are not looked at. An
/// application with variables of its own gives its lease settings a
/// prefix of their own (`APP_LEASE_`, not `APP_`), or leaves its names out
/// of what it hands to [`from_vars`](Self::from_vars).
///
/// ```
/// use std::time::Duration;
/// use leasehold_watchdog::LeaseConfig;
///
/// let config = LeaseConfig::from_toml_str(r#"
///     ttl = "1m"
///     max_renewals = 120
///     wait = "5m"
///     name = "nightly-report"
///     redis_url = "redis://127.0.0.1:6379"
/// "#)?;
/// let options = config.lease_options()?;
/// assert_eq!(options.renew_interval(), Duration::from_secs(20));
/// assert_eq!(options.name(), "nightly-report");
///
/// let bad = LeaseConfig::from_toml_str(r#"ttl = "30 seconds later""#).unwrap_err();
/// assert!(bad.to_string().contains("ttl"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawConfig")]
#[non_exhaustive]
pub struct LeaseConfig {
    /// How long the server keeps the lease unless renewed.
    pub ttl: Ttl,
    /// The most renewals the watchdog makes; `None` for no limit.
    pub max_renewals: Option<u32>,
    /// How long before the end of certain validity the holder is told to
    /// stop; `None` for a tenth of the ttl.
    pub safety_margin: Option<Duration>,
    /// How long to wait for a lease held by someone else; `None` tries once.
    pub wait: Option<Duration>,
    /// The first retry delay while waiting.
    pub backoff_initial: Duration,
    /// The longest retry delay while waiting.
    pub backoff_max: Duration,
    /// The lease's name in metrics and logs (a bounded set, never a key).
    pub name: String,
    /// A public label stored beside the lease, such as a host name.
    pub label: Option<String>,
    /// How long the key stays taken after the lease ends without a release
    /// (see [`LeaseOptionsBuilder::lock_delay`](crate::LeaseOptionsBuilder::lock_delay)).
    pub lock_delay: LockDelay,
    /// How often the watchdog renews; `None` for a third of the ttl (see
    /// [`LeaseOptionsBuilder::renew_interval`](crate::LeaseOptionsBuilder::renew_interval)).
    pub renew_interval: Option<Duration>,
    /// The minimum hold (see
    /// [`LeaseOptionsBuilder::hold_at_least`](crate::LeaseOptionsBuilder::hold_at_least)).
    pub hold_at_least: Option<Duration>,
    /// The maximum hold (see
    /// [`LeaseOptionsBuilder::hold_at_most`](crate::LeaseOptionsBuilder::hold_at_most)).
    pub hold_at_most: Option<Duration>,
    /// The progress window (see
    /// [`LeaseOptionsBuilder::progress_window`](crate::LeaseOptionsBuilder::progress_window)).
    pub progress_window: Option<Duration>,
    /// Fair mode: `None` off, else its place ttl and handover (see
    /// [`LeaseOptionsBuilder::fair`](crate::LeaseOptionsBuilder::fair)).
    pub fair: Option<crate::Fair>,
    /// Where the Redis server is; read by the application or the
    /// `leasehold` command, not by the watchdog.
    pub redis_url: Option<String>,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        let backoff = Backoff::default();
        Self {
            ttl: Ttl::DEFAULT,
            max_renewals: None,
            safety_margin: None,
            wait: None,
            backoff_initial: backoff.initial(),
            backoff_max: backoff.max(),
            name: "default".to_owned(),
            label: None,
            lock_delay: LockDelay::ZERO,
            renew_interval: None,
            hold_at_least: None,
            hold_at_most: None,
            progress_window: None,
            fair: None,
            redis_url: None,
        }
    }
}

/// Why lease settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// One setting has a value that cannot be used.
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        /// The TOML field or environment variable.
        field: String,
        /// The value given (cut to its first 64 characters).
        value: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// An environment variable was not valid UTF-8.
    #[error("environment variable {field} is not valid UTF-8")]
    NotUnicode {
        /// The variable.
        field: String,
    },
    /// The TOML text could not be read (bad syntax, a wrong type, an
    /// unknown field); the message says where.
    #[error("invalid lease configuration: {message}")]
    Toml {
        /// What the TOML parser said, with the line and column.
        message: String,
    },
    /// The settings are each valid but do not fit together.
    #[error("lease settings do not fit together: {reason}")]
    Mismatch {
        /// Which values conflict, and why.
        reason: String,
    },
    /// A TOML field, or an environment variable under the prefix, that
    /// is no lease setting (see [`LeaseConfig`], "Unknown names", for the
    /// variables passed over).
    #[error("unknown lease setting {name}{}{}", at_line(.at), advice(.closest.as_deref(), .expected))]
    Unknown {
        /// The TOML field or the environment variable, as written.
        name: String,
        /// Where the field is in the TOML text (line, column, from 1);
        /// `None` for a variable.
        at: Option<(usize, usize)>,
        /// The setting whose name is nearest, when it is near enough to be
        /// the one meant (a letter or two apart).
        closest: Option<String>,
        /// Every setting's name (the TOML fields, or the variables under
        /// the prefix).
        expected: Vec<String>,
    },
}

fn at_line(at: &Option<(usize, usize)>) -> String {
    at.map(|(line, column)| format!(" (at line {line}, column {column})"))
        .unwrap_or_default()
}

fn advice(closest: Option<&str>, expected: &[String]) -> String {
    match closest {
        Some(name) => format!("; did you mean {name}?"),
        None => format!("; the settings are {}", expected.join(", ")),
    }
}

/// The fields as written, before checking.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    ttl: Option<String>,
    max_renewals: Option<u32>,
    safety_margin: Option<String>,
    wait: Option<String>,
    backoff_initial: Option<String>,
    backoff_max: Option<String>,
    name: Option<String>,
    label: Option<String>,
    lock_delay: Option<String>,
    renew_interval: Option<String>,
    hold_at_least: Option<String>,
    hold_at_most: Option<String>,
    progress_window: Option<String>,
    fair: Option<bool>,
    fair_place_ttl: Option<String>,
    fair_handover: Option<bool>,
    redis_url: Option<String>,
}

impl TryFrom<RawConfig> for LeaseConfig {
    type Error = ConfigError;

    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut fields = Fields::default();
        fields.set("ttl", raw.ttl);
        fields.set("max_renewals", raw.max_renewals.map(|n| n.to_string()));
        fields.set("safety_margin", raw.safety_margin);
        fields.set("wait", raw.wait);
        fields.set("backoff_initial", raw.backoff_initial);
        fields.set("backoff_max", raw.backoff_max);
        fields.set("name", raw.name);
        fields.set("label", raw.label);
        fields.set("lock_delay", raw.lock_delay);
        fields.set("renew_interval", raw.renew_interval);
        fields.set("hold_at_least", raw.hold_at_least);
        fields.set("hold_at_most", raw.hold_at_most);
        fields.set("progress_window", raw.progress_window);
        fields.set("fair", raw.fair.map(|b| b.to_string()));
        fields.set("fair_place_ttl", raw.fair_place_ttl);
        fields.set("fair_handover", raw.fair_handover.map(|b| b.to_string()));
        fields.set("redis_url", raw.redis_url);
        fields.check()
    }
}

/// Each field's value and the name to report it under (a TOML field or an
/// environment variable).
#[derive(Default)]
struct Fields {
    values: Vec<(&'static str, String, String)>,
}

impl Fields {
    fn set(&mut self, field: &'static str, value: Option<String>) {
        self.set_as(field, field.to_owned(), value);
    }

    fn set_as(&mut self, field: &'static str, shown: String, value: Option<String>) {
        if let Some(value) = value {
            self.values.push((field, shown, value));
        }
    }

    fn check(self) -> Result<LeaseConfig, ConfigError> {
        let mut config = LeaseConfig::default();
        // Fair mode's three settings, put together once all are read.
        let (mut fair, mut place_ttl, mut handover) = (None, None, None);
        for (field, shown, value) in self.values {
            let invalid = |reason: String| ConfigError::Invalid {
                field: shown.clone(),
                value: excerpt(&value),
                reason,
            };
            let duration = || parse_duration(&value).map_err(invalid);
            match field {
                "ttl" => {
                    config.ttl = Ttl::new(duration()?).map_err(|e| invalid(reason_of(e)))?;
                }
                "max_renewals" => {
                    let n: u32 = value.trim().parse().map_err(|_| {
                        invalid(format!("expected a whole number from 1 to {}", u32::MAX))
                    })?;
                    if n == 0 {
                        return Err(invalid(
                            "must be at least 1; leave it out for no limit".to_owned(),
                        ));
                    }
                    config.max_renewals = Some(n);
                }
                "safety_margin" => config.safety_margin = Some(duration()?),
                "wait" => config.wait = Some(duration()?),
                "backoff_initial" => config.backoff_initial = positive(duration()?, invalid)?,
                "backoff_max" => config.backoff_max = positive(duration()?, invalid)?,
                "name" => {
                    if value.is_empty() || value.len() > 64 || value.chars().any(char::is_control) {
                        return Err(invalid(
                            "a lease name is 1 to 64 characters without control characters"
                                .to_owned(),
                        ));
                    }
                    config.name = value;
                }
                "label" => {
                    // The bounds `AcquireRequest::with_label` applies, checked
                    // here so that the error names the field.
                    if value.len() > 256 || value.chars().any(char::is_control) {
                        return Err(invalid(
                            "a label is at most 256 bytes without control characters".to_owned(),
                        ));
                    }
                    config.label = Some(value);
                }
                "lock_delay" => {
                    config.lock_delay =
                        LockDelay::new(duration()?).map_err(|e| invalid(reason_of(e)))?;
                }
                "renew_interval" => {
                    config.renew_interval = Some(positive(duration()?, invalid)?);
                }
                "hold_at_least" => config.hold_at_least = Some(positive(duration()?, invalid)?),
                "hold_at_most" => config.hold_at_most = Some(positive(duration()?, invalid)?),
                "progress_window" => {
                    config.progress_window = Some(positive(duration()?, invalid)?);
                }
                "fair" => fair = Some(boolean(&value).map_err(invalid)?),
                "fair_place_ttl" => place_ttl = Some(positive(duration()?, invalid)?),
                "fair_handover" => handover = Some(boolean(&value).map_err(invalid)?),
                "redis_url" => {
                    if !value.contains("://") {
                        return Err(invalid(
                            "expected a URL such as redis://127.0.0.1:6379".to_owned(),
                        ));
                    }
                    config.redis_url = Some(value);
                }
                _ => {}
            }
        }
        if fair == Some(true) {
            let mut mode = crate::Fair::default();
            if let Some(ttl) = place_ttl {
                mode = mode.with_place_ttl(ttl);
            }
            if let Some(on) = handover {
                mode = mode.with_handover(on);
            }
            config.fair = Some(mode);
        } else if place_ttl.is_some() || handover.is_some() {
            return Err(ConfigError::Mismatch {
                reason: "fair_place_ttl and fair_handover are settings of fair mode: set fair = true, or leave them out".to_owned(),
            });
        }
        if config.backoff_initial > config.backoff_max {
            return Err(ConfigError::Mismatch {
                reason: format!(
                    "backoff_initial ({}) is longer than backoff_max ({})",
                    humantime::format_duration(config.backoff_initial),
                    humantime::format_duration(config.backoff_max),
                ),
            });
        }
        Ok(config)
    }
}

fn positive(
    d: Duration,
    invalid: impl FnOnce(String) -> ConfigError,
) -> Result<Duration, ConfigError> {
    if d.is_zero() {
        Err(invalid("must be greater than zero".to_owned()))
    } else {
        Ok(d)
    }
}

fn boolean(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".to_owned()),
    }
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|e| format!("{e}; write durations like \"30s\", \"1m 30s\" or \"500ms\""))
}

/// The reason alone, since the field and value are reported beside it.
fn reason_of(error: leasehold_core::InputError) -> String {
    match error {
        leasehold_core::InputError::InvalidTtl { reason, .. }
        | leasehold_core::InputError::InvalidLockDelay { reason, .. }
        | leasehold_core::InputError::InvalidDuration { reason, .. } => reason,
        leasehold_core::InputError::InvalidLabel { reason, .. }
        | leasehold_core::InputError::InvalidKey { reason, .. } => reason.to_owned(),
        other => other.to_string(),
    }
}

fn excerpt(value: &str) -> String {
    value.chars().take(64).collect()
}

/// The environment variable suffix of each field.
const ENV_FIELDS: [(&str, &str); 17] = [
    ("ttl", "TTL"),
    ("max_renewals", "MAX_RENEWALS"),
    ("safety_margin", "SAFETY_MARGIN"),
    ("wait", "WAIT"),
    ("backoff_initial", "BACKOFF_INITIAL"),
    ("backoff_max", "BACKOFF_MAX"),
    ("name", "NAME"),
    ("label", "LABEL"),
    ("lock_delay", "LOCK_DELAY"),
    ("renew_interval", "RENEW_INTERVAL"),
    ("hold_at_least", "HOLD_AT_LEAST"),
    ("hold_at_most", "HOLD_AT_MOST"),
    ("progress_window", "PROGRESS_WINDOW"),
    ("fair", "FAIR"),
    ("fair_place_ttl", "FAIR_PLACE_TTL"),
    ("fair_handover", "FAIR_HANDOVER"),
    ("redis_url", "REDIS_URL"),
];

/// The TOML fields, in the table's order.
const FIELDS: &[&str] = &{
    let mut fields = [""; ENV_FIELDS.len()];
    let mut i = 0;
    while i < ENV_FIELDS.len() {
        fields[i] = ENV_FIELDS[i].0;
        i += 1;
    }
    fields
};

/// The name in `names` nearest to `name`, if it is near enough to be a
/// typo of it: at most one edit for a short name, and one in three of
/// its characters for a longer one (case aside: `leasehold_ttl` is
/// nearest `LEASEHOLD_TTL`).
fn closest<'a>(name: &str, names: &[&'a str]) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    names
        .iter()
        .map(|&candidate| (edits(name, candidate), candidate))
        .filter(|&(distance, _)| distance <= limit)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

/// The edits (a letter added, removed, changed, or two neighbours swapped)
/// that turn `a` into `b`, ignoring ASCII case: the optimal string
/// alignment distance.
fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().map(|c| c.to_ascii_uppercase()).collect();
    let b: Vec<char> = b.chars().map(|c| c.to_ascii_uppercase()).collect();
    // rows[i][j]: the edits between a[..i] and b[..j].
    let mut rows = vec![vec![0_usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let change = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + change);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

impl LeaseConfig {
    /// The variables under `LEASEHOLD_` that are no lease settings but are
    /// leasehold's own: `LEASEHOLD_URL`, which the `leasehold` command
    /// reads for its Redis URL, and the four it sets for the command it
    /// runs (`LEASEHOLD_KEY`, `LEASEHOLD_FENCING_TOKEN`, and for a
    /// scheduled run `LEASEHOLD_JOB` and `LEASEHOLD_TICK`).
    /// [`from_env`](Self::from_env) and [`from_vars`](Self::from_vars) pass
    /// over them, so that a program started by `leasehold run` (a nested
    /// `leasehold run` too) is not refused for what it inherited. They are
    /// whole names: under another prefix nothing is passed over.
    pub const COMMAND_VARIABLES: [&'static str; 5] = [
        "LEASEHOLD_URL",
        "LEASEHOLD_KEY",
        "LEASEHOLD_FENCING_TOKEN",
        "LEASEHOLD_JOB",
        "LEASEHOLD_TICK",
    ];

    /// Reads settings from TOML text; fields left out keep their defaults.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Unknown`] for a field that is no lease setting
    /// (naming the nearest one), [`ConfigError::Toml`] for bad syntax or a
    /// value of the wrong type, [`ConfigError::Invalid`] for a value that
    /// cannot be used (naming the field and the value), and
    /// [`ConfigError::Mismatch`] for values that contradict each other.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        // Unknown fields first, and by our own rule, so that they are
        // refused as the environment's are (serde's `deny_unknown_fields`
        // still refuses them where the config is embedded in another).
        // Text that does not parse is left to the parser below to report.
        if let Ok(table) = toml::de::DeTable::parse(text) {
            let unknown = table
                .get_ref()
                .keys()
                .filter(|key| !FIELDS.contains(&key.get_ref().as_ref()))
                .min_by_key(|key| key.span().start);
            if let Some(key) = unknown {
                let name = key.get_ref().as_ref();
                let (line, column) = line_and_column(text, key.span().start);
                return Err(ConfigError::Unknown {
                    name: name.to_owned(),
                    at: Some((line, column)),
                    closest: closest(name, FIELDS).map(str::to_owned),
                    expected: FIELDS.iter().map(|&field| field.to_owned()).collect(),
                });
            }
        }
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Toml {
            message: e.message().to_owned() + &location(text, e.span()),
        })?;
        Self::try_from(raw)
    }

    /// Reads settings from the process's environment variables named
    /// `prefix` + the field in capitals, such as `LEASEHOLD_TTL=30s` for
    /// the prefix `"LEASEHOLD_"` (the table on [`LeaseConfig`]). Unset
    /// variables keep their defaults; set but empty ones are refused.
    ///
    /// Every other variable whose name starts with `prefix` is refused,
    /// unless it is one of the [`COMMAND_VARIABLES`](Self::COMMAND_VARIABLES):
    /// give the lease settings a prefix no other variable of yours starts
    /// with. The prefix is matched as written (case-sensitively).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Unknown`] naming a variable under the prefix that is
    /// no lease setting, and the setting it is nearest to;
    /// [`ConfigError::Invalid`] naming a variable and its value (or an
    /// empty prefix, which would make every variable a lease setting);
    /// [`ConfigError::NotUnicode`] for a setting that is not UTF-8; and
    /// [`ConfigError::Mismatch`] for values that contradict each other.
    pub fn from_env(prefix: &str) -> Result<Self, ConfigError> {
        Self::from_vars(prefix, std::env::vars_os())
    }

    /// Like [`from_env`](Self::from_env), reading the variables from `vars`
    /// (name and value pairs, as [`std::env::vars_os`] yields them) instead
    /// of the process environment: for tests, other sources of key-value
    /// pairs, or an environment with names of your own left out.
    ///
    /// ```
    /// use leasehold_watchdog::{ConfigError, LeaseConfig};
    ///
    /// let vars = [("APP_LEASE_TTL", "45s"), ("APP_LEASE_WAIT", "5m"), ("PATH", "/usr/bin")];
    /// let config = LeaseConfig::from_vars("APP_LEASE_", vars)?;
    /// assert_eq!(config.ttl.to_string(), "45s");
    ///
    /// let typo = LeaseConfig::from_vars("APP_LEASE_", [("APP_LEASE_TTL_", "45s")]);
    /// let Err(ConfigError::Unknown { name, closest, .. }) = typo else { panic!("{typo:?}") };
    /// assert_eq!((name.as_str(), closest.as_deref()), ("APP_LEASE_TTL_", Some("APP_LEASE_TTL")));
    /// # Ok::<(), ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`from_env`](Self::from_env).
    pub fn from_vars<K, V>(
        prefix: &str,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, ConfigError>
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        if prefix.is_empty() {
            return Err(ConfigError::Invalid {
                field: "prefix".to_owned(),
                value: String::new(),
                reason: "an empty prefix would make every environment variable a lease setting; \
                         give one such as \"LEASEHOLD_\" or \"APP_LEASE_\""
                    .to_owned(),
            });
        }
        let settings: Vec<(&'static str, String)> = ENV_FIELDS
            .iter()
            .map(|&(field, suffix)| (field, format!("{prefix}{suffix}")))
            .collect();
        let mut given: Vec<(&'static str, String, OsString)> = Vec::new();
        let mut unknown: Vec<String> = Vec::new();
        for (name, value) in vars {
            let (name, value): (OsString, OsString) = (name.into(), value.into());
            if !name.as_encoded_bytes().starts_with(prefix.as_bytes()) {
                continue;
            }
            let shown = name.to_string_lossy();
            if let Some((field, var)) = settings.iter().find(|(_, var)| *var == shown) {
                given.push((field, var.clone(), value));
            } else if !Self::COMMAND_VARIABLES.contains(&shown.as_ref()) {
                unknown.push(shown.into_owned());
            }
        }
        // The same variable reported whatever order the environment
        // lists them in.
        unknown.sort();
        if let Some(name) = unknown.into_iter().next() {
            // Nearness is judged on what follows the prefix, among the
            // settings and the command's names under it.
            let suffixes: Vec<&str> = ENV_FIELDS
                .iter()
                .map(|&(_, suffix)| suffix)
                .chain(
                    Self::COMMAND_VARIABLES
                        .iter()
                        .filter_map(|var| var.strip_prefix(prefix)),
                )
                .collect();
            let typed = name.get(prefix.len()..).unwrap_or_default();
            return Err(ConfigError::Unknown {
                closest: closest(typed, &suffixes).map(|suffix| format!("{prefix}{suffix}")),
                name,
                at: None,
                expected: settings.into_iter().map(|(_, var)| var).collect(),
            });
        }
        // In the table's order, so that of two bad values the first
        // setting is the one reported, as from TOML.
        given.sort_by_key(|(field, _, _)| FIELDS.iter().position(|f| f == field));
        let mut fields = Fields::default();
        for (field, var, value) in given {
            let value = value
                .into_string()
                .map_err(|_| ConfigError::NotUnicode { field: var.clone() })?;
            fields.set_as(field, var, Some(value));
        }
        fields.check()
    }

    /// The [`LeaseOptions`] these settings describe.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Mismatch`] when the ttl, safety margin and renew
    /// interval do not fit together (see [`LeaseOptions`]).
    pub fn lease_options(&self) -> Result<LeaseOptions, ConfigError> {
        let mut builder = LeaseOptions::builder()
            .ttl(self.ttl)
            .backoff(Backoff::new(self.backoff_initial, self.backoff_max))
            .name(self.name.clone())
            .lock_delay(self.lock_delay.get());
        if let Some(max) = self.max_renewals {
            builder = builder.max_renewals(max);
        }
        if let Some(margin) = self.safety_margin {
            builder = builder.safety_margin(margin);
        }
        if let Some(wait) = self.wait {
            builder = builder.wait(wait);
        }
        if let Some(label) = &self.label {
            builder = builder.label(label.clone());
        }
        if let Some(interval) = self.renew_interval {
            builder = builder.renew_interval(interval);
        }
        if let Some(minimum) = self.hold_at_least {
            builder = builder.hold_at_least(minimum);
        }
        if let Some(max) = self.hold_at_most {
            builder = builder.hold_at_most(max);
        }
        if let Some(window) = self.progress_window {
            builder = builder.progress_window(window);
        }
        builder = builder.fair(self.fair);
        builder.build().map_err(|e| match e {
            LeaseError::InvalidOptions { reason } => ConfigError::Mismatch { reason },
            other => ConfigError::Mismatch {
                reason: other.to_string(),
            },
        })
    }
}

/// " at line L, column C" for a byte span of `text`.
fn location(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    span.map(|span| at_line(&Some(line_and_column(text, span.start))))
        .unwrap_or_default()
}

/// The line and column (from 1) of a byte offset in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_fields_become_lease_options() -> Result<(), Box<dyn std::error::Error>> {
        let config = LeaseConfig::from_toml_str(
            r#"
            ttl = "10s"
            max_renewals = 6
            safety_margin = "2s"
            wait = "1m 30s"
            backoff_initial = "10ms"
            backoff_max = "1s"
            name = "nightly"
            label = "worker-3"
            lock_delay = "15s"
            redis_url = "redis://10.0.0.1:6380/2"
            "#,
        )?;
        assert_eq!(config.redis_url.as_deref(), Some("redis://10.0.0.1:6380/2"));
        let options = config.lease_options()?;
        assert_eq!(options.ttl(), Ttl::parse("10s")?);
        assert_eq!(options.max_renewals(), Some(6));
        assert_eq!(options.safety_margin(), Duration::from_secs(2));
        assert_eq!(options.wait(), Some(Duration::from_secs(90)));
        assert_eq!(
            options.backoff(),
            Backoff::new(Duration::from_millis(10), Duration::from_secs(1))
        );
        assert_eq!(options.name(), "nightly");
        assert_eq!(options.label(), Some("worker-3"));
        assert_eq!(options.lock_delay(), LockDelay::parse("15s")?);
        assert_eq!(
            LeaseConfig::from_toml_str("")?.lease_options()?,
            LeaseOptions::default()
        );
        Ok(())
    }

    /// Every lease option has a field: the holds, the progress window, the
    /// renew interval and fair mode as well, from TOML and from the
    /// environment alike.
    #[test]
    fn every_lease_option_has_a_field() -> Result<(), Box<dyn std::error::Error>> {
        let text = r#"
            ttl = "30s"
            renew_interval = "5s"
            hold_at_least = "1m"
            hold_at_most = "2h"
            progress_window = "10m"
            fair = true
            fair_place_ttl = "4s"
            fair_handover = false
        "#;
        let vars = [
            ("L_TTL", "30s"),
            ("L_RENEW_INTERVAL", "5s"),
            ("L_HOLD_AT_LEAST", "1m"),
            ("L_HOLD_AT_MOST", "2h"),
            ("L_PROGRESS_WINDOW", "10m"),
            ("L_FAIR", "true"),
            ("L_FAIR_PLACE_TTL", "4s"),
            ("L_FAIR_HANDOVER", "false"),
        ];
        let from_env = LeaseConfig::from_vars("L_", vars)?;
        let from_toml = LeaseConfig::from_toml_str(text)?;
        assert_eq!(from_env, from_toml);
        // Fair mode and a minimum hold do not go together: the options
        // say so, naming both.
        let both = from_toml.lease_options().map_err(|e| e.to_string());
        assert!(matches!(&both, Err(m) if m.contains("fair")), "{both:?}");
        let config = LeaseConfig::from_toml_str(
            r#"
            ttl = "30s"
            renew_interval = "5s"
            hold_at_least = "1m"
            hold_at_most = "2h"
            progress_window = "10m"
            "#,
        )?;
        let options = config.lease_options()?;
        assert_eq!(options.renew_interval(), Duration::from_secs(5));
        assert_eq!(options.hold_at_least(), Some(Duration::from_secs(60)));
        assert_eq!(options.hold_at_most(), Some(Duration::from_secs(7_200)));
        assert_eq!(options.progress_window(), Some(Duration::from_secs(600)));
        let fair =
            LeaseConfig::from_toml_str("fair = true\nfair_place_ttl = \"4s\"")?.lease_options()?;
        assert_eq!(
            fair.fair(),
            Some(crate::Fair::default().with_place_ttl(Duration::from_secs(4)))
        );
        let orphan = LeaseConfig::from_toml_str("fair_handover = false");
        assert!(
            matches!(orphan, Err(ConfigError::Mismatch { .. })),
            "{orphan:?}"
        );
        let bad =
            LeaseConfig::from_toml_str(r#"progress_window = "0s""#).map_err(|e| e.to_string());
        assert!(
            matches!(&bad, Err(m) if m.contains("progress_window")),
            "{bad:?}"
        );
        Ok(())
    }

    #[test]
    fn every_bad_value_names_its_field_and_value() {
        for (text, field, value) in [
            (r#"ttl = "3 fortnights""#, "ttl", "3 fortnights"),
            (r#"ttl = "1ms""#, "ttl", "1ms"),
            (r#"ttl = "1.5ms""#, "ttl", "1.5ms"),
            ("max_renewals = 0", "max_renewals", "0"),
            (r#"safety_margin = "soon""#, "safety_margin", "soon"),
            (r#"wait = "-1s""#, "wait", "-1s"),
            (r#"backoff_initial = "0s""#, "backoff_initial", "0s"),
            (r#"backoff_max = "x""#, "backoff_max", "x"),
            (r#"name = """#, "name", ""),
            ("label = \"a\\nb\"", "label", "a\nb"),
            (r#"lock_delay = "2h""#, "lock_delay", "2h"),
            (r#"lock_delay = "1.5ms""#, "lock_delay", "1.5ms"),
            (r#"redis_url = "localhost""#, "redis_url", "localhost"),
        ] {
            match LeaseConfig::from_toml_str(text) {
                Err(e @ ConfigError::Invalid { .. }) => {
                    let message = e.to_string();
                    assert!(message.contains(field), "{text}: {message}");
                    assert!(message.contains(&format!("{value:?}")), "{text}: {message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn syntax_types_unknown_fields_and_mismatches_are_refused() {
        for text in ["ttl = ", "ttl = 30", "max_renewals = -1"] {
            let error = LeaseConfig::from_toml_str(text);
            assert!(
                matches!(&error, Err(ConfigError::Toml { message }) if message.contains("line 1")),
                "{text}: {error:?}"
            );
        }
        let unknown = LeaseConfig::from_toml_str("wait = \"1m\"\ntll = \"30s\"");
        assert!(
            matches!(&unknown, Err(ConfigError::Unknown { name, at: Some((2, 1)), closest: Some(near), .. })
                if name == "tll" && near == "ttl"),
            "{unknown:?}"
        );
        assert_eq!(
            unknown.map_err(|e| e.to_string()),
            Err("unknown lease setting tll (at line 2, column 1); did you mean ttl?".to_owned())
        );
        let backoff = LeaseConfig::from_toml_str("backoff_initial = \"2s\"\nbackoff_max = \"1s\"");
        assert!(matches!(backoff, Err(ConfigError::Mismatch { .. })));
        let late = LeaseConfig::from_toml_str("ttl = \"1s\"\nsafety_margin = \"1s\"")
            .and_then(|c| c.lease_options());
        assert!(
            matches!(&late, Err(ConfigError::Mismatch { reason }) if reason.contains("safety margin")),
            "{late:?}"
        );
    }

    #[test]
    fn environment_variables_with_a_prefix() -> Result<(), Box<dyn std::error::Error>> {
        let vars = [
            ("APP_LEASE_TTL", "45s"),
            ("APP_LEASE_WAIT", "5m"),
            ("APP_LEASE_NAME", "reports"),
            ("APP_LEASE_LOCK_DELAY", "10s"),
            ("APP_LEASE_REDIS_URL", "rediss://cache:6380"),
            ("LEASEHOLD_TTL", "not for us"),
        ];
        let config = LeaseConfig::from_vars("APP_LEASE_", vars)?;
        assert_eq!(config.ttl, Ttl::parse("45s")?);
        assert_eq!(config.wait, Some(Duration::from_secs(300)));
        assert_eq!(config.name, "reports");
        assert_eq!(config.redis_url.as_deref(), Some("rediss://cache:6380"));
        assert_eq!(config.max_renewals, None);
        assert_eq!(config.lock_delay, LockDelay::parse("10s")?);

        let bad = LeaseConfig::from_vars("LEASEHOLD_", vars).map_err(|e| e.to_string());
        assert_eq!(
            bad,
            Err("invalid LEASEHOLD_TTL \"not for us\": expected number at 0; write durations like \"30s\", \"1m 30s\" or \"500ms\"".to_owned())
        );
        // The process environment has no such variables: all defaults.
        assert_eq!(
            LeaseConfig::from_env("LEASEHOLD_TEST_UNSET_")?,
            LeaseConfig::default()
        );
        Ok(())
    }

    /// A variable under the prefix that is no setting is refused as an
    /// unknown TOML field is: the same error, naming it and, for a typo,
    /// the setting meant.
    #[test]
    fn unknown_variables_under_the_prefix_are_refused_as_unknown_fields_are() {
        let unknown = |name: &str| match LeaseConfig::from_vars("LEASEHOLD_", [(name, "30s")]) {
            Err(e @ ConfigError::Unknown { .. }) => e,
            other => panic!("{name}: {other:?}"),
        };
        let typo = unknown("LEASEHOLD_TTL_");
        assert_eq!(
            typo.to_string(),
            "unknown lease setting LEASEHOLD_TTL_; did you mean LEASEHOLD_TTL?"
        );
        // The same mistake in TOML: the same variant, the same advice.
        let in_toml = LeaseConfig::from_toml_str("ttl_ = \"30s\"");
        assert!(
            matches!(&in_toml, Err(ConfigError::Unknown { name, closest: Some(near), .. })
                if name == "ttl_" && near == "ttl"),
            "{in_toml:?}"
        );
        for (name, meant) in [
            ("LEASEHOLD_TLL", "LEASEHOLD_TTL"), // unknown on purpose
            ("LEASEHOLD_ttl", "LEASEHOLD_TTL"), // unknown on purpose
            ("LEASEHOLD_HOLD_AT_LEST", "LEASEHOLD_HOLD_AT_LEAST"), // unknown on purpose
            ("LEASEHOLD_SAFETYMARGIN", "LEASEHOLD_SAFETY_MARGIN"), // unknown on purpose
            ("LEASEHOLD_MAX_RENEWAL", "LEASEHOLD_MAX_RENEWALS"), // unknown on purpose
            ("LEASEHOLD_UR", "LEASEHOLD_URL"),  // unknown on purpose
        ] {
            let error = unknown(name);
            assert!(
                matches!(&error, ConfigError::Unknown { name: n, closest: Some(c), at: None, .. }
                    if n == name && c == meant),
                "{name}: {error:?}"
            );
        }
        // Nothing near: the message names the variable and lists the
        // settings instead.
        let colour = "LEASEHOLD_COLOUR"; // unknown on purpose
        let far = unknown(colour).to_string();
        let listed = "the settings are LEASEHOLD_TTL, LEASEHOLD_MAX_RENEWALS,";
        assert!(
            far.starts_with(&format!("unknown lease setting {colour}; {listed}"))
                && far.ends_with(", LEASEHOLD_REDIS_URL"),
            "{far}"
        );
        // Not UTF-8, and so no setting: unknown too.
        let odd: OsString = std::os::unix::ffi::OsStringExt::from_vec(b"LEASEHOLD_\xff".to_vec());
        let odd = LeaseConfig::from_vars("LEASEHOLD_", [(odd, OsString::from("1"))]);
        assert!(matches!(odd, Err(ConfigError::Unknown { .. })), "{odd:?}");
    }

    /// What `leasehold run` reads or sets besides the settings passes,
    /// under `LEASEHOLD_` only; what is not under the prefix is not looked
    /// at; an empty prefix is refused.
    #[test]
    fn the_commands_variables_pass_and_other_prefixes_are_not_looked_at()
    -> Result<(), Box<dyn std::error::Error>> {
        let inherited = [
            ("LEASEHOLD_KEY", "reports:nightly"),
            ("LEASEHOLD_FENCING_TOKEN", "42"),
            ("LEASEHOLD_JOB", "nightly"),
            ("LEASEHOLD_TICK", "1700000000000"),
            ("LEASEHOLD_URL", "redis://127.0.0.1:6379"),
            ("LEASEHOLD_TTL", "45s"),
            ("HOME", "/root"),
            ("APP_LEASE_COLOUR", "blue"),
        ];
        let config = LeaseConfig::from_vars("LEASEHOLD_", inherited)?;
        assert_eq!(config.ttl, Ttl::parse("45s")?);
        let elsewhere = LeaseConfig::from_vars("APP_LEASE_", [("APP_LEASE_KEY", "k")]);
        assert!(
            matches!(&elsewhere, Err(ConfigError::Unknown { name, .. }) if name == "APP_LEASE_KEY"),
            "{elsewhere:?}"
        );
        // Of two unknown names, the first in order, whatever the order
        // they come in; and an unknown name before a bad value.
        for vars in [
            [("L_ZZZ", "1"), ("L_TTL", "soon"), ("L_AAA", "1")],
            [("L_AAA", "1"), ("L_ZZZ", "1"), ("L_TTL", "soon")],
        ] {
            let first = LeaseConfig::from_vars("L_", vars);
            assert!(
                matches!(&first, Err(ConfigError::Unknown { name, .. }) if name == "L_AAA"),
                "{first:?}"
            );
        }
        let empty = LeaseConfig::from_vars("", [("PATH", "/usr/bin")]);
        assert!(
            matches!(&empty, Err(ConfigError::Invalid { field, .. }) if field == "prefix"),
            "{empty:?}"
        );
        Ok(())
    }

    #[test]
    fn embeds_in_an_application_config() -> Result<(), Box<dyn std::error::Error>> {
        #[derive(Debug, Deserialize)]
        struct App {
            lease: LeaseConfig,
        }
        let app: App = toml::from_str("[lease]\nttl = \"2m\"\n")?;
        assert_eq!(app.lease.ttl, Ttl::parse("2m")?);
        let bad = toml::from_str::<App>("[lease]\nttl = \"2 moons\"\n").map_err(|e| e.to_string());
        assert!(
            matches!(&bad, Err(m) if m.contains("invalid ttl \"2 moons\"")),
            "{bad:?}"
        );
        Ok(())
    }
}
