//! Connection strings for every topology, parsed in one place.
//!
//! | form | topology |
//! |------|----------|
//! | `redis://[[user]:password@]host[:port][/db]` | one standalone server |
//! | `rediss://…` | the same over TLS (feature `tls`) |
//! | `redis+unix:///path/to/socket?db=0&user=u&pass=p` | a standalone server on a Unix socket |
//! | `redis+cluster://[[user]:password@]host:port[,host:port…][?protocol=resp3]` | Redis Cluster, through these seed nodes (feature `cluster`) |
//! | `rediss+cluster://…` | the same over TLS |
//! | `redis+sentinel://[[user]:password@]host:port[,host:port…]/master-name[/db]` | the master named `master-name`, found through these sentinels (feature `sentinel`) |
//! | `rediss+sentinel://…` | the same, with TLS to the sentinels and the master |
//!
//! Redlock takes a list of standalone URLs, one per independent master
//! (see [`RedlockBackend::builder`](crate::RedlockBackend::builder)).
//!
//! Credentials in a cluster URL apply to every node; in a sentinel URL they
//! apply to the master (the sentinels are reached without them). A port is
//! required in the list forms, so that a missing one is not silently
//! replaced by a default that points at another service.

use std::fmt;

use redis::io::tcp::TcpSettings;
use redis::{Client, ConnectionInfo, IntoConnectionInfo};

use crate::{ConnectError, redact};

/// Which kind of deployment a connection string names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One server (`redis://`, `rediss://`, `redis+unix://`).
    Standalone,
    /// Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
    Cluster,
    /// A master found through Sentinel (`redis+sentinel://`, `rediss+sentinel://`).
    Sentinel,
}

/// A parsed, checked connection string.
///
/// Its `Display` and `Debug` show the string with the password replaced by
/// `***`.
///
/// ```
/// use leasehold_redis::{Endpoint, Topology};
///
/// let e = Endpoint::parse("redis+cluster://:s3cret@10.0.0.1:7000,10.0.0.2:7000")?;
/// assert_eq!(e.topology(), Topology::Cluster);
/// assert_eq!(e.nodes(), 2);
/// assert!(!e.to_string().contains("s3cret"));
///
/// let e = Endpoint::parse("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster")?;
/// assert_eq!(e.master_name(), Some("mymaster"));
///
/// assert!(Endpoint::parse("redis+sentinel://10.0.0.1:26379").is_err()); // no master name
/// # Ok::<(), leasehold_redis::ConnectError>(())
/// ```
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) kind: Kind,
    shown: String,
}

#[derive(Clone)]
pub(crate) enum Kind {
    /// The original URL, checked.
    Standalone(String),
    Cluster(Vec<ConnectionInfo>),
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        master: String,
        /// The credentials and database of the master, from the URL.
        master_info: redis::RedisConnectionInfo,
        tls: bool,
    },
}

