//! Code shared by the integration tests that need it.

pub(crate) mod campaign_client;
