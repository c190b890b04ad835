//! `parse_size` (and `format_size` of what it returns) on arbitrary strings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierfs_core::size::{format_size, parse_size};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_size(&text) {
        Ok(bytes) => {
            // Bare numbers are bytes: the value round-trips through its decimal form, and
            // surrounding whitespace never matters.
            assert_eq!(parse_size(&bytes.to_string()).unwrap(), bytes);
            assert_eq!(parse_size(&format!(" {text}\n")).unwrap(), bytes);
            let _ = format_size(bytes);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("invalid size"));
        }
    }
});
