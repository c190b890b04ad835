//! `control::parse` on arbitrary writes to `.tierfs/control`.
//!
//! Never panics; accepted commands are what the text says, and re-serialising them gives the
//! same command back. A prefetch path is relative, non-empty and made of `Normal` components
//! only (it cannot leave the mount root).
#![no_main]

use std::path::Component;

use libfuzzer_sys::fuzz_target;
use tierfs_core::control::{parse, Command, ControlError, MAX_COMMAND_BYTES};

fuzz_target!(|data: &[u8]| {
    let result = parse(data);
    let text = std::str::from_utf8(data).map(str::trim);
    match &result {
        Ok(Command::Drop) => assert_eq!(text.unwrap(), "drop"),
        Ok(Command::RamCache(bytes)) => {
            assert!(text.unwrap().starts_with("ram-cache"));
            assert_eq!(parse(format!("ram-cache {bytes}").as_bytes()).unwrap(), Command::RamCache(*bytes));
        }
        Ok(Command::Prefetch(path)) => {
            assert!(text.unwrap().starts_with("prefetch"));
            assert!(path.is_relative());
            assert!(path.components().next().is_some(), "empty prefetch path");
            assert!(
                path.components().all(|c| matches!(c, Component::Normal(_))),
                "prefetch path {path:?} escapes the mount root"
            );
            // `./` and `/.` keep leading/trailing whitespace of the first/last component.
            let again = format!("prefetch ./{}/.", path.to_str().unwrap());
            if again.len() <= MAX_COMMAND_BYTES {
                assert_eq!(parse(again.as_bytes()).unwrap(), Command::Prefetch(path.clone()));
            }
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            match e {
                ControlError::TooLong(n) => assert!(*n > MAX_COMMAND_BYTES),
                ControlError::NotText => assert!(text.is_err()),
                ControlError::Empty => assert!(text.unwrap().is_empty()),
                _ => {}
            }
        }
    }
    if data.len() <= MAX_COMMAND_BYTES {
        if let Ok(t) = text {
            if t.is_empty() {
                assert!(matches!(result, Err(ControlError::Empty)));
            }
        }
    }
});
