//! A global allocator that hands a large block back while it is still in cache.
//!
//! A model's forward allocates one output per layer and frees each input as soon as the next layer has read it. With
//! the system allocator a large output lands wherever the allocator finds room — often memory that left every cache
//! long ago, or fresh pages from the kernel — so the kernel writing it pays a miss per line. Hand it the block freed a
//! moment ago instead and the writes hit lines still in L2 or L3 ([`crate::limits::reuse_freed_memory`] keeps freed
//! memory in the process, so pages are not faulted in again; this picks which of it comes back). onnxruntime gets the
//! same from its arena allocator. [`WarmBlocks`] keeps the most recently freed large blocks (≥ [`WarmBlocks::LARGE`]
//! bytes, at most [`WarmBlocks::SLOTS`] of them, a byte limit — 256 MB by default — and each only until
//! [`WarmBlocks::AGE`] more large blocks have been freed after it) and returns the newest one that fits a request —
//! within twice its size, so a small request does not take a big block — before asking the system; smaller blocks and
//! blocks aligned beyond 64 bytes go straight to the system allocator. On most of the zoo's models it makes the forward
//! and the forward + input gradient 2–12% faster (docs/performance.md, twenty-second round).
//!
//! It is opt-in, as every global allocator is: a program declares it once —
//!
//! ```
//! #[global_allocator]
//! static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();
//! ```
//!
//! — and the examples, the benchmarks and the integration tests do. What it costs in memory: the cached blocks (at
//! most the byte limit, and a block nothing asks for only until [`WarmBlocks::AGE`] more have been freed), and in
//! a block in use up to its request's size again (a cached block serves a request of half its size or more; a
//! block shrunk by `realloc` to less than half moves).

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::{Mutex, PoisonError};

/// The allocator: a cache of recently freed large blocks in front of [`System`]. See the module docs.
pub struct WarmBlocks {
    cache: Mutex<Cache>,
    limit: usize,
}

/// Freed blocks, oldest first.
struct Cache {
    blocks: [Block; WarmBlocks::SLOTS],
    len: usize,
    bytes: usize,
    /// Blocks cached so far: a block's age is how many were cached after it.
    clock: u64,
}

impl Cache {
    /// Takes block `i` out, keeping the rest in order.
    fn remove(&mut self, i: usize) -> Block {
        let b = self.blocks[i];
        self.blocks.copy_within(i + 1..self.len, i);
        self.len -= 1;
        self.bytes -= b.cap;
        b
    }

    /// Appends a block as the newest (the caller has made room).
    fn push(&mut self, b: Block) {
        self.blocks[self.len] = b;
        self.len += 1;
        self.bytes += b.cap;
    }
}

/// A cached block: the address given out, its capacity in bytes after the header, and the clock when it came in.
#[derive(Clone, Copy)]
struct Block {
    addr: usize,
    cap: usize,
    freed: u64,
}

/// Bytes before each large block, holding its capacity and its offset in the system's block; the largest
/// alignment served.
const HEADER: usize = 64;

/// The alignment large blocks are asked of the system with: `malloc`'s own on 64-bit targets, so the system
/// serves them with `malloc` and `calloc`.
const BASE_ALIGN: usize = 16;

impl WarmBlocks {
    /// Requests of this many bytes or more go through the cache.
    pub const LARGE: usize = 256 << 10;
    /// At most this many blocks are kept.
    pub const SLOTS: usize = 32;
    /// A cached block is given back to the system once this many more large blocks have been freed after it: a
    /// buffer nothing of its size has asked for since (a file read at start-up) does not stay in the cache.
    pub const AGE: u64 = 64;

    /// An allocator keeping at most 256 MB of freed blocks.
    pub const fn new() -> Self {
        Self::with_limit(256 << 20)
    }

    /// An allocator keeping at most `bytes` of freed blocks; a freed block larger than that goes back to the
    /// system at once.
    pub const fn with_limit(bytes: usize) -> Self {
        WarmBlocks {
            cache: Mutex::new(Cache {
                blocks: [Block { addr: 0, cap: 0, freed: 0 }; Self::SLOTS],
                len: 0,
                bytes: 0,
                clock: 0,
            }),
            limit: bytes,
        }
    }

