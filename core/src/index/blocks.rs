//! Grouping tensor names into transformer blocks, and the default model order of those blocks.
//!
//! # Why blocks
//!
//! Inference touches a checkpoint one transformer block at a time: every tensor named
//! `…blocks.7.…` is needed at roughly the same moment, and block 8 follows. The cache therefore
//! prefetches and evicts whole blocks. This module recovers the block structure from tensor names
//! alone, because a `.safetensors` header carries nothing else.
//!
//! # Recognised families
//!
//! A *family* is a dotted name prefix that ends in one of these family words, followed (except for
//! the UNet/diffusers middle blocks) by a block number:
//!
//! | family word | number | seen in |
//! |---|---|---|
//! | `blocks` | yes | Wan, DiT, Hunyuan |
//! | `transformer_blocks` / `single_transformer_blocks` | yes | diffusers, LTX, SD3, Flux (diffusers) |
//! | `double_blocks` / `single_blocks` | yes | Flux (BFL) |
//! | `input_blocks` / `middle_block` / `output_blocks` | yes / **no** / yes | SD1.5, SDXL (LDM UNet) |
//! | `down_blocks` / `mid_block` / `up_blocks` | yes / **no** / yes | diffusers UNet, VAE |
//! | `layers` | yes | CLIP, Llama-style text encoders |
//! | `encoder.block` / `decoder.block` | yes | T5 |
//! | `h` | yes | GPT-2 |
//! | `blk` | yes | llama.cpp-family GGUF files (`blk.N.attn_q.weight`) |
//!
//! The name may carry any prefix (`model.diffusion_model.`, `transformer.`, `text_model.encoder.`);
//! the prefix becomes part of the family, so two sub-models in one file never share blocks.
//! The **first** (outermost) match wins: `down_blocks.1.attentions.0.transformer_blocks.0.x` belongs
//! to `down_blocks.1`, because the inner transformer block is part of the outer down block.
//! A family word not followed by a number (`blocks.weight`, `layers.x.weight`) does not match and the
//! scan continues; names that match nowhere form the non-block group `(other)`.
//!
//! Block numbers must be canonical decimal `u32`s (no sign, no leading zeros except `0` itself), so
//! that the display name `family.number` is exactly the prefix that appears in the tensor names and
//! `blocks.07` can never be merged with `blocks.7`.
//!
//! The parser is a hand-written scan over `.`-separated segments rather than a regex: the grammar is
//! a fixed word list plus "next segment is a number", the scan is a few dozen lines with no extra
//! dependency, and first-match/outermost semantics and the `encoder.block` two-word families are
//! explicit instead of being hidden in alternation order.
//!
//! # Default model order
//!
//! Before the prefetcher has observed a file's real access order it assumes this one, which is the
//! order a forward pass visits the blocks:
//!
//! 1. the non-block group `(other)` first (embeddings, time/text projections are used before the
//!    first block), only if it has tensors;
//! 2. families ordered by a known rank within their group —
//!    `input_blocks` < `middle_block` < `output_blocks`; `double_blocks` < `single_blocks`;
//!    `transformer_blocks` < `single_transformer_blocks`; `down_blocks` < `mid_block` < `up_blocks`;
//!    `encoder.block` < `decoder.block` — where a group is positioned at the first appearance (in
//!    file offset order) of any of its members, and only families with the same prefix form a group;
//! 3. all other families by first appearance in the file;
//! 4. within a family, by block number ascending (numerically, so `blocks.2` < `blocks.10`, unlike
//!    the plain string sort writers use to lay out data).
//!
//! The ranks are needed because writers lay tensors out by name: alphabetically `single_…` sorts
//! before `transformer_blocks`, but a forward pass runs the transformer blocks first.

use std::collections::HashMap;

use super::BlockInfo;

/// Display name of the non-block group.
pub const OTHER_BLOCK: &str = "(other)";

/// The family word (or, for T5, the two words) that ends a block family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FamilyKind {
    /// `blocks.N`
    Blocks,
    /// `transformer_blocks.N`
    TransformerBlocks,
    /// `single_transformer_blocks.N`
    SingleTransformerBlocks,
    /// `double_blocks.N`
    DoubleBlocks,
    /// `single_blocks.N`
    SingleBlocks,
    /// `input_blocks.N`
    InputBlocks,
    /// `middle_block` (no number)
    MiddleBlock,
    /// `output_blocks.N`
    OutputBlocks,
    /// `layers.N`
    Layers,
    /// `down_blocks.N`
    DownBlocks,
    /// `mid_block` (no number)
    MidBlock,
    /// `up_blocks.N`
    UpBlocks,
    /// `encoder.block.N`
    EncoderBlock,
    /// `decoder.block.N`
    DecoderBlock,
    /// `h.N`
    H,
    /// `blk.N` (GGUF)
    Blk,
}

