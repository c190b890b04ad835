//! The compressed RAM tier's codec (`tierfs_core::compress`): arbitrary bytes decoded as a
//! frame, and arbitrary chunks round-tripped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierfs_core::compress::{CompressConfig, Decoder, Encoded, Encoder, FrameInfo, PlaneLayout};
use xxhash_rust::xxh3::xxh3_64;

/// Largest output buffer tried for a frame whose header names a larger original length.
const MAX_OUT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let (Ok(mut enc), Ok(mut dec)) = (Encoder::new(CompressConfig::default()), Decoder::new())
    else {
        return;
    };
    if k & 1 == 0 {
        // A frame: decoding never panics, and never returns Ok with bytes that disagree with
        // the checksum of a header that parses.
        let len = match FrameInfo::parse(rest) {
            Ok(info) if info.raw_len <= MAX_OUT && k & 2 == 0 => info.raw_len,
            _ => usize::from(k >> 2) * 7,
        };
        let mut out = vec![0u8; len];
        if dec.decode(rest, &mut out).is_ok() {
            let info = FrameInfo::parse(rest).expect("a decoded frame's header parses");
            assert_eq!(out.len(), info.raw_len);
            assert_eq!(
                xxh3_64(&out),
                info.checksum,
                "Ok with bytes off their checksum"
            );
        }
        return;
    }
    // A chunk: every layout and phase round-trips bit-exact, whether the frame pays or not.
    let layout = [
        PlaneLayout::BYTES,
        PlaneLayout::BF16,
        PlaneLayout::F16,
        PlaneLayout::F32,
    ][usize::from(k >> 1) & 3];
    let phase = usize::from(k >> 3) & 3;
    let mut frame = Vec::new();
    let len = enc
        .encode_frame(layout, phase, rest, &mut frame)
        .expect("encoding a small chunk succeeds");
    assert_eq!(len, frame.len());
    let mut out = vec![0u8; rest.len()];
    dec.decode(&frame, &mut out).expect("a fresh frame decodes");
    assert!(out == rest, "round trip differs");
    match enc.encode(layout, phase, rest, &mut frame).expect("encode") {
        Encoded::Frame(n) => {
            assert!(n < rest.len() && n == frame.len());
            dec.decode(&frame, &mut out).expect("a kept frame decodes");
            assert!(out == rest);
        }
        Encoded::Raw => assert!(frame.is_empty()),
    }
    // One byte of the frame damaged: an error, or (a bit the format ignores) the same bytes.
    if !frame.is_empty() {
        let at = usize::from(k) * 131 % frame.len();
        frame[at] ^= 1 << (k >> 5);
        if dec.decode(&frame, &mut out).is_ok() {
            assert!(out == rest, "a damaged frame decoded to other bytes");
        }
    }
});