impl Endpoint {
    /// Parses and checks a connection string of any of the forms in the
    /// table of this module's documentation.
    ///
    /// # Errors
    ///
    /// [`ConnectError::InvalidUrl`] naming what is wrong (unknown scheme, no host,
    /// no port in a list form, a bad port, no master name, TLS without the
    /// `tls` feature…), with the password masked;
    /// [`ConnectError::FeatureDisabled`] for a Cluster or Sentinel URL when the
    /// `cluster` or `sentinel` feature is off.
    pub fn parse(url: &str) -> Result<Self, ConnectError> {
        let url = url.trim();
        let shown = redact(url);
        let invalid = |reason: &str| ConnectError::InvalidUrl {
            url_redacted: redact(url),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("it does not start with a scheme such as redis://"))?;
        let kind = match scheme.to_ascii_lowercase().as_str() {
            "redis+cluster" | "rediss+cluster" | "valkey+cluster" | "valkeys+cluster" => {
                if cfg!(not(feature = "cluster")) {
                    return Err(ConnectError::FeatureDisabled {
                        url_redacted: shown,
                        topology: "Redis Cluster",
                        feature: "cluster",
                    });
                }
                let tls = scheme.to_ascii_lowercase().starts_with("rediss")
                    || scheme.to_ascii_lowercase().starts_with("valkeys");
                let list = parse_list(rest, tls).map_err(|r| invalid(&r))?;
                if !list.path.is_empty() {
                    return Err(invalid(
                        "a cluster URL takes no path (Redis Cluster has only database 0)",
                    ));
                }
                Kind::Cluster(list.nodes)
            }
            "redis+sentinel" | "rediss+sentinel" | "valkey+sentinel" | "valkeys+sentinel" => {
                if cfg!(not(feature = "sentinel")) {
                    return Err(ConnectError::FeatureDisabled {
                        url_redacted: shown,
                        topology: "Sentinel-monitored master",
                        feature: "sentinel",
                    });
                }
                let tls = scheme.to_ascii_lowercase().starts_with("rediss")
                    || scheme.to_ascii_lowercase().starts_with("valkeys");
                let list = parse_list(rest, tls).map_err(|r| invalid(&r))?;
                let mut parts = list.path.split('/');
                let master = parts.next().unwrap_or_default();
                if master.is_empty() {
                    return Err(invalid(
                        "it names no master; add the name the sentinels monitor, as in redis+sentinel://host:26379/mymaster",
                    ));
                }
                let db = match parts.next() {
                    None | Some("") => 0,
                    Some(db) => db.parse::<i64>().map_err(|_| {
                        invalid("the database after the master name is not a number")
                    })?,
                };
                if parts.next().is_some() {
                    return Err(invalid(
                        "the path has more than a master name and a database number",
                    ));
                }
                // The sentinels are reached without the master's credentials.
                let sentinels = list
                    .nodes
                    .into_iter()
                    .map(|node| {
                        let bare = redis::RedisConnectionInfo::default()
                            .set_protocol(node.redis_settings().protocol());
                        node.set_redis_settings(bare)
                    })
                    .collect();
                let master_info = list.settings.set_db(db);
                Kind::Sentinel {
                    sentinels,
                    master: master.to_owned(),
                    master_info,
                    tls,
                }
            }
            _ => {
                // Checked by the same code that builds the client, so that a
                // URL accepted here is a URL that connects.
                client_for_url(url)?;
                Kind::Standalone(url.to_owned())
            }
        };
        Ok(Self { kind, shown })
    }

    /// The kind of deployment.
    #[must_use]
    pub fn topology(&self) -> Topology {
        match self.kind {
            Kind::Standalone(_) => Topology::Standalone,
            Kind::Cluster(_) => Topology::Cluster,
            Kind::Sentinel { .. } => Topology::Sentinel,
        }
    }

    /// How many addresses the string names: 1 for a standalone server, the
    /// seed nodes of a cluster, the sentinels of a sentinel URL.
    #[must_use]
    pub fn nodes(&self) -> usize {
        match &self.kind {
            Kind::Standalone(_) => 1,
            Kind::Cluster(nodes) => nodes.len(),
            Kind::Sentinel { sentinels, .. } => sentinels.len(),
        }
    }

