//! Stand-ins for the redis crate's cluster and Sentinel clients when the
//! `cluster` or `sentinel` feature is off.
//!
//! Each is a type with no values: [`Endpoint::parse`](crate::Endpoint::parse)
//! refuses the URLs of a topology whose feature is off
//! ([`ConnectError::FeatureDisabled`](crate::ConnectError::FeatureDisabled)), so no
//! connection of that topology is ever made, and the code that handles one
//! compiles unchanged and is known unreachable (`match *self {}`), without a
//! feature gate on every `match` over the topologies.

#![allow(clippy::unused_async)]

#[cfg(not(feature = "cluster"))]
pub(crate) use cluster::ClusterConnection;
#[cfg(not(feature = "sentinel"))]
pub(crate) use sentinel::SentinelClient;

/// The error of a cluster connection asked for without the feature, where
/// a type cannot rule it out (a Cluster URL is refused before it).
#[cfg(not(feature = "cluster"))]
pub(crate) fn cluster_feature_off() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "Redis Cluster needs the `cluster` feature of leasehold-redis, which is off",
        "cluster".to_owned(),
    ))
}

#[cfg(not(feature = "cluster"))]
mod cluster {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    use redis::{Cmd, Pipeline, RedisResult, ToRedisArgs, Value};

    /// A cluster connection, of which there is none without the feature.
    #[derive(Clone)]
    pub(crate) enum ClusterConnection {}

    impl ClusterConnection {
        pub(crate) async fn route_command(
            &mut self,
            _cmd: Cmd,
            _route: RoutingInfo,
        ) -> RedisResult<Value> {
            match *self {}
        }

        pub(crate) async fn route_pipeline(
            &mut self,
            _pipe: Pipeline,
            _offset: usize,
            _count: usize,
            _route: SingleNodeRoutingInfo,
        ) -> RedisResult<Vec<Value>> {
            match *self {}
        }

        pub(crate) async fn ssubscribe(&mut self, _channel: impl ToRedisArgs) -> RedisResult<()> {
            match *self {}
        }

        pub(crate) async fn sunsubscribe(&mut self, _channel: impl ToRedisArgs) -> RedisResult<()> {
            match *self {}
        }
    }
}

#[cfg(not(feature = "sentinel"))]
mod sentinel {
    use redis::aio::MultiplexedConnection;
    use redis::{AsyncConnectionConfig, RedisResult};

    /// A Sentinel client, of which there is none without the feature.
    pub(crate) enum SentinelClient {}

    impl SentinelClient {
        pub(crate) async fn get_async_connection_with_config(
            &mut self,
            _config: &AsyncConnectionConfig,
        ) -> RedisResult<MultiplexedConnection> {
            match *self {}
        }

        pub(crate) async fn async_get_client(&mut self) -> RedisResult<redis::Client> {
            match *self {}
        }
    }
}
