//! The page two adjacent direct reads share.
//!
//! **Contract.** [`BoundaryPage`] holds at most one whole page of one source file version: the
//! last page of the latest `O_DIRECT` read that ended inside it. A read that starts on that
//! page takes it from here ([`BoundaryPage::take_into`]) and asks the source only for the
//! pages after it. The bytes are the file's own, read by the same version's descriptor, so a
//! page taken is exactly what a read of the source would return.
//!
//! Why: `O_DIRECT` reads whole pages, and chunks end at tensor boundaries, not at page
//! boundaries, so each read of the next chunk would start by reading again the page the last
//! one ended in. Where the source charges per request, that page is a request of its own
//! going back (a seek on a disk, a store's chunk fetched again), once for every chunk read
//! ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)).

use super::DIRECT_IO_ALIGN;
use crate::sync::{lock, Mutex};

const PAGE: usize = DIRECT_IO_ALIGN as usize;

/// The last page of the latest direct read that ended inside it (see the module docs).
#[derive(Default)]
pub(super) struct BoundaryPage {
    page: Mutex<Option<(u64, Box<[u8]>)>>,
}

impl BoundaryPage {
    /// Copies the kept page into `dst` (at least a page long) if it is the page at `offset`;
    /// returns whether it did. The page is given out once: reads of a chunk run forward.
    pub(super) fn take_into(&self, offset: u64, dst: &mut [u8]) -> bool {
        let mut kept = lock(&self.page);
        match kept.as_ref() {
            Some((at, bytes)) if *at == offset && dst.len() >= PAGE && bytes.len() == PAGE => {
                dst[..PAGE].copy_from_slice(bytes);
                *kept = None;
                true
            }
            _ => false,
        }
    }

    /// Keeps the last page of `read`, the bytes a direct read returned from page-aligned
    /// `offset`, when the range the caller asked for (ending at `end`) ends inside it and the
    /// read returned that whole page.
    pub(super) fn keep_last_of(&self, offset: u64, read: &[u8], end: u64) {
        let Some(in_page) = end.checked_rem(DIRECT_IO_ALIGN).filter(|&r| r != 0) else {
            return; // ends on a page boundary: the next read starts on a page of its own
        };
        let page_at = end - in_page;
        let Some(from) = page_at
            .checked_sub(offset)
            .and_then(|f| usize::try_from(f).ok())
        else {
            return;
        };
        let Some(bytes) = from.checked_add(PAGE).and_then(|to| read.get(from..to)) else {
            return; // the read stopped before the page's end (the end of the file)
        };
        *lock(&self.page) = Some((page_at, bytes.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_page_of_a_read_is_given_once_to_the_read_starting_on_it() {
        let read: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8).collect();
        let kept = BoundaryPage::default();
        // a read from page 1 (file offset 4096) of 3 pages, asked to end inside its last page
        kept.keep_last_of(4096, &read, 4096 + 2 * PAGE as u64 + 100);
        let mut dst = vec![0u8; PAGE + 10];
        assert!(!kept.take_into(4096, &mut dst), "another page");
        assert!(
            !kept.take_into(4096 + 2 * PAGE as u64, &mut dst[..PAGE - 1]),
            "too short"
        );
        assert!(kept.take_into(4096 + 2 * PAGE as u64, &mut dst));
        assert_eq!(&dst[..PAGE], &read[2 * PAGE..]);
        assert!(
            !kept.take_into(4096 + 2 * PAGE as u64, &mut dst),
            "given once"
        );
    }

    #[test]
    fn nothing_is_kept_for_a_read_ending_on_a_boundary_or_short_of_its_last_page() {
        let read = vec![7u8; 2 * PAGE];
        let kept = BoundaryPage::default();
        kept.keep_last_of(0, &read, 2 * PAGE as u64);
        assert!(!kept.take_into(PAGE as u64, &mut [0u8; PAGE]));
        assert!(!kept.take_into(2 * PAGE as u64, &mut [0u8; PAGE]));
        // asked to end inside the third page, but the file ended before it
        kept.keep_last_of(0, &read, 2 * PAGE as u64 + 5);
        assert!(!kept.take_into(2 * PAGE as u64, &mut [0u8; PAGE]));
        // an end before the read's start is ignored
        kept.keep_last_of(8 * PAGE as u64, &read, 100);
        assert!(!kept.take_into(0, &mut [0u8; PAGE]));
    }
}
