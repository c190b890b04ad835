//! Unit tests of the object-store client's pure parts: URLs, configuration, the tree of a
//! listing, identities, the range planner, error classification. The client against a real
//! S3 server is tested end to end by tests/python/test_object_client.py.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;

use super::config::{profile_settings_in, resolve, ProfileSettings};
use super::error::{classify, Failed};
use super::tree::Listed;
use super::*;

// ----------------------------------------------------------------------------- URLs

#[test]
fn url_parses_bucket_and_normalises_prefix() {
    let cases = [
        ("s3://models", "models", ""),
        ("s3://models/", "models", ""),
        ("s3://models/a", "models", "a/"),
        ("s3://models/a/b", "models", "a/b/"),
        ("s3://models/a/b/", "models", "a/b/"),
        ("S3://my.bucket-1/x", "my.bucket-1", "x/"),
        ("s3://legacy_Bucket/x y/z", "legacy_Bucket", "x y/z/"),
    ];
    for (s, bucket, prefix) in cases {
        let url = ObjectUrl::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(url.bucket, bucket, "{s}");
        assert_eq!(url.prefix, prefix, "{s}");
        // Display gives back a URL that parses to the same thing.
        assert_eq!(ObjectUrl::parse(&url.to_string()).unwrap(), url, "{s}");
    }
    assert_eq!(
        ObjectUrl::parse("s3://b/a/b").unwrap().to_string(),
        "s3://b/a/b/"
    );
    assert_eq!(ObjectUrl::parse("s3://b").unwrap().to_string(), "s3://b/");
}

#[test]
fn url_refuses_malformed() {
    let bad = [
        "",
        "models",
        "/srv/models",
        "http://models/a",
        "s3:/models",
        "s3://",
        "s3:///a",
        "s3://-models/a",
        "s3://models-/a",
        "s3://mo dels/a",
        "s3://mo/dels//a",
        "s3://models//",
        "s3://models/a/./b",
        "s3://models/../b",
        "s3://models/a?versionId=1",
        "s3://models/a#b",
        "s3://mo\u{e9}dels/a",
    ];
    for s in bad {
        match ObjectUrl::parse(s) {
            Err(ObjectError::BadUrl { url, .. }) => assert_eq!(url, s),
            other => panic!("{s:?}: {other:?}"),
        }
    }
    let long = format!("s3://{}", "b".repeat(256));
    assert!(ObjectUrl::parse(&long).is_err());
    let long_prefix = format!("s3://b/{}", "p".repeat(1025));
    assert!(ObjectUrl::parse(&long_prefix).is_err());
}

#[test]
fn url_is_object_url() {
    assert!(ObjectUrl::is_object_url("s3://b/x"));
    assert!(ObjectUrl::is_object_url("S3://b"));
    assert!(ObjectUrl::is_object_url("s3://")); // an s3 URL, if not a valid one
    assert!(!ObjectUrl::is_object_url("/models"));
    assert!(!ObjectUrl::is_object_url("s3:"));
    assert!(!ObjectUrl::is_object_url("gs://b"));
    assert!(!ObjectUrl::is_object_url("é3://b"));
}

// ----------------------------------------------------------------------------- configuration

fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

fn no_profile(_: &str) -> Result<ProfileSettings, ObjectError> {
    Ok(ProfileSettings::default())
}