    /// Bytes held in the cache now.
    pub fn cached_bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // Nothing panics while the lock is held; a poisoned lock still holds a consistent cache.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a block of this layout is one of ours (has a header), decided by the layout alone, as
    /// `dealloc` and `realloc` receive it.
    fn serves(layout: Layout) -> bool {
        layout.size() >= Self::LARGE && layout.align() <= HEADER
    }

    /// The newest cached block with room for `size` bytes and at most twice that, taken out of the cache.
    fn take(&self, size: usize) -> Option<*mut u8> {
        let mut cache = self.lock();
        let len = cache.len;
        let i = cache.blocks[..len].iter().rposition(|b| b.cap >= size && b.cap / 2 <= size)?;
        Some(cache.remove(i).addr as *mut u8)
    }

    /// A fresh block from the system, aligned to 64 by hand behind a header recording its capacity and where the
    /// system's block starts; null when the system has none. Asked for at the system's own alignment (16), so a
    /// zeroed block is `calloc`'s (fresh pages are not written) — at 64, `System` would `posix_memalign` and then
    /// write every byte.
    unsafe fn fresh(&self, size: usize, zeroed: bool) -> *mut u8 {
        let Some(total) = size.checked_add(2 * HEADER) else { return ptr::null_mut() };
        let Ok(layout) = Layout::from_size_align(total, BASE_ALIGN) else { return ptr::null_mut() };
        let base = if zeroed { System.alloc_zeroed(layout) } else { System.alloc(layout) };
        if base.is_null() {
            return base;
        }
        // HEADER ≤ offset < 2·HEADER, so the header lies inside the system's block and `size` bytes fit after it.
        let offset = HEADER + (HEADER - (base as usize + HEADER) % HEADER) % HEADER;
        let block = base.add(offset);
        let header = block.sub(HEADER) as *mut usize;
        header.write(size);
        header.add(1).write(offset);
        block
    }

    /// The capacity recorded in the header of a block of ours.
    unsafe fn capacity(block: *mut u8) -> usize {
        (block.sub(HEADER) as *const usize).read()
    }

    /// Gives a block of ours back to the system.
    unsafe fn release(block: *mut u8, cap: usize) {
        let offset = (block.sub(HEADER) as *const usize).add(1).read();
        // The layout `fresh` allocated it with, which was valid then.
        System.dealloc(block.sub(offset), Layout::from_size_align_unchecked(cap + 2 * HEADER, BASE_ALIGN));
    }
}

impl Drop for WarmBlocks {
    /// Gives the cached blocks back (a `static` allocator is never dropped; one made for a test is).
    fn drop(&mut self) {
        let cache = self.cache.get_mut().unwrap_or_else(PoisonError::into_inner);
        for b in &cache.blocks[..cache.len] {
            // SAFETY: a cached block is ours, given out to nobody, with the capacity it was cached with.
            unsafe { Self::release(b.addr as *mut u8, b.cap) };
        }
        cache.len = 0;
        cache.bytes = 0;
    }
}

