use proptest::prelude::*;

use super::*;
use crate::weights::{WeightDtype, WeightGen};

fn layouts() -> [PlaneLayout; 5] {
    [
        PlaneLayout::BYTES,
        PlaneLayout::BF16,
        PlaneLayout::F16,
        PlaneLayout::F32,
        PlaneLayout::new(2, false).unwrap_or(PlaneLayout::BYTES),
    ]
}

fn codec() -> (Encoder, Decoder) {
    (
        Encoder::new(CompressConfig::default()).unwrap(),
        Decoder::new().unwrap(),
    )
}

/// Encodes a frame whatever it saves, decodes it and checks the bytes; returns the frame.
fn round_trip(
    enc: &mut Encoder,
    dec: &mut Decoder,
    layout: PlaneLayout,
    phase: usize,
    data: &[u8],
) -> Vec<u8> {
    let mut frame = Vec::new();
    let len = enc.encode_frame(layout, phase, data, &mut frame).unwrap();
    assert_eq!(len, frame.len());
    let info = FrameInfo::parse(&frame).unwrap();
    assert_eq!(info.raw_len, data.len());
    let mut out = vec![0xA5u8; data.len()];
    dec.decode(&frame, &mut out).unwrap();
    assert!(
        out == data,
        "layout {layout:?} phase {phase} len {}",
        data.len()
    );
    frame
}

fn weights(dtype: WeightDtype, bytes: usize, seed: u64) -> Vec<u8> {
    WeightGen::new(seed).tensors(dtype, bytes, 1 << 16)
}

const SIZES: [usize; 14] = [0, 1, 2, 3, 4, 5, 7, 13, 31, 101, 1021, 4099, 65537, 262147];

#[test]
fn every_dtype_round_trips_bit_exact_at_odd_sizes_and_phases() {
    let (mut enc, mut dec) = codec();
    for dtype in WeightDtype::ALL {
        let data = weights(dtype, 262147, 1);
        let own = PlaneLayout::for_dtype(dtype.safetensors_name());
        for layout in layouts().into_iter().chain([own]) {
            for &size in &SIZES {
                for phase in 0..layout.width() {
                    round_trip(&mut enc, &mut dec, layout, phase, &data[..size]);
                }
            }
        }
    }
}

#[test]
fn special_values_round_trip() {
    // NaN payloads, infinities, signed zeros, subnormals: bytes, not values.
    let (mut enc, mut dec) = codec();
    let mut data = Vec::new();
    for v in [
        0x7FC0_0001u32,
        0xFF80_0000,
        0x8000_0000,
        0x0000_0001,
        0x7F7F_FFFF,
        0xFFFF_FFFF,
    ] {
        for _ in 0..997 {
            data.extend_from_slice(&v.to_le_bytes());
        }
    }
    for layout in layouts() {
        for phase in 0..4 {
            round_trip(&mut enc, &mut dec, layout, phase, &data);
        }
    }
}

#[test]
fn layouts_follow_the_dtype_names() {
    assert_eq!(PlaneLayout::for_dtype("BF16"), PlaneLayout::BF16);
    assert_eq!(PlaneLayout::for_dtype("bf16"), PlaneLayout::BF16);
    assert_eq!(PlaneLayout::for_dtype("F16"), PlaneLayout::F16);
    assert_eq!(PlaneLayout::for_dtype("F32"), PlaneLayout::F32);
    for other in ["F8_E4M3", "F8_E5M2", "I8", "U8", "Q4_K", "F64", ""] {
        assert_eq!(PlaneLayout::for_dtype(other), PlaneLayout::BYTES);
    }
    assert_eq!(PlaneLayout::new(3, false), None);
    assert_eq!(PlaneLayout::new(1, true), None);
    assert_eq!(PlaneLayout::BF16.lead(0), 0);
    assert_eq!(PlaneLayout::BF16.lead(1), 1);
    assert_eq!(PlaneLayout::F32.lead(1), 3);
    assert_eq!(PlaneLayout::F32.lead(6), 2);
}

