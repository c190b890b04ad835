//! The translation run against the real core filesystem over a temp SOURCE (on Linux here:
//! everything below is platform-neutral): bytes bit-exact, no lookup left behind.

use std::fs;

use tierfs_core::budget::BudgetTarget;
use tierfs_core::prefetch::saved::SavedOrders;
use tierfs_core::synth::{write_checkpoint, Layout, SynthDtype, SynthSpec};

use super::*;
use crate::path::resolve;

const BUDGET: u64 = 64 << 20;

fn tree() -> (tempfile::TempDir, Tree) {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = fs::canonicalize(dir.path()).expect("canonical");
    let store = Arc::new(ModelStore::new(BUDGET, SavedOrders::default()));
    let target: Arc<dyn BudgetTarget> = store.clone();
    let governor = Arc::new(Governor::new(target, BUDGET, BUDGET / 4));
    let tree = Tree::new(source, "M:".into(), store, governor).unwrap();
    (dir, tree)
}

fn target(name: &str) -> Target {
    resolve(name).expect("a valid name")
}

fn read_all(tree: &Tree, open: &Open) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 100_000];
    loop {
        match tree.read(open, &mut buf, out.len() as u64) {
            Ok(n) => out.extend_from_slice(&buf[..n as usize]),
            Err(WinError::EndOfFile) => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
}

const FILE: (bool, bool) = (false, true);
const ANY: (bool, bool) = (false, false);

#[test]
fn paths_walk_to_files_read_bit_exact_and_leave_no_lookup_behind() {
    let (dir, tree) = tree();
    fs::create_dir_all(dir.path().join("checkpoints/sub")).unwrap();
    let model_path = dir.path().join("checkpoints/sub/m.safetensors");
    let spec = SynthSpec {
        layout: Layout::Dit,
        target_bytes: 1 << 20,
        dtype: SynthDtype::BF16,
        seed: 5,
    };
    write_checkpoint(&model_path, &spec).unwrap();
    let model = fs::read(&model_path).unwrap();
    let plain: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(dir.path().join("notes.txt"), &plain).unwrap();
    let base = tree.fs().inode_count();

    for (name, expected) in [
        ("\\checkpoints\\sub\\m.safetensors", &model),
        ("\\notes.txt", &plain),
    ] {
        let (open, attr) = tree.open(&target(name), FILE, FILE_READ_DATA).unwrap();
        assert_eq!((attr.kind, attr.size), (Kind::File, expected.len() as u64));
        assert_eq!(&read_all(&tree, &open), expected, "{name}");
        let mut tail = [0u8; 16];
        let n = tree.read(&open, &mut tail, attr.size - 10).unwrap();
        assert_eq!(&tail[..n as usize], &expected[expected.len() - 10..]);
        tree.close(open);
    }
    let size = tree.with_inode(&target("\\notes.txt"), |ino| tree.attr(ino));
    assert_eq!(size.unwrap().size, plain.len() as u64);
    assert_eq!(tree.fs().inode_count(), base, "every lookup was given back");
    assert_eq!(tree.fs().handle_count(), 0);

    let missing = tree.open(&target("\\checkpoints\\nope\\x"), ANY, FILE_READ_DATA);
    assert!(matches!(missing, Err(WinError::Fs(FsError::Io { .. }))));
    let as_dir = tree.open(&target("\\notes.txt"), (true, false), FILE_READ_DATA);
    assert!(matches!(as_dir, Err(WinError::NotDirectory)));
    let write = tree.open(&target("\\notes.txt"), FILE, FILE_WRITE_DATA);
    assert!(matches!(write, Err(WinError::Fs(FsError::ReadOnly))));
    let delete = tree.open(&target("\\checkpoints"), ANY, DELETE);
    assert!(matches!(delete, Err(WinError::Fs(FsError::ReadOnly))));
    assert_eq!(tree.fs().inode_count(), base, "failed opens hold nothing");
}

#[test]
fn directories_hold_their_inode_until_closed_and_list_like_windows() {
    let (dir, tree) = tree();
    fs::create_dir(dir.path().join("loras")).unwrap();
    fs::write(dir.path().join("loras/a.bin"), b"abc").unwrap();
    fs::write(
        dir.path().join(".TIERFS"),
        b"hidden by the control directory",
    )
    .unwrap();
    let base = tree.fs().inode_count();

    let (open, attr) = tree.open(&target("\\loras"), (true, false), 0).unwrap();
    assert_eq!(attr.kind, Kind::Directory);
    assert_eq!(
        tree.fs().inode_count(),
        base + 1,
        "the open directory's own"
    );
    // Changes between opening and enumerating show.
    fs::write(dir.path().join("loras/b.bin"), b"later").unwrap();
    let names = |ino| {
        let mut names: Vec<(String, u64)> = tree
            .list(ino)
            .unwrap()
            .into_iter()
            .map(|(name, attr)| (name, attr.size))
            .collect();
        names.sort();
        names
    };
    let listed = names(open.ino);
    let files: Vec<_> = listed.iter().filter(|(n, _)| !n.starts_with('.')).collect();
    assert_eq!(files, [&("a.bin".into(), 3), &("b.bin".into(), 5)]);
    assert!(listed.iter().any(|(n, _)| n == ".."), "{listed:?}");
    tree.close(open);
    assert_eq!(tree.fs().inode_count(), base);

    let (root, _) = tree.open(&target("\\"), (true, false), 0).unwrap();
    let listed: Vec<String> = names(root.ino).into_iter().map(|(n, _)| n).collect();
    assert_eq!(listed, [".tierfs", "loras"], "no dots in the root");
    tree.close(root);
    assert_eq!(tree.fs().inode_count(), base);
    assert_eq!(tree.fs().handle_count(), 0);
}

#[test]
fn control_and_stats_files_follow_the_core() {
    let (_dir, tree) = tree();
    let (control, _) = tree
        .open(&target("\\.tierfs\\control"), FILE, FILE_WRITE_DATA)
        .unwrap();
    assert_eq!(tree.write(&control, b"ram-cache 32M\n").unwrap(), 14);
    assert_eq!(tree.fs().store().budget(), 32 << 20);
    let bad = tree.write(&control, b"explode\n").unwrap_err();
    assert!(matches!(bad, WinError::Fs(FsError::Control(_))), "{bad}");
    tree.close(control);
    let read = tree.open(&target("\\.tierfs\\control"), FILE, FILE_READ_DATA);
    assert!(matches!(read, Err(WinError::Fs(FsError::Denied(_)))));
    let (attributes_only, _) = tree.open(&target("\\.TIERFS\\Control"), FILE, 0).unwrap();
    tree.close(attributes_only);

    let (stats, _) = tree
        .open(&target("\\.tierfs\\stats"), FILE, FILE_READ_DATA)
        .unwrap();
    let OpenKind::File {
        size: Some(size), ..
    } = stats.kind
    else {
        panic!("stats has its rendered size");
    };
    let json = read_all(&tree, &stats);
    assert_eq!(json.len() as u64, size);
    let doc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert!(doc.get("cache").is_some(), "{doc}");
    tree.close(stats);
    assert_eq!(tree.fs().handle_count(), 0);
}
