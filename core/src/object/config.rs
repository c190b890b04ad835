//! How the client reaches the store, and its tuning.
//!
//! **Contract.** [`ObjectStoreConfig`] holds what the caller chose; `resolve` turns it into
//! what the client uses, the usual AWS way: an explicit value first, then the environment
//! (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_DEFAULT_REGION`,
//! `AWS_PROFILE`), then the profile's section of the shared config file (`AWS_CONFIG_FILE`,
//! else `~/.aws/config`: `region`, `endpoint_url`). Credentials are not read here: the S3
//! client's credential chain finds them (environment, the shared credentials and config files
//! under the same profile, SSO, web identity, the container or instance role). A custom
//! endpoint is addressed path-style (`ENDPOINT/BUCKET/KEY`), the form S3-compatible stores
//! serve; AWS itself virtual-host style where the bucket name allows it.

use std::path::PathBuf;
use std::time::Duration;

use super::ObjectError;

/// How long a listing is reused: model folders change rarely, and a listing of a large prefix
/// costs one request per 1000 keys.
pub const DEFAULT_LISTING_TTL: Duration = Duration::from_secs(60);
/// One request's bound: the wait for a response, and every pause within its body. A healthy
/// store answers in well under a second; 30 s rides out a loaded one.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Ranged GETs in flight for one read: S3 serves each connection at tens of MB/s, so a few
/// GB/s need about this many.
pub const DEFAULT_MAX_PARALLEL: usize = 16;
/// The smallest part of a parallel read: below 1 MiB the per-request cost (a round trip, the
/// request itself, priced per request on AWS) outweighs the transfer.
pub const DEFAULT_MIN_PART: u64 = 1 << 20;
/// The largest part: 16 MiB keeps a retried part cheap and the memory of the parts in flight
/// (16 x 16 MiB) bounded.
pub const DEFAULT_MAX_PART: u64 = 16 << 20;
/// The region when none is configured anywhere: S3-compatible stores accept any, and AWS's
/// global endpoint answers for it.
pub const FALLBACK_REGION: &str = "us-east-1";

/// The client's configuration; see [`Default`] for the tuning.
#[derive(Debug, Clone)]
pub struct ObjectStoreConfig {
    /// `https://host[:port]` or `http://host[:port]` of an S3-compatible store (MinIO, R2,
    /// SeaweedFS, ...); `None`: the environment, the profile, else AWS.
    pub endpoint: Option<String>,
    /// The bucket's region; `None`: the environment, the profile, else `us-east-1`.
    pub region: Option<String>,
    /// The profile of the shared config and credentials files; `None`: `AWS_PROFILE`, else
    /// `default`.
    pub profile: Option<String>,
    /// How long a listing is reused.
    pub listing_ttl: Duration,
    /// One request's bound (the wait for its response and every pause in its body).
    pub request_timeout: Duration,
    /// Ranged GETs in flight per read.
    pub max_parallel: usize,
    /// The smallest part of a parallel read, in bytes.
    pub min_part: u64,
    /// The largest part of a parallel read, in bytes.
    pub max_part: u64,
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        ObjectStoreConfig {
            endpoint: None,
            region: None,
            profile: None,
            listing_ttl: DEFAULT_LISTING_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_parallel: DEFAULT_MAX_PARALLEL,
            min_part: DEFAULT_MIN_PART,
            max_part: DEFAULT_MAX_PART,
        }
    }
}

impl ObjectStoreConfig {
    /// Refuses tuning the client cannot work with.
    pub(crate) fn check(&self) -> Result<(), ObjectError> {
        let bad = |reason: &str| {
            Err(ObjectError::Config {
                reason: reason.to_string(),
            })
        };
        if self.request_timeout.is_zero() {
            return bad("request_timeout must be above zero");
        }
        if self.max_parallel == 0 {
            return bad("max_parallel must be at least 1");
        }
        if self.min_part == 0 || self.min_part > self.max_part {
            return bad("the part sizes must satisfy 0 < min_part <= max_part");
        }
        if usize::try_from(self.max_part).is_err() {
            return bad("max_part does not fit in memory");
        }
        Ok(())
    }
}

/// Where and how the client connects, resolved from the configuration, the environment and
/// the profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The endpoint with its scheme, without a trailing `/`; `None`: AWS.
    pub endpoint: Option<String>,
    pub region: String,
    /// The profile named explicitly (`--profile`); `None` leaves the choice to the credential
    /// chain (`AWS_PROFILE`, else `default`).
    pub profile: Option<String>,
    /// Virtual-host style addressing (`BUCKET.ENDPOINT/KEY`) instead of path style.
    pub virtual_host: bool,
}