impl FamilyKind {
    /// Single-segment family words and their kinds.
    const WORDS: [(&'static str, FamilyKind); 14] = [
        ("blocks", FamilyKind::Blocks),
        ("transformer_blocks", FamilyKind::TransformerBlocks),
        (
            "single_transformer_blocks",
            FamilyKind::SingleTransformerBlocks,
        ),
        ("double_blocks", FamilyKind::DoubleBlocks),
        ("single_blocks", FamilyKind::SingleBlocks),
        ("input_blocks", FamilyKind::InputBlocks),
        ("middle_block", FamilyKind::MiddleBlock),
        ("output_blocks", FamilyKind::OutputBlocks),
        ("layers", FamilyKind::Layers),
        ("down_blocks", FamilyKind::DownBlocks),
        ("mid_block", FamilyKind::MidBlock),
        ("up_blocks", FamilyKind::UpBlocks),
        ("h", FamilyKind::H),
        ("blk", FamilyKind::Blk),
    ];

    /// The family word(s) as they appear in tensor names.
    pub fn word(self) -> &'static str {
        match self {
            FamilyKind::EncoderBlock => "encoder.block",
            FamilyKind::DecoderBlock => "decoder.block",
            other => Self::WORDS
                .iter()
                .find(|(_, kind)| *kind == other)
                .map_or("", |(word, _)| word),
        }
    }

    /// Whether blocks of this family carry a number.
    pub fn numbered(self) -> bool {
        !matches!(self, FamilyKind::MiddleBlock | FamilyKind::MidBlock)
    }

    /// `(group, rank)` for families whose relative order is known (see the module docs).
    fn rank(self) -> Option<(u8, u8)> {
        use FamilyKind::*;
        match self {
            InputBlocks => Some((0, 0)),
            MiddleBlock => Some((0, 1)),
            OutputBlocks => Some((0, 2)),
            DoubleBlocks => Some((1, 0)),
            SingleBlocks => Some((1, 1)),
            TransformerBlocks => Some((2, 0)),
            SingleTransformerBlocks => Some((2, 1)),
            DownBlocks => Some((3, 0)),
            MidBlock => Some((3, 1)),
            UpBlocks => Some((3, 2)),
            EncoderBlock => Some((4, 0)),
            DecoderBlock => Some((4, 1)),
            Blocks | Layers | H | Blk => None,
        }
    }

    /// The kind of the family ending at `segments[i]`, if that segment is a family word.
    fn at(segments: &[&str], i: usize) -> Option<FamilyKind> {
        let seg = *segments.get(i)?;
        if seg == "block" {
            return match i.checked_sub(1).and_then(|p| segments.get(p)) {
                Some(&"encoder") => Some(FamilyKind::EncoderBlock),
                Some(&"decoder") => Some(FamilyKind::DecoderBlock),
                _ => None,
            };
        }
        Self::WORDS
            .iter()
            .find(|(word, _)| *word == seg)
            .map(|(_, kind)| *kind)
    }
}

/// The block a tensor belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// Name prefix up to and including the family word, e.g. `model.diffusion_model.blocks`.
    pub family: String,
    /// Block number; `None` for `middle_block` / `mid_block`.
    pub number: Option<u32>,
    /// Which family word matched.
    pub kind: FamilyKind,
}

impl BlockKey {
    /// Display name: `family.number`, or just `family` for unnumbered blocks.
    pub fn name(&self) -> String {
        match self.number {
            Some(n) => format!("{}.{n}", self.family),
            None => self.family.clone(),
        }
    }

    /// The part of `family` before the family word (empty or ending in `.`).
    pub fn prefix(&self) -> &str {
        self.family
            .strip_suffix(self.kind.word())
            .unwrap_or(&self.family)
    }
}

/// Parses a canonical decimal `u32` (no sign, no leading zeros except `"0"`).
fn block_number(seg: &str) -> Option<u32> {
    let canonical = !seg.is_empty()
        && seg.bytes().all(|b| b.is_ascii_digit())
        && (seg == "0" || !seg.starts_with('0'));
    if canonical {
        seg.parse().ok()
    } else {
        None
    }
}