#[test]
fn resolve_prefers_explicit_then_environment_then_profile() {
    let profile = |name: &str| {
        Ok(if name == "dev" {
            ProfileSettings {
                region: Some("eu-north-1".into()),
                endpoint_url: Some("http://profile:9000".into()),
            }
        } else {
            ProfileSettings::default()
        })
    };
    let config = ObjectStoreConfig::default();
    // Nothing anywhere: AWS, the fallback region, virtual-host style.
    let r = resolve(&config, "b", &env_of(&[]), &no_profile).unwrap();
    assert_eq!(r.endpoint, None);
    assert_eq!(r.region, FALLBACK_REGION);
    assert!(r.virtual_host);
    assert_eq!(r.profile, None);
    // AWS_PROFILE picks the profile's region and endpoint (path style then).
    let r = resolve(&config, "b", &env_of(&[("AWS_PROFILE", "dev")]), &profile).unwrap();
    assert_eq!(r.endpoint.as_deref(), Some("http://profile:9000"));
    assert_eq!(r.region, "eu-north-1");
    assert!(!r.virtual_host);
    assert_eq!(
        r.profile, None,
        "AWS_PROFILE is left to the credential chain"
    );
    // The environment beats the profile.
    let env = env_of(&[
        ("AWS_PROFILE", "dev"),
        ("AWS_REGION", "us-west-2"),
        ("AWS_ENDPOINT_URL", "https://env.example:443/"),
    ]);
    let r = resolve(&config, "b", &env, &profile).unwrap();
    assert_eq!(r.endpoint.as_deref(), Some("https://env.example:443"));
    assert_eq!(r.region, "us-west-2");
    // AWS_ENDPOINT_URL_S3 beats AWS_ENDPOINT_URL; AWS_DEFAULT_REGION is the last variable.
    let env = env_of(&[
        ("AWS_ENDPOINT_URL", "http://general:1"),
        ("AWS_ENDPOINT_URL_S3", "http://s3only:2"),
        ("AWS_DEFAULT_REGION", "ap-south-1"),
    ]);
    let r = resolve(&config, "b", &env, &no_profile).unwrap();
    assert_eq!(r.endpoint.as_deref(), Some("http://s3only:2"));
    assert_eq!(r.region, "ap-south-1");
    // Explicit values beat everything, and an explicit profile is passed on.
    let explicit = ObjectStoreConfig {
        endpoint: Some("minio.local:9000".into()),
        region: Some("local".into()),
        profile: Some("dev".into()),
        ..ObjectStoreConfig::default()
    };
    let env = env_of(&[
        ("AWS_REGION", "us-west-2"),
        ("AWS_ENDPOINT_URL", "http://x:1"),
    ]);
    let r = resolve(&explicit, "b", &env, &profile).unwrap();
    assert_eq!(r.endpoint.as_deref(), Some("https://minio.local:9000"));
    assert_eq!(r.region, "local");
    assert_eq!(r.profile.as_deref(), Some("dev"));
    // Bucket names with dots stay path-style on AWS.
    let r = resolve(&config, "my.bucket", &env_of(&[]), &no_profile).unwrap();
    assert!(!r.virtual_host);
}

#[test]
fn resolve_refuses_other_schemes() {
    for endpoint in ["ftp://host", "http://", "https:///x"] {
        let config = ObjectStoreConfig {
            endpoint: Some(endpoint.into()),
            ..ObjectStoreConfig::default()
        };
        assert!(
            matches!(
                resolve(&config, "b", &env_of(&[]), &no_profile),
                Err(ObjectError::Config { .. })
            ),
            "{endpoint}"
        );
    }
}

#[test]
fn profile_settings_read_from_config_text() {
    let text = "\
[default]
region = us-east-2

[profile dev]
region=eu-west-1
endpoint_url = http://127.0.0.1:9000
output = json

[plain]
region = ap-east-1
";
    let get = |p: &str| profile_settings_in(text, p).unwrap();
    assert_eq!(get("default").region.as_deref(), Some("us-east-2"));
    assert_eq!(get("default").endpoint_url, None);
    assert_eq!(get("dev").region.as_deref(), Some("eu-west-1"));
    assert_eq!(
        get("dev").endpoint_url.as_deref(),
        Some("http://127.0.0.1:9000")
    );
    assert_eq!(get("plain").region.as_deref(), Some("ap-east-1"));
    assert_eq!(get("missing"), ProfileSettings::default());
}

#[test]
fn config_check_refuses_unusable_tuning() {
    assert!(ObjectStoreConfig::default().check().is_ok());
    let bad = [
        ObjectStoreConfig {
            max_parallel: 0,
            ..ObjectStoreConfig::default()
        },
        ObjectStoreConfig {
            min_part: 0,
            ..ObjectStoreConfig::default()
        },
        ObjectStoreConfig {
            min_part: 8 << 20,
            max_part: 1 << 20,
            ..ObjectStoreConfig::default()
        },
        ObjectStoreConfig {
            request_timeout: Duration::ZERO,
            ..ObjectStoreConfig::default()
        },
    ];
    for config in bad {
        assert!(
            matches!(config.check(), Err(ObjectError::Config { .. })),
            "{config:?}"
        );
    }
}

// ----------------------------------------------------------------------------- tree

fn version(key: &str, size: u64, etag: &str) -> ObjectVersion {
    ObjectVersion {
        key: key.to_string(),
        size,
        etag: etag.to_string(),
        last_modified: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    }
}

