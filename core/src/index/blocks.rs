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
//! | `encoder.down` / `encoder.mid` / `decoder.mid` / `decoder.up` | yes / **no** / **no** / yes | LDM VAE (SD1.5 and SDXL checkpoints' `first_stage_model`, Flux's `ae`) |
//! | `resblocks` | yes | OpenCLIP text encoders (SDXL's second one) |
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
//! # Several models in one file
//!
//! An all-in-one checkpoint holds several models side by side: SD1.5's UNet
//! (`model.diffusion_model.`), text encoder (`cond_stage_model.`) and VAE (`first_stage_model.`).
//! Their non-block tensors are used at different times (the UNet's `time_embed` with its first
//! block, the text encoder's 75 MB token embedding when the prompt is encoded), so they are not
//! one group: where the families' prefixes start with two or more different first segments
//! (the *sub-models*), each sub-model's non-block tensors form their own group,
//! `<first segment>.(other)` (`cond_stage_model.(other)`), and the rest stay in `(other)`. A
//! file of one model keeps the single `(other)`. Why: a loader entering a block has the rest of
//! that block read ahead, and with one `(other)` for all sub-models, a load entering one
//! sub-model's embeddings had the other sub-models' tensors read ahead, to be evicted before
//! their turn ([measured](../../../docs/PERFORMANCE.md#one-non-block-group-per-sub-model)).
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
//!    first block), only if it has tensors; a sub-model's own `(other)` group comes right before
//!    that sub-model's first family;
//! 2. families ordered by a known rank within their group —
//!    `input_blocks` < `middle_block` < `output_blocks`; `double_blocks` < `single_blocks`;
//!    `transformer_blocks` < `single_transformer_blocks`; `down_blocks` < `mid_block` < `up_blocks`;
//!    `encoder.block` < `decoder.block`; `encoder.down` < `encoder.mid` < `decoder.mid` <
//!    `decoder.up` — where a group is positioned at the first appearance (in
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
    /// `encoder.down.N` (LDM VAE)
    EncoderDown,
    /// `encoder.mid` (LDM VAE, no number)
    EncoderMid,
    /// `decoder.mid` (LDM VAE, no number)
    DecoderMid,
    /// `decoder.up.N` (LDM VAE)
    DecoderUp,
    /// `resblocks.N` (OpenCLIP)
    Resblocks,
    /// `h.N`
    H,
    /// `blk.N` (GGUF)
    Blk,
}

impl FamilyKind {
    /// Single-segment family words and their kinds.
    const WORDS: [(&'static str, FamilyKind); 15] = [
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
        ("resblocks", FamilyKind::Resblocks),
    ];

    /// Families of two segments, the first of which is `encoder` or `decoder`: T5's blocks and
    /// the LDM VAE's stages. Matched only after that word, so a bare `block`, `down`, `mid` or
    /// `up` elsewhere is no family.
    const AFTER_CODER: [(&'static str, &'static str, FamilyKind); 6] = [
        ("encoder", "block", FamilyKind::EncoderBlock),
        ("decoder", "block", FamilyKind::DecoderBlock),
        ("encoder", "down", FamilyKind::EncoderDown),
        ("encoder", "mid", FamilyKind::EncoderMid),
        ("decoder", "mid", FamilyKind::DecoderMid),
        ("decoder", "up", FamilyKind::DecoderUp),
    ];

    /// The family word(s) as they appear in tensor names.
    pub fn word(self) -> &'static str {
        match self {
            FamilyKind::EncoderBlock => "encoder.block",
            FamilyKind::DecoderBlock => "decoder.block",
            FamilyKind::EncoderDown => "encoder.down",
            FamilyKind::EncoderMid => "encoder.mid",
            FamilyKind::DecoderMid => "decoder.mid",
            FamilyKind::DecoderUp => "decoder.up",
            other => Self::WORDS
                .iter()
                .find(|(_, kind)| *kind == other)
                .map_or("", |(word, _)| word),
        }
    }