#[test]
fn bf16_weights_compress_below_the_goal_and_fp32_and_fp8_gain() {
    let (mut enc, mut dec) = codec();
    for (dtype, most) in [
        (WeightDtype::BF16, 0.72),
        (WeightDtype::F16, 0.90),
        (WeightDtype::F32, 0.90),
        (WeightDtype::F8E5M2, 0.80),
    ] {
        let data = weights(dtype, 4 << 20, 2);
        let layout = PlaneLayout::for_dtype(dtype.safetensors_name());
        let mut frame = Vec::new();
        let got = enc.encode(layout, 0, &data, &mut frame).unwrap();
        let Encoded::Frame(len) = got else {
            panic!("{dtype:?} kept raw")
        };
        let ratio = len as f64 / data.len() as f64;
        assert!(ratio <= most, "{dtype:?}: {ratio}");
        let mut out = vec![0u8; data.len()];
        dec.decode(&frame, &mut out).unwrap();
        assert!(out == data);
    }
}

#[test]
fn random_bytes_are_not_worth_it() {
    let (mut enc, _) = codec();
    // fp32 mantissa bytes of many tensors are close to random; take them as random bytes.
    let data: Vec<u8> = weights(WeightDtype::F32, 1 << 20, 9)
        .chunks_exact(4)
        .flat_map(|c| [c[0], c[1]])
        .collect();
    let mut frame = vec![1, 2, 3];
    for layout in layouts() {
        assert_eq!(
            enc.encode(layout, 0, &data, &mut frame).unwrap(),
            Encoded::Raw
        );
        assert!(frame.is_empty());
    }
    // Tiny chunks never pay for the header.
    assert_eq!(
        enc.encode(PlaneLayout::BF16, 0, &[0; 40], &mut frame)
            .unwrap(),
        Encoded::Raw
    );
    assert_eq!(
        enc.encode(PlaneLayout::BF16, 0, &[], &mut frame).unwrap(),
        Encoded::Raw
    );
}

#[test]
fn the_margin_is_the_configured_one() {
    let cfg = CompressConfig::default();
    assert!(cfg.worth_it(95, 100));
    assert!(!cfg.worth_it(96, 100));
    let none = CompressConfig {
        min_saving_percent: 0,
        ..cfg
    };
    assert!(none.worth_it(99, 100));
    assert!(!none.worth_it(100, 100));
    assert!(!none.worth_it(0, 0));
}

fn sample_frame() -> (Vec<u8>, Vec<u8>) {
    let (mut enc, mut dec) = codec();
    let mut data = weights(WeightDtype::BF16, 20001, 5);
    data.extend_from_slice(&weights(WeightDtype::F32, 3001, 6));
    let frame = round_trip(&mut enc, &mut dec, PlaneLayout::BF16, 1, &data);
    (data, frame)
}

#[test]
fn every_truncation_is_an_error() {
    let (data, frame) = sample_frame();
    let mut dec = Decoder::new().unwrap();
    let mut out = vec![0u8; data.len()];
    for cut in 0..frame.len() {
        assert!(dec.decode(&frame[..cut], &mut out).is_err(), "cut at {cut}");
    }
    let mut longer = frame.clone();
    longer.push(0);
    assert!(matches!(
        dec.decode(&longer, &mut out),
        Err(CompressError::Corrupt(_))
    ));
}

