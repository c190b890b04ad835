//! The command-line options of an object-store source (`s3://BUCKET/PREFIX`), shared by
//! `tierfs mount` and `tierfs object-check`.

use std::time::Duration;

use clap::Args;
use tierfs_core::object::ObjectStoreConfig;

/// How to reach an `s3://` source; every option falls back to the environment and the AWS
/// shared config files, then to AWS itself (see docs/OBJECT_STORE.md).
#[derive(Args, Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectArgs {
    /// Endpoint of an S3-compatible store (MinIO, R2, SeaweedFS, Ceph): https://HOST[:PORT],
    /// or http:// for a store without TLS [default: AWS_ENDPOINT_URL, the profile's
    /// endpoint_url, else AWS S3].
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// The bucket's region [default: AWS_REGION, the profile's region, else us-east-1].
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
    /// Profile of the AWS shared config and credentials files [default: AWS_PROFILE, else
    /// default].
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// How long a listing of the objects is reused before the store is listed again: a model
    /// uploaded meanwhile appears within it (e.g. 60s, 5m).
    #[arg(long, value_name = "DURATION", value_parser = tierfs_core::cli::parse_duration_arg)]
    pub listing_ttl: Option<Duration>,
    /// How long one request to the store may wait for its answer, or for the next bytes of
    /// its body, before it is tried again (5 retries with backoff) [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = tierfs_core::cli::parse_duration_arg)]
    pub request_timeout: Option<Duration>,
}

impl ObjectArgs {
    /// The client configuration these options ask for.
    pub fn config(&self) -> ObjectStoreConfig {
        let defaults = ObjectStoreConfig::default();
        ObjectStoreConfig {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            profile: self.profile.clone(),
            listing_ttl: self.listing_ttl.unwrap_or(defaults.listing_ttl),
            request_timeout: self.request_timeout.unwrap_or(defaults.request_timeout),
            ..defaults
        }
    }
}