impl Default for WarmBlocks {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: large blocks are `System` blocks with a 64-byte header holding their capacity; a block is cached or
// given out, never both (the cache's lock), and is handed out only for a request it has room for, aligned to 64.
unsafe impl GlobalAlloc for WarmBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::serves(layout) {
            return System.alloc(layout);
        }
        match self.take(layout.size()) {
            Some(block) => block,
            None => self.fresh(layout.size(), false),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::serves(layout) {
            return System.alloc_zeroed(layout);
        }
        match self.take(layout.size()) {
            Some(block) => {
                block.write_bytes(0, layout.size());
                block
            }
            // Fresh pages from the system are zero already.
            None => self.fresh(layout.size(), true),
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if !Self::serves(layout) {
            return System.dealloc(block, layout);
        }
        let cap = Self::capacity(block);
        if cap > self.limit {
            return Self::release(block, cap);
        }
        // The oldest blocks make room, and the stale go; they are given back after the lock is released.
        let mut evicted = [Block { addr: 0, cap: 0, freed: 0 }; Self::SLOTS];
        let mut n = 0;
        {
            let mut cache = self.lock();
            cache.clock += 1;
            while cache.len > 0
                && (cache.len == Self::SLOTS
                    || cache.bytes + cap > self.limit
                    || cache.clock - cache.blocks[0].freed >= Self::AGE)
            {
                evicted[n] = cache.remove(0);
                n += 1;
            }
            let freed = cache.clock;
            cache.push(Block { addr: block as usize, cap, freed });
        }
        for b in &evicted[..n] {
            Self::release(b.addr as *mut u8, b.cap);
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else { return ptr::null_mut() };
        if Self::serves(layout) && Self::serves(new_layout) {
            // In place while the block is not more than twice what it holds (the rule a cached block is given by).
            let cap = Self::capacity(block);
            if new_size <= cap && cap / 2 <= new_size {
                return block;
            }
        }
        if !Self::serves(layout) && !Self::serves(new_layout) {
            return System.realloc(block, layout, new_size);
        }
        let moved = self.alloc(new_layout);
        if !moved.is_null() {
            ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
            self.dealloc(block, layout);
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, 8).unwrap()
    }

    #[test]
    fn the_newest_freed_block_that_fits_comes_back_first() {
        let a = WarmBlocks::new();
        let big = WarmBlocks::LARGE;
        unsafe {
            let p = a.alloc(layout(big));
            let q = a.alloc(layout(big));
            let r = a.alloc(layout(3 * big));
            assert!(!p.is_null() && !q.is_null() && !r.is_null());
            a.dealloc(p, layout(big));
            a.dealloc(r, layout(3 * big));
            a.dealloc(q, layout(big));
            assert_eq!(a.cached_bytes(), 5 * big);
            // The newest of the two that fit, not the oldest, and not the 3x block (more than twice the request).
            assert_eq!(a.alloc(layout(big)), q);
            assert_eq!(a.alloc(layout(big)), p);
            let s = a.alloc(layout(big));
            assert!(s != r, "a block more than twice the request was handed out");
            // Within twice the request: the 3x block serves 2x.
            assert_eq!(a.alloc(layout(2 * big)), r);
            assert_eq!(a.cached_bytes(), 0);
            for (b, n) in [(p, big), (q, big), (s, big), (r, 2 * big)] {
                a.dealloc(b, layout(n));
            }
        }
    }

    #[test]
    fn the_cache_holds_at_most_its_limit_and_its_slots() {
        let big = WarmBlocks::LARGE;
        let a = WarmBlocks::with_limit(4 * big);
        unsafe {
            let blocks: Vec<_> = (0..6).map(|_| a.alloc(layout(big))).collect();
            for &b in &blocks {
                a.dealloc(b, layout(big));
            }
            // The four newest stay; the two oldest went back to the system.
            assert_eq!(a.cached_bytes(), 4 * big);
            assert_eq!(a.alloc(layout(big)), blocks[5]);
            assert_eq!(a.alloc(layout(big)), blocks[4]);
            // A block over the limit is never cached.
            let huge = a.alloc(layout(5 * big));
            a.dealloc(huge, layout(5 * big));
            assert_eq!(a.cached_bytes(), 2 * big);
        }
        let a = WarmBlocks::with_limit(usize::MAX / 4);
        unsafe {
            let blocks: Vec<_> = (0..WarmBlocks::SLOTS + 3).map(|_| a.alloc(layout(big))).collect();
            for &b in &blocks {
                a.dealloc(b, layout(big));
            }
            assert_eq!(a.cached_bytes(), WarmBlocks::SLOTS * big);
        }
    }

    #[test]
    fn a_block_nothing_asks_for_goes_back_after_its_age() {
        let big = WarmBlocks::LARGE;
        let a = WarmBlocks::new();
        unsafe {
            let stale = a.alloc(layout(8 * big));
            a.dealloc(stale, layout(8 * big));
            for i in 0..WarmBlocks::AGE - 1 {
                // One block freed and taken again: the cache holds it and the stale one.
                let p = a.alloc(layout(big));
                a.dealloc(p, layout(big));
                assert_eq!(a.cached_bytes(), 9 * big, "after {} frees", i + 1);
            }
            // The AGE-th free after it gives it back.
            let p = a.alloc(layout(big));
            a.dealloc(p, layout(big));
            assert_eq!(a.cached_bytes(), big, "the stale block outlived its age");
            // A block under the threshold never enters the cache, nor ages it.
            let small = a.alloc(layout(WarmBlocks::LARGE - 1));
            a.dealloc(small, layout(WarmBlocks::LARGE - 1));
            assert_eq!(a.cached_bytes(), big);
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_and_reallocation_keeps_the_bytes() {
        let a = WarmBlocks::new();
        let big = WarmBlocks::LARGE;
        unsafe {
            let p = a.alloc(layout(big));
            p.write_bytes(0xAB, big);
            a.dealloc(p, layout(big));
            let z = a.alloc_zeroed(layout(big));
            assert_eq!(z, p, "the freed block is reused");
            assert!(std::slice::from_raw_parts(z, big).iter().all(|&b| b == 0));
            // Growing past the block moves and keeps the bytes; shrinking within it stays in place.
            z.write_bytes(7, big);
            let grown = a.realloc(z, layout(big), 4 * big);
            assert!(std::slice::from_raw_parts(grown, big).iter().all(|&b| b == 7));
            grown.add(big).write_bytes(7, 3 * big);
            assert_eq!(a.realloc(grown, layout(4 * big), 3 * big), grown);
            assert_eq!(a.realloc(grown, layout(3 * big), 4 * big), grown, "the block still has room for 4x");
            // Across the size threshold in both directions (header to none and back).
            let small = a.realloc(grown, layout(4 * big), 1000);
            assert!(std::slice::from_raw_parts(small, 1000).iter().all(|&b| b == 7));
            let again = a.realloc(small, layout(1000), 2 * big);
            assert!(std::slice::from_raw_parts(again, 1000).iter().all(|&b| b == 7));
            a.dealloc(again, layout(2 * big));
            // Shrunk to less than half its capacity, a block moves, so the rest is not held.
            let wide = a.alloc(layout(4 * big));
            wide.write_bytes(9, big);
            let narrow = a.realloc(wide, layout(4 * big), big);
            assert_ne!(narrow, wide);
            assert!(std::slice::from_raw_parts(narrow, big).iter().all(|&b| b == 9));
            a.dealloc(narrow, layout(big));
            // Fresh blocks are 64-aligned, and zeroed ones zero.
            let fresh = WarmBlocks::new();
            for n in 1..6 {
                let z = fresh.alloc_zeroed(layout(n * big + 8));
                assert_eq!(z as usize % 64, 0);
                assert!(std::slice::from_raw_parts(z, n * big + 8).iter().all(|&b| b == 0));
                fresh.dealloc(z, layout(n * big + 8));
            }
            // Over-aligned requests go to the system untouched.
            let wide = Layout::from_size_align(big, 4096).unwrap();
            let w = a.alloc(wide);
            assert_eq!(w as usize % 4096, 0);
            a.dealloc(w, wide);
        }
    }

    #[test]
    fn threads_never_share_a_block() {
        let a = WarmBlocks::with_limit(8 * WarmBlocks::LARGE);
        let big = WarmBlocks::LARGE;
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let a = &a;
                s.spawn(move || unsafe {
                    for i in 0..200 {
                        let n = big + (i % 3) * 4096;
                        let p = a.alloc(layout(n));
                        p.write_bytes(t, n);
                        std::thread::yield_now();
                        assert!(std::slice::from_raw_parts(p, n).iter().all(|&b| b == t));
                        a.dealloc(p, layout(n));
                    }
                });
            }
        });
    }
}
