//! Byte planes: the split of whole elements into one plane per byte of the element, and the
//! merge back.
//!
//! Plane `i` holds byte `i` (little-endian) of every element, after an optional rotation of the
//! element left by one bit, which moves the sign bit to bit 0 so that the top byte of a bf16 or
//! fp32 element is its exponent alone. `merge` undoes exactly what `split` does, for any bytes.
//!
//! Written by hand: a transposition of 2 or 4 byte lanes is a few lines that the compiler
//! vectorises, and no crate does it with the rotation fused in.

use super::PlaneLayout;

/// Splits `body` (whole elements of `layout`) into `layout.width()` planes laid end to end in
/// `planes`, which must be as long as `body`; plane `i` is `planes[i * n..(i + 1) * n]` with `n`
/// the number of elements.
pub(crate) fn split(layout: PlaneLayout, body: &[u8], planes: &mut [u8]) {
    debug_assert_eq!(body.len(), planes.len());
    debug_assert_eq!(body.len() % layout.width(), 0);
    let n = body.len() / layout.width();
    match (layout.width(), layout.rotate_sign()) {
        (2, rotate) => {
            let (p0, p1) = planes.split_at_mut(n);
            for ((e, a), b) in body.chunks_exact(2).zip(p0).zip(p1) {
                let mut v = u16::from_le_bytes([e[0], e[1]]);
                if rotate {
                    v = v.rotate_left(1);
                }
                let [lo, hi] = v.to_le_bytes();
                *a = lo;
                *b = hi;
            }
        }
        (4, rotate) => {
            let (p0, rest) = planes.split_at_mut(n);
            let (p1, rest) = rest.split_at_mut(n);
            let (p2, p3) = rest.split_at_mut(n);
            for ((((e, a), b), c), d) in body.chunks_exact(4).zip(p0).zip(p1).zip(p2).zip(p3) {
                let mut v = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
                if rotate {
                    v = v.rotate_left(1);
                }
                let [b0, b1, b2, b3] = v.to_le_bytes();
                *a = b0;
                *b = b1;
                *c = b2;
                *d = b3;
            }
        }
        _ => planes.copy_from_slice(body),
    }
}

/// Merges `layout.width()` planes, each as long as the number of elements, back into `out`
/// (`width × n` bytes): the inverse of [`split`].
pub(crate) fn merge(layout: PlaneLayout, planes: &[&[u8]], out: &mut [u8]) {
    debug_assert_eq!(planes.len(), layout.width());
    debug_assert!(planes.iter().all(|p| p.len() * layout.width() == out.len()));
    match (layout.width(), layout.rotate_sign(), planes) {
        (2, rotate, [p0, p1]) => {
            for ((e, &a), &b) in out.chunks_exact_mut(2).zip(*p0).zip(*p1) {
                let mut v = u16::from_le_bytes([a, b]);
                if rotate {
                    v = v.rotate_right(1);
                }
                e.copy_from_slice(&v.to_le_bytes());
            }
        }
        (4, rotate, [p0, p1, p2, p3]) => {
            for ((((e, &a), &b), &c), &d) in
                out.chunks_exact_mut(4).zip(*p0).zip(*p1).zip(*p2).zip(*p3)
            {
                let mut v = u32::from_le_bytes([a, b, c, d]);
                if rotate {
                    v = v.rotate_right(1);
                }
                e.copy_from_slice(&v.to_le_bytes());
            }
        }
        (_, _, [p0]) => out.copy_from_slice(p0),
        _ => {}
    }
}
