//! Staging ("bounce") buffers and the leases that pass them between threads.
//!
//! A [`StagingPool`] owns a fixed set of page-aligned buffers: pinned host memory when the
//! destination is a GPU (the copy engine reads pinned memory directly, so host-to-device copies
//! run asynchronously at full link speed), anonymous mappings when it is host memory.
//!
//! Each buffer is handed out as exactly one [`Lease`]. A lease is the right to use its buffer:
//! the pipeline moves it from the free list to a reader thread (which fills it), to the copier
//! (which submits it to the destination), and back to the free list once the destination has
//! finished reading it. Because a buffer's only lease is moved, never cloned, no two threads ever
//! touch a buffer at once; and because leases borrow the pool, the pool cannot be dropped while a
//! lease exists.

use std::marker::PhantomData;
use std::ptr::NonNull;

use memmap2::MmapMut;

use crate::plan::IO_ALIGN;

/// A staging allocation failed.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    #[error("cannot allocate {count} staging buffers of {len} bytes: {reason}")]
    Alloc {
        count: usize,
        len: usize,
        reason: String,
    },
}

/// Memory behind a pool's buffers; frees it when dropped.
pub trait Backing: Send {
    /// Start address of buffer `i` (aligned to [`IO_ALIGN`], valid for the pool's buffer length).
    fn ptr(&mut self, i: usize) -> NonNull<u8>;
}

/// Anonymous mappings: page-aligned, returned to the OS when dropped.
struct Mapped(Vec<MmapMut>);

impl Backing for Mapped {
    fn ptr(&mut self, i: usize) -> NonNull<u8> {
        NonNull::new(self.0[i].as_mut_ptr()).unwrap_or(NonNull::dangling())
    }
}

/// A fixed set of equally sized, aligned buffers.
pub struct StagingPool {
    backing: Box<dyn Backing>,
    count: usize,
    len: usize,
}

impl std::fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingPool")
            .field("count", &self.count)
            .field("len", &self.len)
            .finish()
    }
}

impl StagingPool {
    /// `count` buffers of `len` bytes in ordinary (pageable) anonymous memory.
    pub fn host(count: usize, len: usize) -> Result<StagingPool, StagingError> {
        let maps = (0..count)
            .map(|_| MmapMut::map_anon(len.max(1)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StagingError::Alloc {
                count,
                len,
                reason: e.to_string(),
            })?;
        Ok(StagingPool::with_backing(
            Box::new(Mapped(maps)),
            count,
            len,
        ))
    }

    /// A pool over memory someone else allocated (pinned memory, see [`crate::cuda`]).
    pub fn with_backing(backing: Box<dyn Backing>, count: usize, len: usize) -> StagingPool {
        StagingPool {
            backing,
            count,
            len,
        }
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes per buffer.
    pub fn buffer_len(&self) -> usize {
        self.len
    }

    /// One lease per buffer. The pool stays borrowed until every lease is dropped.
    pub fn leases(&mut self) -> Vec<Lease<'_>> {
        (0..self.count)
            .map(|id| {
                let ptr = self.backing.ptr(id);
                debug_assert_eq!(ptr.as_ptr() as usize % IO_ALIGN as usize, 0);
                Lease {
                    id,
                    ptr,
                    len: self.len,
                    _pool: PhantomData,
                }
            })
            .collect()
    }
}

/// The exclusive right to one staging buffer (see the module docs).
pub struct Lease<'pool> {
    id: usize,
    ptr: NonNull<u8>,
    len: usize,
    _pool: PhantomData<&'pool mut [u8]>,
}

// SAFETY: a lease is the only handle to its buffer (leases are created once per buffer and never
// cloned), so moving it to another thread moves sole access with it.
unsafe impl Send for Lease<'_> {}

impl std::fmt::Debug for Lease<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("id", &self.id).finish()
    }
}

impl Lease<'_> {
    /// Which buffer of the pool this is.
    pub fn id(&self) -> usize {
        self.id
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the buffer is valid for `len` bytes while the pool lives (the lease borrows it)
        // and only this lease accesses it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only live view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_pool_gives_one_aligned_distinct_lease_per_buffer() {
        let mut pool = StagingPool::host(3, 2 * IO_ALIGN as usize).unwrap();
        let mut leases = pool.leases();
        assert_eq!(leases.len(), 3);
        for (i, lease) in leases.iter_mut().enumerate() {
            assert_eq!(lease.id(), i);
            assert_eq!(lease.bytes().as_ptr() as usize % IO_ALIGN as usize, 0);
            lease.bytes_mut().fill(i as u8 + 1);
        }
        for (i, lease) in leases.iter().enumerate() {
            assert!(
                lease.bytes().iter().all(|&b| b == i as u8 + 1),
                "buffers overlap"
            );
        }
    }
}