/// A listing of `keys` under `prefix`: a key ending in `/` is a folder marker, every other an
/// object of `size` = the key's length.
fn listing(prefix: &str, keys: &[&str]) -> Vec<Listed> {
    keys.iter()
        .map(|rel| Listed {
            rel: rel.to_string(),
            version: (!rel.ends_with('/'))
                .then(|| version(&format!("{prefix}{rel}"), rel.len() as u64, "e")),
        })
        .collect()
}

fn names(tree: &ObjectTree, dir: &str) -> Vec<String> {
    tree.list(Path::new(dir))
        .unwrap_or_else(|| panic!("{dir:?} is not a directory"))
        .into_iter()
        .map(|(name, entry)| {
            let name = name.to_string_lossy().into_owned();
            match entry {
                TreeEntry::Dir => format!("{name}/"),
                TreeEntry::Object(_) => name,
            }
        })
        .collect()
}

#[test]
fn tree_nests_keys_and_folder_markers() {
    let keys = [
        "model.safetensors",
        "unet/diffusion.safetensors",
        "unet/config.json",
        "text/encoders/clip_l.safetensors",
        "empty/",
        "vae/",
        "vae/vae.safetensors",
        "", // the marker of the prefix itself
    ];
    let tree = ObjectTree::build(listing("models/", &keys), Instant::now());
    assert_eq!(tree.objects(), 5);
    let bytes: u64 = keys
        .iter()
        .filter(|k| !k.is_empty() && !k.ends_with('/'))
        .map(|k| k.len() as u64)
        .sum();
    assert_eq!(tree.bytes(), bytes);
    assert_eq!(
        names(&tree, ""),
        ["empty/", "model.safetensors", "text/", "unet/", "vae/"]
    );
    assert_eq!(
        names(&tree, "unet"),
        ["config.json", "diffusion.safetensors"]
    );
    assert_eq!(names(&tree, "text"), ["encoders/"]);
    assert_eq!(names(&tree, "text/encoders"), ["clip_l.safetensors"]);
    assert!(names(&tree, "empty").is_empty());
    assert_eq!(tree.entry(Path::new("")), Some(TreeEntry::Dir));
    assert_eq!(tree.entry(Path::new("text/encoders")), Some(TreeEntry::Dir));
    assert_eq!(tree.entry(Path::new("/unet/")), Some(TreeEntry::Dir));
    match tree.entry(Path::new("unet/config.json")) {
        Some(TreeEntry::Object(v)) => {
            assert_eq!(v.key, "models/unet/config.json");
            assert_eq!(v.size, "unet/config.json".len() as u64);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tree.entry(Path::new("unet/missing")), None);
    assert_eq!(tree.list(Path::new("model.safetensors")), None);
    assert_eq!(tree.list(Path::new("nothing")), None);
    assert_eq!(tree.iter().count(), 5);
    assert_eq!(tree.dirs(), 6); // root, empty, text, text/encoders, unet, vae
}

#[test]
fn a_directory_summary_counts_its_entries_and_takes_its_newest_object_time() {
    let at = |secs: u64| UNIX_EPOCH + Duration::from_secs(secs);
    let object = |rel: &str, secs: u64| Listed {
        rel: rel.to_string(),
        version: Some(ObjectVersion {
            last_modified: at(secs),
            ..version(rel, 1, "e")
        }),
    };
    let marker = |rel: &str| Listed {
        rel: rel.to_string(),
        version: None,
    };
    let listed = vec![
        object("unet/a.safetensors", 100),
        object("unet/b.safetensors", 300),
        object("unet/deep/c.safetensors", 900),
        marker("empty/"),
        object("top.json", 50),
    ];
    let tree = ObjectTree::build(listed, Instant::now());
    let summary = |dir: &str| tree.dir_summary(Path::new(dir));
    // Its objects and its subdirectory; a deeper object's time is not its own.
    assert_eq!(
        summary("unet"),
        Some(DirSummary {
            entries: 3,
            newest: at(300)
        })
    );
    assert_eq!(summary("unet/deep").map(|s| s.newest), Some(at(900)));
    assert_eq!(
        summary("empty"),
        Some(DirSummary {
            entries: 0,
            newest: UNIX_EPOCH
        })
    );
    assert_eq!(
        summary(""),
        Some(DirSummary {
            entries: 3,
            newest: at(50)
        })
    );
    assert_eq!(summary("top.json"), None, "an object is not a directory");
    assert_eq!(summary("missing"), None);
    let names: Vec<String> = tree
        .names(Path::new("unet"))
        .expect("a directory")
        .into_iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a.safetensors", "b.safetensors", "deep"]);
    assert_eq!(tree.names(Path::new("top.json")), None);
}

#[test]
fn tree_leaves_out_hostile_keys() {
    let keys = [
        "ok/file.bin",
        "a//b",
        "/leading",
        "./dot",
        "x/../escape",
        "x/./y",
        "..",
        "nul\0byte",
        &"n".repeat(256),
        "trailing//",
    ];
    let tree = ObjectTree::build(listing("", &keys), Instant::now());
    assert_eq!(tree.objects(), 1);
    assert_eq!(names(&tree, ""), ["ok/"]);
    assert_eq!(names(&tree, "ok"), ["file.bin"]);
    // A 255-byte name is still a name.
    let max = "m".repeat(255);
    let tree = ObjectTree::build(listing("", &[max.as_str()]), Instant::now());
    assert_eq!(tree.objects(), 1);
}

#[test]
fn tree_prefers_the_directory_when_a_name_is_both() {
    for keys in [["a", "a/b", "c/", "c"], ["a/b", "a", "c", "c/"]] {
        let tree = ObjectTree::build(listing("", &keys), Instant::now());
        assert_eq!(names(&tree, ""), ["a/", "c/"], "{keys:?}");
        assert_eq!(names(&tree, "a"), ["b"], "{keys:?}");
        assert_eq!(tree.objects(), 1, "{keys:?}");
        assert_eq!(tree.bytes(), 3, "{keys:?}");
    }
}

#[test]
fn tree_of_nothing_is_an_empty_root() {
    let tree = ObjectTree::build(Vec::new(), Instant::now());
    assert_eq!(tree.objects(), 0);
    assert_eq!(tree.bytes(), 0);
    assert_eq!(tree.entry(Path::new("")), Some(TreeEntry::Dir));
    assert_eq!(tree.list(Path::new("")), Some(Vec::new()));
}

// ----------------------------------------------------------------------------- identity

#[test]
fn identity_follows_key_size_etag_and_time() {
    let v = version("m/a.safetensors", 100, "9b2cf535f27731c974343645a3985328");
    let id = v.identity(7);
    assert_eq!(id, v.identity(7), "stable");
    assert_eq!(id.dev, 7);
    assert_eq!(id.size, 100);
    assert_eq!(id.mtime_ns, 1_700_000_000 * 1_000_000_000);
    let new_etag = ObjectVersion {
        etag: "0cc175b9c0f1b6a831c399e269772661".into(),
        ..v.clone()
    };
    assert_ne!(new_etag.identity(7), id, "a new ETag is a new identity");
    assert_eq!(
        new_etag.identity(7).ino,
        id.ino,
        "the same key: the same inode"
    );
    assert_ne!(new_etag.identity(7).ctime_ns, id.ctime_ns);
    let other_key = ObjectVersion {
        key: "m/b.safetensors".into(),
        ..v.clone()
    };
    assert_ne!(other_key.identity(7).ino, id.ino);
    let later = ObjectVersion {
        last_modified: v.last_modified + Duration::from_nanos(1),
        ..v.clone()
    };
    assert_ne!(later.identity(7), id);
    assert_ne!(v.identity(8), id, "another mount's device");
    let before_epoch = ObjectVersion {
        last_modified: UNIX_EPOCH - Duration::from_secs(1),
        ..v.clone()
    };
    assert_eq!(before_epoch.identity(7).mtime_ns, -1_000_000_000);
    let _ = SystemTime::now(); // identities never look at the clock
}

// ----------------------------------------------------------------------------- planner

const MIB: u64 = 1 << 20;

fn check_parts(planner: &RangePlanner, offset: u64, len: u64, min: u64, max: u64) {
    let parts = planner.parts(offset, len);
    if len == 0 {
        assert!(parts.is_empty());
        return;
    }
    let mut at = offset;
    for (i, &(start, n)) in parts.iter().enumerate() {
        assert_eq!(start, at, "contiguous, no overlap: part {i} of {parts:?}");
        assert!(n > 0, "empty part {i}");
        assert!(n <= max, "part {i} of {n} above max {max}");
        if len >= min {
            assert!(n >= min, "part {i} of {n} below min {min} (len {len})");
        }
        at += n;
    }
    assert_eq!(at, offset + len, "the parts cover the read exactly");
}

#[test]
fn planner_parts_cover_reads_within_bounds() {
    let planner = RangePlanner::new(MIB, 16 * MIB, 16);
    for (offset, len) in [
        (0, 1),
        (0, MIB - 1),
        (5, MIB),
        (0, MIB + 1),
        (123, 40 * MIB + 17),
        (0, 1 << 34),
        (u64::MAX - 10 * MIB, 10 * MIB),
    ] {
        check_parts(&planner, offset, len, MIB, 16 * MIB);
    }
    assert!(planner.parts(0, 0).is_empty());
    // A read shorter than min_part is one part.
    assert_eq!(planner.parts(10, 4096), vec![(10, 4096)]);
}

#[test]
fn planner_spreads_a_read_over_the_connections() {
    let planner = RangePlanner::new(MIB, 16 * MIB, 16);
    // 40 MiB: more parts than the link's part size alone would give, one per connection.
    let parts = planner.parts(0, 40 * MIB);
    assert_eq!(parts.len(), 16, "{parts:?}");
    // 4 MiB: not below min_part, so 4 parts.
    assert_eq!(planner.parts(0, 4 * MIB).len(), 4);
}

#[test]
fn planner_part_grows_with_latency_and_throughput() {
    let planner = RangePlanner::new(MIB, 64 * MIB, 16);
    let settle = |latency: Duration, bps: f64| {
        for _ in 0..64 {
            let bytes = 8 * MIB;
            planner.observe(latency, bytes, Duration::from_secs_f64(bytes as f64 / bps));
        }
    };
    settle(Duration::from_millis(2), 50e6);
    let near = planner.target_part();
    assert!((planner.latency().as_secs_f64() - 0.002).abs() < 1e-4);
    assert!((planner.stream_throughput() - 50e6).abs() / 50e6 < 0.01);
    // 4 round trips of 2 ms at 50 MB/s = 400 kB: the minimum.
    assert_eq!(near, MIB);
    settle(Duration::from_millis(50), 50e6);
    let far = planner.target_part();
    assert!(far > near, "{far} <= {near}");
    // 4 x 50 ms x 50 MB/s = 10 MB.
    assert!((far as f64 - 10e6).abs() < 0.05e6 * 10.0, "{far}");
    settle(Duration::from_millis(200), 100e6);
    assert_eq!(planner.target_part(), 64 * MIB, "capped at max_part");
    // A large read at high latency uses large parts.
    let parts = planner.parts(0, 4096 * MIB);
    assert!(
        parts.iter().all(|&(_, n)| n == 64 * MIB),
        "{:?}",
        &parts[..2]
    );
    // Small transfers move the latency, not the throughput.
    let bps = planner.stream_throughput();
    planner.observe(Duration::from_millis(1), 4096, Duration::from_micros(1));
    assert_eq!(planner.stream_throughput(), bps);
}

#[test]
fn planner_puts_bounds_in_order() {
    let planner = RangePlanner::new(0, 0, 0);
    assert_eq!(planner.max_parallel(), 1);
    check_parts(&planner, 0, 1000, 1, 1);
    // Swapped bounds are put in order: [1 MiB, 8 MiB].
    let planner = RangePlanner::new(8 * MIB, MIB, 4);
    check_parts(&planner, 3, 100 * MIB, MIB, 8 * MIB);
}

proptest! {
    #[test]
    fn planner_parts_always_exact(
        offset in 0u64..(1 << 40),
        len in 0u64..(1 << 32),
        min_kib in 64u64..4096,
        span in 2u64..64,
        parallel in 1usize..64,
        latency_ms in 0u64..500,
        mbps in 1u64..2000,
    ) {
        let min = min_kib << 10;
        let max = min * span;
        let planner = RangePlanner::new(min, max, parallel);
        planner.observe(Duration::from_millis(latency_ms), 4 * MIB, Duration::from_secs_f64(4.0 * MIB as f64 / (mbps as f64 * 1e6)));
        check_parts(&planner, offset, len, min, max);
    }
}

// ----------------------------------------------------------------------------- errors

fn failed<'a>(key: Option<&'a str>) -> Failed<'a> {
    Failed {
        bucket: "models",
        endpoint: "http://127.0.0.1:9000",
        key,
        what: "GET k",
        retries: 5,
        request_timeout: Duration::from_secs(30),
    }
}

