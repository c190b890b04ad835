//! What can go wrong talking to an object store, in the terms a user acts on.
//!
//! **Contract.** Every failure of the client is one [`ObjectError`], whose message names what
//! to fix (the URL, the credentials, the bucket, the key, the endpoint) and carries the store's
//! own error code where it gave one. [`ObjectError::into_io`] is the error a filesystem answers
//! for it. The store's errors are classified once, here (`classify`).

use std::io;
use std::time::Duration;

/// An object-store failure.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The `s3://` URL is malformed.
    #[error("{url}: not a valid object-store URL: {reason}")]
    BadUrl { url: String, reason: String },
    /// The client's configuration is unusable (tuning, endpoint, region).
    #[error("object-store configuration: {reason}")]
    Config { reason: String },
    /// The store refused the request's signature or identity: 403, `InvalidAccessKeyId`,
    /// `SignatureDoesNotMatch`, `ExpiredToken`, `AccessDenied`, or no credentials were found.
    #[error(
        "bucket {bucket}: access denied ({detail}): check the credentials (AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE or --profile, the shared \
         credentials file) and that they may read the bucket"
    )]
    Credentials { bucket: String, detail: String },
    /// The bucket does not exist at this endpoint.
    #[error("bucket {bucket} does not exist (NoSuchBucket){}", at_endpoint(.endpoint))]
    NoBucket { bucket: String, endpoint: String },
    /// No object has this key.
    #[error("no object {key}")]
    NotFound { key: String },
    /// The object was replaced or removed since its version was listed: its bytes are no
    /// longer that version's.
    #[error("object {key} changed since it was listed (its ETag no longer matches)")]
    Changed { key: String },
    /// The store kept answering "slow down" (503 `SlowDown`, 429) after the retries.
    #[error("the store is throttling requests ({detail}) after {retries} retries")]
    Throttled { detail: String, retries: u32 },
    /// A request (or the whole operation) took longer than its bound.
    #[error("{what} timed out after {:.1} s", .after.as_secs_f64())]
    TimedOut { what: String, after: Duration },
    /// The endpoint could not be reached (connection refused or reset, DNS, TLS).
    #[error("cannot reach the object store at {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    /// Anything else the store answered.
    #[error("object store error: {detail}")]
    Other { detail: String },
}

fn at_endpoint(endpoint: &str) -> String {
    if endpoint.is_empty() {
        String::new()
    } else {
        format!(" at {endpoint}")
    }
}

impl ObjectError {
    /// The error a filesystem answers, this error's message kept inside it (the log shows
    /// it): of kind `PermissionDenied` (EACCES) for credentials, `NotFound` (ENOENT) for a
    /// missing bucket or key, `StaleNetworkFileHandle` (ESTALE) for a changed object,
    /// `TimedOut` (ETIMEDOUT), `InvalidInput` (EINVAL) for a bad URL or configuration, `Other`
    /// (EIO) for the rest (throttling past the retries included: the reader cannot do better
    /// than the retries did). It carries no OS errno: a front end maps the kind.
    pub fn into_io(self) -> io::Error {
        let kind = match &self {
            ObjectError::BadUrl { .. } | ObjectError::Config { .. } => io::ErrorKind::InvalidInput,
            ObjectError::Credentials { .. } => io::ErrorKind::PermissionDenied,
            ObjectError::NoBucket { .. } | ObjectError::NotFound { .. } => io::ErrorKind::NotFound,
            ObjectError::Changed { .. } => io::ErrorKind::StaleNetworkFileHandle,
            ObjectError::TimedOut { .. } => io::ErrorKind::TimedOut,
            ObjectError::Throttled { .. }
            | ObjectError::Unreachable { .. }
            | ObjectError::Other { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, self)
    }
}

/// What a failed request was about, for the message of its error.
pub(crate) struct Failed<'a> {
    pub bucket: &'a str,
    pub endpoint: &'a str,
    /// The key read or looked up; `None` for a listing.
    pub key: Option<&'a str>,
    /// The operation, for timeouts ("LIST s3://b/p/", "GET key").
    pub what: &'a str,
    /// The retries made before giving up (throttling).
    pub retries: u32,
    /// The bound of one request (for timeouts reported by the client's layer).
    pub request_timeout: Duration,
}