/// The block `name` belongs to, or `None` for the non-block group. See the module docs.
pub fn block_key(name: &str) -> Option<BlockKey> {
    let segments: Vec<&str> = name.split('.').collect();
    (0..segments.len()).find_map(|i| key_at(name, &segments, i))
}

/// The block key if a family ends at `segments[i]` (and is followed by a number when it needs one).
fn key_at(name: &str, segments: &[&str], i: usize) -> Option<BlockKey> {
    let kind = FamilyKind::at(segments, i)?;
    let number = if kind.numbered() {
        Some(block_number(segments.get(i + 1)?)?)
    } else {
        None
    };
    // Byte length of segments[..=i] joined by '.'.
    let len = segments[..=i].iter().map(|s| s.len() + 1).sum::<usize>() - 1;
    Some(BlockKey {
        family: name.get(..len)?.to_string(),
        number,
        kind,
    })
}

/// Blocks in default model order plus, for each input tensor, the index of its block.
#[derive(Debug, Clone, PartialEq)]
pub struct Grouping {
    /// Blocks in default model order (see the module docs).
    pub blocks: Vec<BlockInfo>,
    /// `assignment[i]` is the index into `blocks` of the `i`-th input tensor.
    pub assignment: Vec<usize>,
}

/// Per-family facts needed to order families.
struct Family {
    first: usize,
    kind: FamilyKind,
    prefix: String,
}