#[test]
fn every_flipped_bit_of_the_header_and_sampled_bits_of_the_planes_are_errors() {
    let (data, frame) = sample_frame();
    let mut dec = Decoder::new().unwrap();
    let mut out = vec![0u8; data.len()];
    let payload: Vec<usize> = (HEADER_BYTES..frame.len()).step_by(7).collect();
    for byte in (0..HEADER_BYTES).chain(payload) {
        for bit in 0..8 {
            let mut bad = frame.clone();
            bad[byte] ^= 1 << bit;
            let r = dec.decode(&bad, &mut out);
            assert!(r.is_err(), "byte {byte} bit {bit}");
        }
    }
    // The decoder still works after errors.
    dec.decode(&frame, &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn header_errors_name_the_cause() {
    let (data, frame) = sample_frame();
    let mut dec = Decoder::new().unwrap();
    let mut out = vec![0u8; data.len()];
    let mut bad = frame.clone();
    bad[0] = b'x';
    assert!(matches!(
        dec.decode(&bad, &mut out),
        Err(CompressError::BadMagic)
    ));
    let mut bad = frame.clone();
    bad[4] = 2;
    assert!(matches!(
        dec.decode(&bad, &mut out),
        Err(CompressError::Version(2))
    ));
    let mut bad = frame.clone();
    bad[24] ^= 1;
    assert!(matches!(
        dec.decode(&bad, &mut out),
        Err(CompressError::Checksum)
    ));
    let mut short = vec![0u8; data.len() - 1];
    assert!(matches!(
        dec.decode(&frame, &mut short),
        Err(CompressError::OutputSize { .. })
    ));
    assert!(matches!(
        dec.decode(&[], &mut out),
        Err(CompressError::Truncated(_))
    ));
}

#[test]
fn a_plane_that_decodes_to_the_wrong_length_is_an_error() {
    // A valid zstd frame of the wrong length in place of a coded plane, header adjusted.
    let (data, frame) = sample_frame();
    let info = FrameInfo::parse(&frame).unwrap();
    let coded = info
        .planes()
        .iter()
        .position(|p| p.0 == PlaneMode::Zstd)
        .unwrap();
    let short = zstd::bulk::compress(&vec![0u8; info.elements - 1], 1).unwrap();
    let mut bad = frame[..HEADER_BYTES + info.lead].to_vec();
    for (i, &(mode, len)) in info.planes().iter().enumerate() {
        let start =
            HEADER_BYTES + info.lead + info.planes()[..i].iter().map(|p| p.1).sum::<usize>();
        if i == coded {
            bad.extend_from_slice(&short);
            bad[32 + 4 * i..36 + 4 * i].copy_from_slice(&(short.len() as u32).to_le_bytes());
        } else {
            assert_eq!(mode, PlaneMode::Raw);
            bad.extend_from_slice(&frame[start..start + len]);
        }
    }
    bad.extend_from_slice(&frame[frame.len() - info.trail..]);
    let mut dec = Decoder::new().unwrap();
    let mut out = vec![0u8; data.len()];
    assert!(matches!(
        dec.decode(&bad, &mut out),
        Err(CompressError::Plane { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_bytes_round_trip(
        data in proptest::collection::vec(any::<u8>(), 0..5000),
        which in 0usize..5,
        phase in 0usize..4,
    ) {
        let (mut enc, mut dec) = codec();
        let layout = layouts()[which];
        round_trip(&mut enc, &mut dec, layout, phase, &data);
        let mut frame = Vec::new();
        if let Encoded::Frame(_) = enc.encode(layout, phase, &data, &mut frame).unwrap() {
            let mut out = vec![0u8; data.len()];
            dec.decode(&frame, &mut out).unwrap();
            prop_assert!(out == data);
        }
    }

    #[test]
    fn normal_weights_round_trip(
        seed in any::<u64>(),
        which in 0usize..5,
        len in 0usize..40000,
        phase in 0usize..4,
    ) {
        let (mut enc, mut dec) = codec();
        let dtype = WeightDtype::ALL[which];
        let data = weights(dtype, len, seed);
        let layout = PlaneLayout::for_dtype(dtype.safetensors_name());
        round_trip(&mut enc, &mut dec, layout, phase, &data);
    }

    #[test]
    fn arbitrary_frames_never_decode_to_unchecked_bytes(
        frame in proptest::collection::vec(any::<u8>(), 0..200),
        len in 0usize..300,
    ) {
        let mut dec = Decoder::new().unwrap();
        let mut out = vec![0u8; len];
        if dec.decode(&frame, &mut out).is_ok() {
            let info = FrameInfo::parse(&frame).unwrap();
            prop_assert_eq!(xxhash_rust::xxh3::xxh3_64(&out), info.checksum);
        }
    }
}