    /// The master name of a sentinel URL.
    #[must_use]
    pub fn master_name(&self) -> Option<&str> {
        match &self.kind {
            Kind::Sentinel { master, .. } => Some(master),
            _ => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("topology", &self.topology())
            .field("url", &self.shown)
            .finish()
    }
}

/// A list form, split up: every node with the shared credentials, and the path.
struct List {
    nodes: Vec<ConnectionInfo>,
    settings: redis::RedisConnectionInfo,
    path: String,
}

/// Parses `[[user]:password@]host:port[,host:port…][/path][?query]`.
fn parse_list(rest: &str, tls: bool) -> Result<List, String> {
    if tls && cfg!(not(feature = "tls")) {
        return Err("TLS URLs need the `tls` feature of leasehold-redis, which is off".to_owned());
    }
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (hosts, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], rest[slash + 1..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if hosts.is_empty() {
        return Err("it names no host; list host:port pairs separated by commas".to_owned());
    }
    let scheme = if tls { "rediss" } else { "redis" };
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(
                "the host list has an empty entry (two commas in a row, or a trailing comma)"
                    .to_owned(),
            );
        }
        let port = host
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty() && !h.ends_with('['))
            .map(|(_, port)| port)
            .ok_or_else(|| format!("{host:?} has no port; write every node as host:port"))?;
        if !port.chars().all(|c| c.is_ascii_digit()) || port.is_empty() {
            return Err(format!("{host:?} does not end with a port number"));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("{host:?} has a port outside 1 to 65535")),
        }
        let mut one = format!("{scheme}://");
        if let Some(userinfo) = userinfo {
            one.push_str(userinfo);
            one.push('@');
        }
        one.push_str(host);
        if let Some(query) = query {
            one.push_str("/?");
            one.push_str(query);
        }
        let parsed = url::Url::parse(&one).map_err(|e| {
            // The url crate's message names the part, never the URL.
            format!("{host:?} is not a valid host:port ({e})")
        })?;
        let info = parsed.into_connection_info().map_err(|e| e.to_string())?;
        // Leases are small requests that should not wait for more to send.
        let tcp = TcpSettings::default().set_nodelay(true);
        nodes.push(info.set_tcp_settings(tcp));
    }
    let settings = nodes
        .first()
        .map(|n| n.redis_settings().clone())
        .unwrap_or_default();
    Ok(List {
        nodes,
        settings,
        path: path.to_owned(),
    })
}

/// Checks a URL and turns it into a client, with `TCP_NODELAY` on (leases
/// are small requests that should not wait for more to send).
pub(crate) fn client_for_url(url: &str) -> Result<Client, ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidUrl {
        url_redacted: redact(url),
        reason,
    };
    let parsed = url::Url::parse(url.trim()).map_err(|e| invalid(parse_error_reason(e)))?;
    match parsed.scheme() {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(invalid("it names no host".to_owned()));
            }
            if parsed.port() == Some(0) {
                return Err(invalid("port 0 cannot be connected to".to_owned()));
            }
            let tls = matches!(parsed.scheme(), "rediss" | "valkeys");
            if tls && cfg!(not(feature = "tls")) {
                return Err(invalid(
                    "TLS URLs need the `tls` feature of leasehold-redis, which is off".to_owned(),
                ));
            }
            if tls && parsed.fragment() == Some("insecure") && cfg!(not(feature = "tls-insecure")) {
                return Err(invalid(
                    "#insecure (no certificate checks) needs the `tls-insecure` feature of leasehold-redis, which is off; prefer RedisBackend::builder_for_client with your CA certificate".to_owned(),
                ));
            }
        }
        "redis+unix" | "valkey+unix" | "unix" => {}
        other => {
            return Err(invalid(format!(
                "{other}:// is not a Redis scheme; use redis://, rediss:// or redis+unix://"
            )));
        }
    }
    // The redis crate's messages name what is wrong, never the URL itself.
    let info = parsed
        .into_connection_info()
        .map_err(|e| invalid(e.to_string()))?;
    let tcp = TcpSettings::default().set_nodelay(true);
    Client::open(info.set_tcp_settings(tcp)).map_err(|e| invalid(e.to_string()))
}