fn s3_error(kind: opendal::ErrorKind, code: &str) -> opendal::Error {
    opendal::Error::new(
        kind,
        format!(
            "S3Error {{ code: \"{code}\", message: \"m\", resource: \"\", request_id: \"r\" }}"
        ),
    )
}

#[test]
fn classify_maps_store_answers() {
    use opendal::ErrorKind as K;
    let key = Some("m/a.bin");
    let cases: Vec<(opendal::Error, Option<&str>, &str)> = vec![
        (
            s3_error(K::PermissionDenied, "InvalidAccessKeyId"),
            None,
            "Credentials",
        ),
        (
            s3_error(K::PermissionDenied, "SignatureDoesNotMatch"),
            key,
            "Credentials",
        ),
        (s3_error(K::Unexpected, "ExpiredToken"), None, "Credentials"),
        (
            opendal::Error::new(K::PermissionDenied, ""),
            None,
            "Credentials",
        ),
        (s3_error(K::ConfigInvalid, "NoSuchBucket"), None, "NoBucket"),
        (opendal::Error::new(K::NotFound, ""), None, "NoBucket"),
        (s3_error(K::NotFound, "NoSuchKey"), key, "NotFound"),
        (
            opendal::Error::new(K::ConditionNotMatch, ""),
            key,
            "Changed",
        ),
        (s3_error(K::Unexpected, "SlowDown"), key, "Throttled"),
        (opendal::Error::new(K::RateLimited, ""), key, "Throttled"),
        (
            opendal::Error::new(K::Unexpected, "io operation timeout reached"),
            key,
            "TimedOut",
        ),
        (
            opendal::Error::new(K::Unexpected, "send http request"),
            None,
            "Unreachable",
        ),
        (s3_error(K::Unexpected, "PermanentRedirect"), None, "Config"),
        (s3_error(K::Unexpected, "InternalError"), key, "Other"),
        (
            opendal::Error::new(K::Unexpected, "signing http request"),
            None,
            "Credentials",
        ),
    ];
    for (err, key, want) in cases {
        let got = classify(&err, &failed(key));
        let name = format!("{got:?}");
        assert!(name.starts_with(want), "{err}: {name}");
    }
}

