//! `block_key` and `group` on arbitrary UTF-8 names.
//!
//! Input: arbitrary bytes, decoded lossily; each line is one tensor name. Every name is checked
//! with `block_key`, and the list (with byte lengths derived from the names) goes through `group`.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use tierfs_core::index::blocks::{block_key, group, BlockKey, OTHER_BLOCK};

fn check_key(name: &str, k: &BlockKey) {
    // The family is a prefix of the name ending at a segment boundary, and ends in its word.
    assert!(name.starts_with(&k.family), "family {:?} of {name:?}", k.family);
    let after = &name[k.family.len()..];
    assert!(after.is_empty() || after.starts_with('.'));
    assert!(k.family.ends_with(k.kind.word()));
    let prefix = k.prefix();
    assert_eq!(format!("{prefix}{}", k.kind.word()), k.family);
    assert!(prefix.is_empty() || prefix.ends_with('.'), "prefix {prefix:?}");
    // The display name is a prefix too, and the number is the canonical next segment.
    let display = k.name();
    assert!(name.starts_with(&display));
    let rest = &name[display.len()..];
    assert!(rest.is_empty() || rest.starts_with('.'));
    assert_eq!(k.number.is_some(), k.kind.numbered());
    if let Some(n) = k.number {
        assert_eq!(after[1..].split('.').next(), Some(n.to_string().as_str()));
    }
    // First match wins, and depends only on the segments up to the number: the display name
    // maps to the same key.
    assert_eq!(block_key(&display).as_ref(), Some(k), "display {display:?}");
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let names: Vec<&str> = text.split('\n').take(256).collect();
    let mut keys = Vec::with_capacity(names.len());
    for name in &names {
        let key = block_key(name);
        if let Some(k) = &key {
            check_key(name, k);
        }
        keys.push(key);
    }
    let g = group(names.iter().map(|n| (*n, n.len() as u64 * 1_000_003)));
    assert_eq!(g.assignment.len(), names.len());
    let total: usize = g.blocks.iter().map(|b| b.tensors).sum();
    assert_eq!(total, names.len());
    assert!(g.blocks.iter().all(|b| b.tensors > 0));
    let mut bytes: HashMap<usize, u64> = HashMap::new();
    for ((name, key), &b) in names.iter().zip(&keys).zip(&g.assignment) {
        assert!(b < g.blocks.len());
        let want = key.as_ref().map_or_else(|| OTHER_BLOCK.to_string(), |k| k.name());
        assert_eq!(g.blocks[b].name, want);
        assert_eq!(g.blocks[b].family, key.as_ref().map(|k| k.family.clone()));
        assert_eq!(g.blocks[b].number, key.as_ref().and_then(|k| k.number));
        *bytes.entry(b).or_default() += name.len() as u64 * 1_000_003;
    }
    for (b, info) in g.blocks.iter().enumerate() {
        assert_eq!(info.bytes, bytes[&b]);
        if info.family.is_none() {
            assert_eq!(b, 0, "(other) must come first");
        }
    }
    // Block names are distinct; within a family, numbers ascend and blocks are adjacent.
    let mut seen = std::collections::HashSet::new();
    assert!(g.blocks.iter().all(|b| seen.insert(b.name.clone())));
    let mut done = std::collections::HashSet::new();
    for w in g.blocks.windows(2) {
        if w[0].family.is_some() && w[0].family == w[1].family {
            assert!(w[0].number < w[1].number, "{} / {}", w[0].name, w[1].name);
        } else if let Some(f) = &w[0].family {
            assert!(done.insert(f.clone()), "family {f:?} split");
        }
    }
});