    /// Whether blocks of this family carry a number.
    pub fn numbered(self) -> bool {
        !matches!(
            self,
            FamilyKind::MiddleBlock
                | FamilyKind::MidBlock
                | FamilyKind::EncoderMid
                | FamilyKind::DecoderMid
        )
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
            EncoderDown => Some((5, 0)),
            EncoderMid => Some((5, 1)),
            DecoderMid => Some((5, 2)),
            DecoderUp => Some((5, 3)),
            Blocks | Layers | H | Blk | Resblocks => None,
        }
    }

    /// The kind of the family ending at `segments[i]`, if that segment is a family word.
    fn at(segments: &[&str], i: usize) -> Option<FamilyKind> {
        let seg = *segments.get(i)?;
        if Self::AFTER_CODER.iter().any(|(_, word, _)| *word == seg) {
            let before = i.checked_sub(1).and_then(|p| segments.get(p))?;
            return Self::AFTER_CODER
                .iter()
                .find(|(coder, word, _)| coder == before && *word == seg)
                .map(|(_, _, kind)| *kind);
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

/// What a tensor is grouped under: a block, or a non-block group (of a sub-model, where the
/// file holds several: see "Several models in one file" in the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Group {
    /// The non-block tensors of the sub-model whose names start with this segment, or, for
    /// `None`, those of no sub-model (or of the file's one model).
    Other(Option<String>),
    Block(BlockKey),
}

/// The first `.`-separated segment of `name`.
fn first_segment(name: &str) -> &str {
    name.split('.').next().unwrap_or("")
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
        keys.push((name, key, bytes));
    }
    // Sub-models: the first segments of the families' prefixes, where there are several.
    let mut submodels: Vec<&str> = families
        .values()
        .map(|f| first_segment(&f.prefix))
        .filter(|seg| !seg.is_empty())
        .collect();
    submodels.sort_unstable();
    submodels.dedup();
    let several = submodels.len() >= 2;
    let groups: Vec<(Group, u64)> = keys
        .into_iter()
        .map(|(name, key, bytes)| {
            let group = match key {
                Some(k) => Group::Block(k),
                None => {
                    let seg = first_segment(name);
                    let own = several && submodels.binary_search(&seg).is_ok();
                    Group::Other(own.then(|| seg.to_string()))
                }
            };
            (group, bytes)
        })
        .collect();
    let order = family_order(&families);
    assemble(&groups, &order, &families)
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
fn assemble(
    keys: &[(Group, u64)],
    family_order: &[String],
    families: &HashMap<String, Family>,
) -> Grouping {
    let rank: HashMap<&str, usize> = family_order
        .iter()
        .enumerate()
        .map(|(i, f)| (f.as_str(), i))
        .collect();
    // A sub-model's non-block group goes right before its first family.
    let mut submodel_rank: HashMap<&str, usize> = HashMap::new();
    for (name, fam) in families {
        let r = rank.get(name.as_str()).copied().unwrap_or(usize::MAX);
        let entry = submodel_rank.entry(first_segment(&fam.prefix)).or_insert(r);
        *entry = (*entry).min(r);
    }
    // Sort key of a group: the non-block group of no sub-model first, then by family rank, a
    // sub-model's non-block group before its families, blocks by number.
    let group_sort = |g: &Group| match g {
        Group::Other(None) => (0, 0, None),
        Group::Other(Some(seg)) => {
            let r = submodel_rank
                .get(seg.as_str())
                .copied()
                .unwrap_or(usize::MAX);
            (r.saturating_add(1), 0, None)
        }
        Group::Block(k) => {
            let r = rank.get(k.family.as_str()).copied().unwrap_or(usize::MAX);
            (r.saturating_add(1), 1, k.number)
        }
    };
    let mut distinct: Vec<&Group> = keys.iter().map(|(g, _)| g).collect();
    distinct.sort_by_key(|g| group_sort(g));
    distinct.dedup();
    let index: HashMap<&Group, usize> = distinct.iter().enumerate().map(|(i, g)| (*g, i)).collect();
    let mut blocks: Vec<BlockInfo> = distinct.iter().map(|g| empty_block(g)).collect();
    let mut assignment = Vec::with_capacity(keys.len());
    for (group, bytes) in keys {
        let b = index.get(group).copied().unwrap_or(0);
        if let Some(block) = blocks.get_mut(b) {
            block.tensors += 1;
            block.bytes = block.bytes.saturating_add(*bytes);
        }
        assignment.push(b);
    }
    Grouping { blocks, assignment }
}

fn empty_block(group: &Group) -> BlockInfo {
    let (name, family, number) = match group {
        Group::Block(k) => (k.name(), Some(k.family.clone()), k.number),
        Group::Other(None) => (OTHER_BLOCK.to_string(), None, None),
        Group::Other(Some(seg)) => (format!("{seg}.{OTHER_BLOCK}"), None, None),
    };
    BlockInfo {
        name,
        family,
        number,
        tensors: 0,
        bytes: 0,
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
    fn ldm_vae_stages_and_openclip_blocks() {
        let table: &[(&str, Option<&str>)] = &[
            (
                "first_stage_model.encoder.down.2.block.1.conv1.weight",
                Some("first_stage_model.encoder.down.2"),
            ),
            (
                "first_stage_model.encoder.mid.attn_1.q.weight",
                Some("first_stage_model.encoder.mid"),
            ),
            (
                "first_stage_model.decoder.mid.block_2.conv2.weight",
                Some("first_stage_model.decoder.mid"),
            ),
            ("decoder.up.3.upsample.conv.weight", Some("decoder.up.3")),
            ("first_stage_model.quant_conv.weight", None),
            ("first_stage_model.decoder.conv_in.weight", None),
            // The stage words mean nothing outside an encoder or decoder.
            ("mid.block_1.w", None),
            ("down.0.w", None),
            ("transformer.up.0.w", None),
            // SDXL's second text encoder (OpenCLIP).
            (
                "conditioner.embedders.1.model.transformer.resblocks.31.mlp.c_fc.weight",
                Some("conditioner.embedders.1.model.transformer.resblocks.31"),
            ),
        ];
        for (name, want) in table {
            assert_eq!(display(name).as_deref(), *want, "{name}");
        }
        let got = names_of(&[
            "decoder.up.0.w",
            "decoder.mid.w",
            "encoder.mid.w",
            "encoder.down.1.w",
            "encoder.down.0.w",
        ]);
        assert_eq!(
            got,
            [
                "encoder.down.0",
                "encoder.down.1",
                "encoder.mid",
                "decoder.mid",
                "decoder.up.0"
            ]
        );
    }

    #[test]
    fn an_all_in_one_checkpoint_has_one_non_block_group_per_sub_model() {
        // SD1.5's layout, in name order as writers store it.
        let got = names_of(&[
            "cond_stage_model.logit_scale",
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
            "cond_stage_model.transformer.text_model.encoder.layers.0.w",
            "cond_stage_model.transformer.text_model.final_layer_norm.weight",
            "first_stage_model.decoder.conv_in.weight",
            "first_stage_model.decoder.up.0.w",
            "first_stage_model.encoder.down.0.w",
            "first_stage_model.quant_conv.weight",
            "model.diffusion_model.input_blocks.0.0.weight",
            "model.diffusion_model.out.2.weight",
            "model.diffusion_model.time_embed.0.weight",
            "model_ema.decay",
        ]);
        assert_eq!(
            got,
            [
                "(other)",
                "cond_stage_model.(other)",
                "cond_stage_model.transformer.text_model.encoder.layers.0",
                "first_stage_model.(other)",
                "first_stage_model.encoder.down.0",
                "first_stage_model.decoder.up.0",
                "model.(other)",
                "model.diffusion_model.input_blocks.0",
            ]
        );
        // One model (prefixed or not) keeps the single non-block group.
        let got = names_of(&[
            "model.diffusion_model.blocks.0.w",
            "model.diffusion_model.head.w",
            "model.diffusion_model.patch_embedding.w",
        ]);
        assert_eq!(got, ["(other)", "model.diffusion_model.blocks.0"]);
        let got = names_of(&["img_in.w", "double_blocks.0.w", "final_layer.w"]);
        assert_eq!(got, ["(other)", "double_blocks.0"]);
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