impl Resolved {
    /// The endpoint for messages: the configured one or AWS's.
    pub fn endpoint_label(&self) -> String {
        self.endpoint
            .clone()
            .unwrap_or_else(|| format!("AWS S3 ({})", self.region))
    }
}

/// The settings of one profile in the shared config file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ProfileSettings {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

/// Resolves `config` for `bucket`; `env` looks up an environment variable (the process's, or
/// a test's), `profile_settings` reads a profile's section of the shared config file.
pub(crate) fn resolve(
    config: &ObjectStoreConfig,
    bucket: &str,
    env: &dyn Fn(&str) -> Option<String>,
    profile_settings: &dyn Fn(&str) -> Result<ProfileSettings, ObjectError>,
) -> Result<Resolved, ObjectError> {
    let nonempty = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let explicit_profile = nonempty(config.profile.clone());
    let profile_name = explicit_profile
        .clone()
        .or_else(|| nonempty(env("AWS_PROFILE")))
        .unwrap_or_else(|| "default".to_string());
    let profile = profile_settings(&profile_name)?;
    let endpoint = nonempty(config.endpoint.clone())
        .or_else(|| nonempty(env("AWS_ENDPOINT_URL_S3")))
        .or_else(|| nonempty(env("AWS_ENDPOINT_URL")))
        .or(profile.endpoint_url)
        .map(|e| normalise_endpoint(&e))
        .transpose()?;
    let region = nonempty(config.region.clone())
        .or_else(|| nonempty(env("AWS_REGION")))
        .or_else(|| nonempty(env("AWS_DEFAULT_REGION")))
        .or(profile.region)
        .unwrap_or_else(|| FALLBACK_REGION.to_string());
    // AWS's own endpoint: virtual-host style (path style is deprecated there), except for
    // bucket names with dots, which its TLS certificate does not cover.
    let virtual_host = endpoint.is_none() && !bucket.contains('.');
    Ok(Resolved {
        endpoint,
        region: region.trim().to_string(),
        profile: explicit_profile,
        virtual_host,
    })
}

/// `host:port` becomes `https://host:port`; `http://` and `https://` stay; other schemes are
/// refused; a trailing `/` goes.
fn normalise_endpoint(endpoint: &str) -> Result<String, ObjectError> {
    let endpoint = endpoint.trim();
    let lower = endpoint.to_ascii_lowercase();
    let with_scheme = if lower.starts_with("http://") || lower.starts_with("https://") {
        endpoint.to_string()
    } else if lower.contains("://") {
        return Err(ObjectError::Config {
            reason: format!("endpoint {endpoint}: only http:// and https:// are supported"),
        });
    } else {
        format!("https://{endpoint}")
    };
    let host = with_scheme.split_once("://").map_or("", |(_, rest)| rest);
    if host.is_empty() || host.starts_with('/') {
        return Err(ObjectError::Config {
            reason: format!("endpoint {endpoint}: no host"),
        });
    }
    Ok(with_scheme.trim_end_matches('/').to_string())
}

/// The process's environment variable `name`.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The shared config file: `AWS_CONFIG_FILE`, else `~/.aws/config`.
fn shared_config_path() -> Option<PathBuf> {
    if let Some(path) = process_env("AWS_CONFIG_FILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    process_env("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".aws").join("config"))
}

/// `profile`'s settings in the process's shared config file; none where there is no file.
pub(crate) fn shared_profile_settings(profile: &str) -> Result<ProfileSettings, ObjectError> {
    let Some(path) = shared_config_path() else {
        return Ok(ProfileSettings::default());
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ProfileSettings::default()),
        Err(e) => {
            return Err(ObjectError::Config {
                reason: format!("cannot read the AWS config file {}: {e}", path.display()),
            })
        }
    };
    profile_settings_in(&text, profile).map_err(|reason| ObjectError::Config {
        reason: format!("the AWS config file {}: {reason}", path.display()),
    })
}

/// `profile`'s `region` and `endpoint_url` in the text of a shared config file: its section is
/// `[default]` or `[profile NAME]` (`[NAME]` also accepted, as the credentials file names it).
pub(crate) fn profile_settings_in(text: &str, profile: &str) -> Result<ProfileSettings, String> {
    let ini = ini::Ini::load_from_str(text).map_err(|e| e.to_string())?;
    let wanted = format!("profile {profile}");
    let section = ini
        .iter()
        .find(|(name, _)| name.is_some_and(|n| n.trim() == wanted))
        .or_else(|| {
            ini.iter()
                .find(|(name, _)| name.is_some_and(|n| n.trim() == profile))
        });
    let Some((_, props)) = section else {
        return Ok(ProfileSettings::default());
    };
    let get = |key: &str| {
        props
            .get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    Ok(ProfileSettings {
        region: get("region"),
        endpoint_url: get("endpoint_url"),
    })
}