fn parse_error_reason(error: url::ParseError) -> String {
    match error {
        url::ParseError::RelativeUrlWithoutBase => {
            "it does not start with a scheme such as redis://".to_owned()
        }
        url::ParseError::EmptyHost => "it names no host".to_owned(),
        url::ParseError::InvalidPort => "the port is not a number from 1 to 65535".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Cluster or Sentinel URL parses in a build with its feature, and is
    /// refused with `FeatureDisabled`, naming the feature and masking the
    /// password, in one without it (`.ci/run` runs this without features).
    #[test]
    fn a_topology_without_its_feature_is_refused_by_name() {
        for (url, feature, on) in [
            (
                "redis+cluster://:hunter2@a:7000,b:7000",
                "cluster",
                cfg!(feature = "cluster"),
            ),
            (
                "rediss+cluster://:hunter2@a:7000",
                "cluster",
                cfg!(feature = "cluster") && cfg!(feature = "tls"),
            ),
            (
                "redis+sentinel://:hunter2@a:26379/mymaster",
                "sentinel",
                cfg!(feature = "sentinel"),
            ),
        ] {
            let parsed = Endpoint::parse(url);
            if on {
                assert!(parsed.is_ok(), "{url}: {parsed:?}");
                continue;
            }
            let Err(error) = parsed else {
                panic!("{url} parsed without the `{feature}` feature");
            };
            if feature == "cluster" && cfg!(feature = "cluster") {
                // The TLS form without `tls`: refused for that.
                continue;
            }
            assert!(
                matches!(&error, ConnectError::FeatureDisabled { feature: named, .. } if *named == feature),
                "{url}: {error:?}"
            );
            let shown = format!("{error} {error:?}");
            assert!(shown.contains(&format!("`{feature}` feature")), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    // The Cluster and Sentinel forms parse with their features (the
    // default); `a_topology_without_its_feature_is_refused_by_name` covers
    // builds without them.
    #[cfg(all(feature = "cluster", feature = "sentinel"))]
    #[test]
    fn every_form_parses() -> Result<(), ConnectError> {
        let e = Endpoint::parse("redis://127.0.0.1:6379/2")?;
        assert_eq!((e.topology(), e.nodes()), (Topology::Standalone, 1));
        let e = Endpoint::parse("redis+cluster://a:1,b:2,c:3")?;
        assert_eq!((e.topology(), e.nodes()), (Topology::Cluster, 3));
        let e = Endpoint::parse("redis+sentinel://u:p@a:26379,b:26379/mymaster/3")?;
        assert_eq!((e.topology(), e.nodes()), (Topology::Sentinel, 2));
        assert_eq!(e.master_name(), Some("mymaster"));
        let Kind::Sentinel {
            sentinels,
            master_info,
            ..
        } = &e.kind
        else {
            panic!("a sentinel endpoint");
        };
        assert_eq!(master_info.db(), 3);
        assert_eq!(master_info.password(), Some("p"));
        assert!(
            sentinels
                .iter()
                .all(|s| s.redis_settings().password().is_none())
        );
        Ok(())
    }

    #[cfg(all(feature = "cluster", feature = "sentinel"))]
    #[test]
    fn malformed_urls_are_refused_without_the_password() {
        for url in [
            "",
            "nothing",
            "http://x:1",
            "redis+cluster://",
            "redis+cluster://:hunter2@",
            "redis+cluster://:hunter2@a",
            "redis+cluster://:hunter2@a:1,,b:2",
            "redis+cluster://:hunter2@a:1,b:2,",
            "redis+cluster://:hunter2@a:70000",
            "redis+cluster://:hunter2@a:0",
            "redis+cluster://:hunter2@a:x1",
            "redis+cluster://:hunter2@a:1/3",
            "redis+sentinel://:hunter2@a:1",
            "redis+sentinel://:hunter2@a:1/",
            "redis+sentinel://:hunter2@a:1/m/x",
            "redis+sentinel://:hunter2@a:1/m/1/2",
            "redis://:hunter2@a:99999",
        ] {
            let err = Endpoint::parse(url).err();
            assert!(
                matches!(err, Some(ConnectError::InvalidUrl { .. })),
                "{url}: {err:?}"
            );
            let shown = format!(
                "{} {err:?}",
                err.as_ref().map(ToString::to_string).unwrap_or_default()
            );
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn shown_forms_mask_the_password() -> Result<(), ConnectError> {
        let e = Endpoint::parse("redis+cluster://app:hunter2@a:1,b:2")?;
        let shown = format!("{e} {e:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("app:***@a:1,b:2"),
            "{shown}"
        );
        Ok(())
    }

    #[test]
    fn bad_urls_are_refused_without_showing_the_password() {
        for url in [
            "http://x",
            "redis://:hunter2@",
            "not a url",
            "redis://:hunter2@localhost:65536",
            "redis://:hunter2@localhost:0",
            "redis://localhost/notadb",
            "redis://localhost/?protocol=resp9",
            "",
        ] {
            let err = client_for_url(url).err();
            assert!(
                matches!(err, Some(ConnectError::InvalidUrl { .. })),
                "{url}: {err:?}"
            );
            let shown = format!(
                "{} {:?}",
                err.as_ref().map(ToString::to_string).unwrap_or_default(),
                err
            );
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert!(client_for_url("redis://:hunter2@localhost:6379/1").is_ok());
        assert!(client_for_url("redis+unix:///tmp/redis.sock?pass=hunter2").is_ok());
    }

    /// `Display` and `Debug` each show the URL with its password masked.
    #[cfg(feature = "cluster")]
    #[test]
    fn display_and_debug_each_show_the_masked_url() -> Result<(), ConnectError> {
        let e = Endpoint::parse("redis+cluster://app:hunter2@a:1,b:2")?;
        let shown = e.to_string();
        assert!(shown.contains("app:***@a:1,b:2"), "{shown}");
        let debug = format!("{e:?}");
        assert!(
            debug.contains("Cluster") && debug.contains("app:***@a:1,b:2"),
            "{debug}"
        );
        assert!(!format!("{shown}{debug}").contains("hunter2"));
        Ok(())
    }

    /// A TLS scheme reaches every node of its list over TLS, `rediss+`
    /// and `valkeys+` alike, and a plain one none.
    #[cfg(all(feature = "cluster", feature = "sentinel", feature = "tls"))]
    #[test]
    fn a_tls_list_scheme_reaches_every_node_over_tls() -> Result<(), ConnectError> {
        for (url, tls) in [
            ("rediss+cluster://a:1,b:2", true),
            ("valkeys+cluster://a:1,b:2", true),
            ("redis+cluster://a:1,b:2", false),
            ("valkey+cluster://a:1", false),
            ("rediss+sentinel://a:1,b:2/m", true),
            ("valkeys+sentinel://a:1/m", true),
            ("redis+sentinel://a:1/m", false),
        ] {
            let e = Endpoint::parse(url)?;
            let nodes: Vec<&ConnectionInfo> = match &e.kind {
                Kind::Cluster(nodes) => nodes.iter().collect(),
                Kind::Sentinel {
                    sentinels, tls: t, ..
                } => {
                    assert_eq!(*t, tls, "{url}");
                    sentinels.iter().collect()
                }
                Kind::Standalone(_) => Vec::new(),
            };
            assert!(!nodes.is_empty(), "{url}");
            for node in nodes {
                let over_tls = matches!(node.addr(), redis::ConnectionAddr::TcpTls { .. });
                assert_eq!(over_tls, tls, "{url}");
            }
        }
        Ok(())
    }

    /// Each bad entry of a host list is refused for what is wrong with it.
    #[cfg(feature = "cluster")]
    #[test]
    fn each_bad_host_entry_is_named_for_what_is_wrong() {
        for (url, says) in [
            ("redis+cluster://a:1,:2", "has no port"),
            ("redis+cluster://a:1,[:2", "has no port"),
            ("redis+cluster://a:1,b:", "does not end with a port number"),
        ] {
            let err = Endpoint::parse(url).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(says)),
                "{url}: {err:?}, not {says:?}"
            );
        }
    }

    /// A TLS URL is taken in a build with the `tls` feature, with or
    /// without `#insecure` as that feature allows.
    #[cfg(feature = "tls")]
    #[test]
    fn tls_urls_are_taken_with_the_tls_feature() {
        assert!(client_for_url("rediss://localhost:6380").is_ok());
        assert!(client_for_url("valkeys://localhost:6380/1").is_ok());
        assert_eq!(
            client_for_url("rediss://localhost:6380/#insecure").is_ok(),
            cfg!(feature = "tls-insecure")
        );
    }

    /// A URL the parser refuses gets a reason that says what to fix.
    #[test]
    fn a_refused_url_says_what_to_fix() {
        for (url, says) in [
            ("nothing", "does not start with a scheme such as redis://"),
            (
                "redis://localhost:99999",
                "the port is not a number from 1 to 65535",
            ),
        ] {
            let err = client_for_url(url).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(says)),
                "{url}: {err:?}, not {says:?}"
            );
        }
    }
}