/// The S3 error codes that mean "these credentials are not accepted".
const CREDENTIAL_CODES: &[&str] = &[
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AccessDenied",
    "AllAccessDisabled",
    "AccountProblem",
];

/// Classifies an error of the S3 client. The client's error kinds say most of it; the S3
/// error code in the message (`code: "NoSuchBucket"`) and the wording of transport errors
/// say the rest.
pub(crate) fn classify(err: &opendal::Error, failed: &Failed<'_>) -> ObjectError {
    use opendal::ErrorKind as K;
    let text = err.to_string();
    let code = s3_code(&text);
    let key = || failed.key.unwrap_or_default().to_string();
    let credentials = |detail: String| ObjectError::Credentials {
        bucket: failed.bucket.to_string(),
        detail,
    };
    if code == Some("NoSuchBucket") {
        return ObjectError::NoBucket {
            bucket: failed.bucket.to_string(),
            endpoint: failed.endpoint.to_string(),
        };
    }
    if let Some(code) = code.filter(|c| CREDENTIAL_CODES.contains(c)) {
        return credentials(code.to_string());
    }
    if matches!(
        code,
        Some("PermanentRedirect" | "AuthorizationHeaderMalformed")
    ) || text.contains("PermanentRedirect")
    {
        return ObjectError::Config {
            reason: format!(
                "bucket {} is in another region than the one asked ({}): set --region or \
                 AWS_REGION",
                failed.bucket,
                code.unwrap_or("301 PermanentRedirect")
            ),
        };
    }
    match err.kind() {
        K::ConditionNotMatch => return ObjectError::Changed { key: key() },
        K::NotFound => {
            return match failed.key {
                Some(key) => ObjectError::NotFound {
                    key: key.to_string(),
                },
                // A listing answered 404 without a code: the bucket is not there.
                None => ObjectError::NoBucket {
                    bucket: failed.bucket.to_string(),
                    endpoint: failed.endpoint.to_string(),
                },
            };
        }
        K::PermissionDenied => return credentials(code.unwrap_or("403 Forbidden").to_string()),
        _ => {}
    }
    if is_throttling(err) {
        let status = if err.kind() == K::RateLimited {
            "429 Too Many Requests"
        } else {
            "503 Service Unavailable"
        };
        return ObjectError::Throttled {
            detail: code.unwrap_or(status).to_string(),
            retries: failed.retries,
        };
    }
    if text.contains("timeout reached") {
        return ObjectError::TimedOut {
            what: failed.what.to_string(),
            after: failed.request_timeout,
        };
    }
    if text.contains("loading credential")
        || text.contains("signing credential")
        || text.contains("signing http request")
    {
        return credentials(format!("no usable credentials found: {}", source_text(err)));
    }
    if text.contains("send http request") || text.contains("read data from http response") {
        return ObjectError::Unreachable {
            endpoint: failed.endpoint.to_string(),
            detail: source_text(err),
        };
    }
    if err.kind() == K::ConfigInvalid {
        return ObjectError::Config {
            reason: err.message().to_string(),
        };
    }
    ObjectError::Other {
        detail: match code {
            Some(code) => format!("{code}: {text}"),
            None => text,
        },
    }
}

/// Whether `err` is the store asking the client to slow down: 429 (the client's
/// `RateLimited`), 503 or its S3 codes (`SlowDown`, `ServiceUnavailable`, `Throttling`).
pub(crate) fn is_throttling(err: &opendal::Error) -> bool {
    let text = err.to_string();
    err.kind() == opendal::ErrorKind::RateLimited
        || matches!(
            s3_code(&text),
            Some("SlowDown" | "ServiceUnavailable" | "Throttling")
        )
        || text.contains("status: 503")
}

/// The S3 error code in a message of the client (`code: "SlowDown"`).
fn s3_code(text: &str) -> Option<&str> {
    let start = text.find("code: \"")? + "code: \"".len();
    let len = text[start..].find('"')?;
    let code = &text[start..start + len];
    (!code.is_empty() && code.chars().all(|c| c.is_ascii_alphanumeric())).then_some(code)
}

/// The innermost cause of an error, where the transport gave one ("Connection refused").
fn source_text(err: &opendal::Error) -> String {
    let mut cause: &dyn std::error::Error = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let inner = cause.to_string();
    if inner.is_empty() {
        err.message().to_string()
    } else {
        inner
    }
}