/// Groups tensors, given as `(name, byte length)` in file offset order, into blocks.
pub fn group<'a, I>(tensors: I) -> Grouping
where
    I: IntoIterator<Item = (&'a str, u64)>,
{
    let mut keys = Vec::new();
    let mut families: HashMap<String, Family> = HashMap::new();
    for (pos, (name, bytes)) in tensors.into_iter().enumerate() {
        let key = block_key(name);
        if let Some(k) = &key {
            families.entry(k.family.clone()).or_insert_with(|| Family {
                first: pos,
                kind: k.kind,
                prefix: k.prefix().to_string(),
            });
        }
        keys.push((key, bytes));
    }
    let order = family_order(&families);
    assemble(&keys, &order)
}

/// Family names in default model order.
fn family_order(families: &HashMap<String, Family>) -> Vec<String> {
    // A ranked group is anchored at the first appearance of any of its members.
    let mut anchors: HashMap<(&str, u8), usize> = HashMap::new();
    for fam in families.values() {
        if let Some((group, _)) = fam.kind.rank() {
            let anchor = anchors.entry((&fam.prefix, group)).or_insert(fam.first);
            *anchor = (*anchor).min(fam.first);
        }
    }
    let sort_key = |fam: &Family| match fam.kind.rank() {
        Some((group, rank)) => {
            let anchor = anchors.get(&(fam.prefix.as_str(), group)).copied();
            (anchor.unwrap_or(fam.first), rank, fam.first)
        }
        None => (fam.first, 0, fam.first),
    };
    let mut names: Vec<(&String, (usize, u8, usize))> =
        families.iter().map(|(n, f)| (n, sort_key(f))).collect();
    names.sort_by_key(|(_, k)| *k);
    names.into_iter().map(|(n, _)| n.clone()).collect()
}

/// Builds the ordered block list and the per-tensor assignment.
fn assemble(keys: &[(Option<BlockKey>, u64)], family_order: &[String]) -> Grouping {
    let rank: HashMap<&str, usize> = family_order
        .iter()
        .enumerate()
        .map(|(i, f)| (f.as_str(), i))
        .collect();
    // Sort key of a block: non-block group first, then family rank, then number.
    let block_sort = |k: &Option<BlockKey>| {
        k.as_ref().map(|k| {
            let r = rank.get(k.family.as_str()).copied().unwrap_or(usize::MAX);
            (r, k.number)
        })
    };
    let mut distinct: Vec<&Option<BlockKey>> = keys.iter().map(|(k, _)| k).collect();
    distinct.sort_by_key(|k| block_sort(k));
    distinct.dedup();
    let index: HashMap<&Option<BlockKey>, usize> =
        distinct.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let mut blocks: Vec<BlockInfo> = distinct.iter().map(|k| empty_block(k)).collect();
    let mut assignment = Vec::with_capacity(keys.len());
    for (key, bytes) in keys {
        let b = index.get(key).copied().unwrap_or(0);
        if let Some(block) = blocks.get_mut(b) {
            block.tensors += 1;
            block.bytes = block.bytes.saturating_add(*bytes);
        }
        assignment.push(b);
    }
    Grouping { blocks, assignment }
}

fn empty_block(key: &Option<BlockKey>) -> BlockInfo {
    match key {
        Some(k) => BlockInfo {
            name: k.name(),
            family: Some(k.family.clone()),
            number: k.number,
            tensors: 0,
            bytes: 0,
        },
        None => BlockInfo {
            name: OTHER_BLOCK.to_string(),
            family: None,
            number: None,
            tensors: 0,
            bytes: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn display(name: &str) -> Option<String> {
        block_key(name).map(|k| k.name())
    }

    #[test]
    fn real_names() {
        let table: &[(&str, Option<&str>)] = &[
            // Wan 2.2
            ("blocks.12.self_attn.q.weight", Some("blocks.12")),
            // Flux (BFL)
            (
                "double_blocks.3.img_attn.qkv.weight",
                Some("double_blocks.3"),
            ),
            ("single_blocks.37.linear1.weight", Some("single_blocks.37")),
            // SD1.5 / SDXL UNet
            (
                "model.diffusion_model.input_blocks.4.1.proj_in.weight",
                Some("model.diffusion_model.input_blocks.4"),
            ),
            (
                "model.diffusion_model.middle_block.1.norm.weight",
                Some("model.diffusion_model.middle_block"),
            ),
            (
                "model.diffusion_model.output_blocks.11.0.in_layers.0.weight",
                Some("model.diffusion_model.output_blocks.11"),
            ),
            // diffusers
            (
                "transformer_blocks.5.attn.to_q.weight",
                Some("transformer_blocks.5"),
            ),
            (
                "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_k.weight",
                Some("down_blocks.1"),
            ),
            ("mid_block.resnets.0.conv1.weight", Some("mid_block")),
            (
                "single_transformer_blocks.7.proj_out.weight",
                Some("single_transformer_blocks.7"),
            ),
            // LTX
            (
                "transformer_blocks.47.ff.net.0.proj.weight",
                Some("transformer_blocks.47"),
            ),
            // T5
            (
                "encoder.block.23.layer.1.DenseReluDense.wi_0.weight",
                Some("encoder.block.23"),
            ),
            (
                "decoder.block.0.layer.0.SelfAttention.q.weight",
                Some("decoder.block.0"),
            ),
            // CLIP
            (
                "text_model.encoder.layers.11.mlp.fc1.weight",
                Some("text_model.encoder.layers.11"),
            ),
            // GPT-2
            ("h.11.attn.c_attn.weight", Some("h.11")),
            ("transformer.h.0.ln_1.weight", Some("transformer.h.0")),
            // non-block
            ("patch_embedding.weight", None),
            ("time_embedding.0.weight", None),
            ("final_layer.linear.weight", None),
            ("blocks.weight", None),
            ("layers.x.weight", None),
            ("blocks", None),
            ("block.3.weight", None),
            ("blocks.99999999999.weight", None),
            ("blocks.-1.weight", None),
            ("blocks.07.weight", None),
            ("", None),
        ];
        for (name, want) in table {
            assert_eq!(display(name).as_deref(), *want, "name {name:?}");
        }
    }

    #[test]
    fn key_fields() {
        let k = block_key("model.diffusion_model.input_blocks.4.1.proj_in.weight").unwrap();
        assert_eq!(k.family, "model.diffusion_model.input_blocks");
        assert_eq!(k.number, Some(4));
        assert_eq!(k.kind, FamilyKind::InputBlocks);
        assert_eq!(k.prefix(), "model.diffusion_model.");
        let t5 = block_key("encoder.block.0.x").unwrap();
        assert_eq!(t5.family, "encoder.block");
        assert_eq!(t5.prefix(), "");
        // A family word without a number does not stop the scan.
        let k = block_key("blocks.norm.layers.2.weight").unwrap();
        assert_eq!(k.name(), "blocks.norm.layers.2");
        assert_eq!(block_key("blocks.0").unwrap().number, Some(0));
        assert_eq!(
            block_key("blocks.4294967295.w").unwrap().number,
            Some(u32::MAX)
        );
    }

    fn names_of(names: &[&str]) -> Vec<String> {
        group(names.iter().map(|n| (*n, 1)))
            .blocks
            .into_iter()
            .map(|b| b.name)
            .collect()
    }

    #[test]
    fn numeric_order_within_family() {
        // String-sorted file order, as writers produce it.
        let got = names_of(&["blocks.1.w", "blocks.10.w", "blocks.2.w", "head.w"]);
        assert_eq!(got, ["(other)", "blocks.1", "blocks.2", "blocks.10"]);
    }

    #[test]
    fn other_only_when_present() {
        assert_eq!(names_of(&["blocks.0.w"]), ["blocks.0"]);
        assert!(names_of(&[]).is_empty());
    }

    #[test]
    fn unet_rank() {
        let p = "model.diffusion_model.";
        let names: Vec<String> = [
            "output_blocks.0.w",
            "middle_block.0.w",
            "input_blocks.1.w",
            "out.w",
        ]
        .iter()
        .map(|n| format!("{p}{n}"))
        .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let got = names_of(&refs);
        assert_eq!(
            got,
            [
                "(other)".to_string(),
                format!("{p}input_blocks.1"),
                format!("{p}middle_block"),
                format!("{p}output_blocks.0"),
            ]
        );
    }

    #[test]
    fn ranked_groups() {
        let got = names_of(&[
            "single_blocks.0.w",
            "double_blocks.1.w",
            "double_blocks.0.w",
        ]);
        assert_eq!(
            got,
            ["double_blocks.0", "double_blocks.1", "single_blocks.0"]
        );
        let got = names_of(&["single_transformer_blocks.0.w", "transformer_blocks.0.w"]);
        assert_eq!(got, ["transformer_blocks.0", "single_transformer_blocks.0"]);
        let got = names_of(&["up_blocks.0.w", "mid_block.w", "down_blocks.0.w"]);
        assert_eq!(got, ["down_blocks.0", "mid_block", "up_blocks.0"]);
        let got = names_of(&["decoder.block.0.w", "encoder.block.0.w"]);
        assert_eq!(got, ["encoder.block.0", "decoder.block.0"]);
    }

    #[test]
    fn unranked_families_by_first_appearance() {
        // A text encoder stored after the DiT keeps its file position; the group of ranked
        // families sits where its first member appears.
        let got = names_of(&[
            "vae.up_blocks.0.w",
            "dit.blocks.0.w",
            "vae.down_blocks.0.w",
            "te.layers.0.w",
        ]);
        assert_eq!(
            got,
            [
                "vae.down_blocks.0",
                "vae.up_blocks.0",
                "dit.blocks.0",
                "te.layers.0"
            ]
        );
        // Same family word under different prefixes: different groups.
        let got = names_of(&["b.single_blocks.0.w", "a.double_blocks.0.w"]);
        assert_eq!(got, ["b.single_blocks.0", "a.double_blocks.0"]);
    }

    #[test]
    fn assignment_and_totals() {
        let g = group([
            ("blocks.1.a", 10),
            ("blocks.0.a", 5),
            ("emb", 3),
            ("blocks.1.b", 7),
        ]);
        let names: Vec<&str> = g.blocks.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["(other)", "blocks.0", "blocks.1"]);
        assert_eq!(g.assignment, [2, 1, 0, 2]);
        assert_eq!((g.blocks[2].tensors, g.blocks[2].bytes), (2, 17));
        assert_eq!(g.blocks[0].family, None);
        assert_eq!(g.blocks[1].family.as_deref(), Some("blocks"));
        assert_eq!(g.blocks[1].number, Some(0));
    }

    proptest! {
        #[test]
        fn block_key_never_panics_and_name_is_a_prefix(name in "[a-z_.0-9]{0,40}") {
            if let Some(k) = block_key(&name) {
                let display = k.name();
                prop_assert!(name.starts_with(&display));
                let rest = &name[display.len()..];
                prop_assert!(rest.is_empty() || rest.starts_with('.'));
            }
        }

        #[test]
        fn group_assigns_every_tensor(names in proptest::collection::vec("(blocks|h|x)\\.[0-9]{1,2}\\.w", 0..30)) {
            let g = group(names.iter().map(|n| (n.as_str(), 2)));
            prop_assert_eq!(g.assignment.len(), names.len());
            let total: usize = g.blocks.iter().map(|b| b.tensors).sum();
            prop_assert_eq!(total, names.len());
            prop_assert!(g.blocks.iter().all(|b| b.tensors > 0));
            for (n, &b) in names.iter().zip(&g.assignment) {
                let want = block_key(n).map_or_else(|| OTHER_BLOCK.to_string(), |k| k.name());
                prop_assert_eq!(&g.blocks[b].name, &want);
            }
        }
    }
}