#[test]
fn error_messages_name_what_to_fix() {
    let denied = classify(
        &s3_error(opendal::ErrorKind::PermissionDenied, "InvalidAccessKeyId"),
        &failed(None),
    )
    .to_string();
    assert!(denied.contains("credentials"), "{denied}");
    assert!(denied.contains("InvalidAccessKeyId"), "{denied}");
    assert!(denied.contains("models"), "{denied}");
    let missing = classify(
        &s3_error(opendal::ErrorKind::ConfigInvalid, "NoSuchBucket"),
        &failed(None),
    )
    .to_string();
    assert!(
        missing.contains("bucket models does not exist"),
        "{missing}"
    );
}

#[test]
fn errors_become_io_errors_of_their_kind_with_their_message() {
    let cases = [
        (
            ObjectError::Credentials {
                bucket: "b".into(),
                detail: "d".into(),
            },
            io::ErrorKind::PermissionDenied,
        ),
        (
            ObjectError::NoBucket {
                bucket: "b".into(),
                endpoint: String::new(),
            },
            io::ErrorKind::NotFound,
        ),
        (
            ObjectError::NotFound { key: "k".into() },
            io::ErrorKind::NotFound,
        ),
        (
            ObjectError::Changed { key: "k".into() },
            io::ErrorKind::StaleNetworkFileHandle,
        ),
        (
            ObjectError::TimedOut {
                what: "w".into(),
                after: Duration::from_secs(1),
            },
            io::ErrorKind::TimedOut,
        ),
        (
            ObjectError::Throttled {
                detail: "SlowDown".into(),
                retries: 5,
            },
            io::ErrorKind::Other,
        ),
        (
            ObjectError::Unreachable {
                endpoint: "e".into(),
                detail: "d".into(),
            },
            io::ErrorKind::Other,
        ),
        (
            ObjectError::Other { detail: "d".into() },
            io::ErrorKind::Other,
        ),
        (
            ObjectError::Config { reason: "r".into() },
            io::ErrorKind::InvalidInput,
        ),
    ];
    for (err, kind) in cases {
        let message = err.to_string();
        let io = err.into_io();
        assert_eq!(io.kind(), kind, "{message}");
        assert_eq!(
            io.raw_os_error(),
            None,
            "{message}: the kind says the errno"
        );
        assert_eq!(io.to_string(), message, "the message is kept");
    }
}

#[test]
fn etags_lose_their_quotes() {
    use super::read::{quoted, unquote};
    assert_eq!(unquote("\"9b2cf535f277\""), "9b2cf535f277");
    assert_eq!(unquote("W/\"abc-3\""), "abc-3");
    assert_eq!(unquote("abc"), "abc");
    assert_eq!(quoted(&unquote("\"x\"")), "\"x\"");
}
