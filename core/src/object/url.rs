//! `s3://BUCKET/PREFIX`: which bucket, and which part of it is the source.
//!
//! **Contract.** [`ObjectUrl::parse`] accepts `s3://bucket`, `s3://bucket/` and
//! `s3://bucket/a/b` (or `a/b/`), and normalises the prefix to `""` or `"a/b/"`: every key of
//! the source starts with it, and paths of the source are keys with it removed. A bucket name
//! is 1 to 255 characters of ASCII letters, digits, `.`, `-` and `_` (S3 itself asks for less;
//! S3-compatible stores allow more), starting and ending with a letter or a digit. A prefix
//! segment that is empty (`a//b`), `.` or `..` is refused: no object could be shown under it.

use std::fmt;

use super::ObjectError;

/// The scheme of an object-store source.
const SCHEME: &str = "s3://";
/// The longest bucket name accepted (S3 allows 63; some S3-compatible stores more).
const MAX_BUCKET: usize = 255;
/// The longest prefix accepted: S3's limit on a whole key is 1024 bytes.
const MAX_PREFIX: usize = 1024;

/// `s3://bucket/prefix`: the prefix is `""` (the whole bucket) or ends with `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    pub bucket: String,
    pub prefix: String,
}

impl ObjectUrl {
    /// Whether `s` names an object-store source (it starts with `s3://`), well-formed or not.
    pub fn is_object_url(s: &str) -> bool {
        s.get(..SCHEME.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(SCHEME))
    }

    /// Parses `s3://bucket[/prefix]`; see the module docs for what is accepted.
    pub fn parse(s: &str) -> Result<ObjectUrl, ObjectError> {
        let bad = |reason: &str| ObjectError::BadUrl {
            url: s.to_string(),
            reason: reason.to_string(),
        };
        if !Self::is_object_url(s) {
            return Err(bad(
                "an object-store source is s3://BUCKET or s3://BUCKET/PREFIX",
            ));
        }
        let rest = &s[SCHEME.len()..];
        if rest.contains(['?', '#']) {
            return Err(bad(
                "query strings and fragments are not part of an s3:// URL",
            ));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket(bucket).map_err(|reason| bad(&reason))?;
        let prefix = normalise_prefix(prefix).map_err(|reason| bad(&reason))?;
        Ok(ObjectUrl {
            bucket: bucket.to_string(),
            prefix,
        })
    }

    /// The key of `rel` (a path relative to the prefix, `/`-separated): the prefix and `rel`.
    pub(crate) fn key_of(&self, rel: &str) -> String {
        format!("{}{}", self.prefix, rel)
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.bucket, self.prefix)
    }
}

fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("the bucket name is missing".into());
    }
    if bucket.len() > MAX_BUCKET {
        return Err(format!(
            "the bucket name is longer than {MAX_BUCKET} characters"
        ));
    }
    if let Some(c) = bucket
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!("the bucket name has the character {c:?}"));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(bucket.chars().next()) || !edge_ok(bucket.chars().last()) {
        return Err("the bucket name must start and end with a letter or a digit".into());
    }
    Ok(())
}

fn normalise_prefix(prefix: &str) -> Result<String, String> {
    if prefix.is_empty() {
        return Ok(String::new());
    }
    if prefix.len() > MAX_PREFIX {
        return Err(format!("the prefix is longer than {MAX_PREFIX} bytes"));
    }
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    for segment in trimmed.split('/') {
        match segment {
            "" => return Err("the prefix has an empty segment (\"//\")".into()),
            "." | ".." => return Err(format!("the prefix has a {segment:?} segment")),
            _ => {}
        }
        if segment.contains('\0') {
            return Err("the prefix has a NUL character".into());
        }
    }
    Ok(format!("{trimmed}/"))
}
