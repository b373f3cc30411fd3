//! The plugin's memory allocator (feature `allocator`, on by default; wasm only): talc,
//! serving allocations from a static arena in the module's initial memory before it
//! grows the linear memory.
//!
//! Why: warden runs every call in a fresh instance. Rust's default wasm allocator grows
//! memory at its first allocation, so every call grew memory once, and the host's
//! instance pool then took the growth back before the next instance: two page-protection
//! changes per call, each a TLB shootdown that interrupts every core running the host,
//! and so every other plugin's call (BENCHMARKS.md, "Isolation"). A call whose live
//! allocations fit in [`ARENA_SIZE`] now leaves memory at its initial size: no protection
//! change at all. Larger calls grow memory as before.
//!
//! This module owns the global allocator of every plugin built with the SDK. It must
//! never allocate while acquiring memory (it is the allocator) and never hand out the
//! arena twice.

use core::alloc::Layout;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

use talc::base::Talc;
use talc::base::binning::Binning;
use talc::source::Source;
use talc::wasm::WasmBinning;

/// Bytes of the static arena served before memory grows. Sized so that a plugin's stack
/// (1 MiB), data and arena stay within the first 2 MiB of memory, which the host's pool
/// resets in place (`MEMORY_KEEP_RESIDENT` in the host's `runtime::pool`); pages past it
/// are handed back to the kernel, another TLB shootdown.
pub const ARENA_SIZE: usize = 640 * 1024;

/// The size of a wasm page.
const PAGE_SIZE: usize = 64 * 1024;

/// Memory for the allocator: first the static arena, then pages grown onto the end of
/// linear memory (extending the previous growth when it is adjacent).
#[derive(Debug)]
pub struct ArenaThenGrow {
    /// The arena, until it is claimed.
    arena: Option<(*mut u8, usize)>,
    /// The end of the heap grown last, to extend it rather than start another.
    grown_end: Option<NonNull<u8>>,
}

// SAFETY: wasm without threads (checked by `TalcSyncCell::new_wasm`); the pointers are
// the allocator's own memory.
unsafe impl Send for ArenaThenGrow {}

impl ArenaThenGrow {
    const fn new(arena: *mut u8, size: usize) -> Self {
        ArenaThenGrow { arena: Some((arena, size)), grown_end: None }
    }
}

/// Pages to grow for `layout`, with room for talc's chunk and heap overhead and the
/// alignment padding (an over-estimate costs at most a page; an under-estimate would make
/// the allocator grow again and again).
fn pages_for(layout: Layout) -> usize {
    let overhead = 4 * core::mem::size_of::<usize>() * 8 + layout.align();
    layout.size().saturating_add(overhead).div_ceil(PAGE_SIZE) + 1
}

// SAFETY: `acquire` never allocates; it claims only the static arena (once) and pages the
// memory just grew by.
unsafe impl Source for ArenaThenGrow {
    fn acquire<B: Binning>(talc: &mut Talc<Self, B>, layout: Layout) -> Result<(), ()> {
        if let Some((base, size)) = talc.source.arena.take() {
            // SAFETY: the arena is a static no one else touches, claimed once.
            if unsafe { talc.claim(base, size) }.is_some() {
                return Ok(());
            }
        }
        let pages = pages_for(layout);
        let previous_pages = grow(pages).ok_or(())?;
        let base = (previous_pages * PAGE_SIZE) as *mut u8;
        // Memory grown to the top of the address space ends at 0 when wrapped: end the heap
        // a chunk short of it instead (as talc's own wasm source saturates), for a claim
        // as for an extension.
        let end = (base as usize).checked_add(pages * PAGE_SIZE).unwrap_or(usize::MAX & !(TOP_GAP - 1));
        let bytes = end - base as usize;
        let end = end as *mut u8;
        if let Some(old_end) = talc.source.grown_end.take() {
            if old_end.as_ptr() == base {
                // SAFETY: `old_end` ends the heap grown last, and the memory after it up
                // to `end` was just grown for this allocator.
                talc.source.grown_end = Some(unsafe { talc.extend(old_end, end) });
                return Ok(());
            }
        }
        // SAFETY: the pages were just grown and belong to no one else.
        talc.source.grown_end = unsafe { talc.claim(base, bytes) };
        talc.source.grown_end.map(|_| ()).ok_or(())
    }
}

/// Bytes left unclaimed at the very top of a 4 GiB memory (talc's chunk alignment).
const TOP_GAP: usize = 16;

/// Grows memory 0 by `pages`; the previous size in pages, or `None` when refused.
fn grow(pages: usize) -> Option<usize> {
    match core::arch::wasm32::memory_grow(0, pages) {
        usize::MAX => None,
        previous => Some(previous),
    }
}

/// The arena's memory: zero pages in the module's initial memory, never touched until
/// allocated from.
struct Arena(core::cell::UnsafeCell<[MaybeUninit<u8>; ARENA_SIZE]>);

// SAFETY: single-threaded wasm; only the allocator touches it.
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena(core::cell::UnsafeCell::new([MaybeUninit::uninit(); ARENA_SIZE]));

#[global_allocator]
static ALLOCATOR: talc::cell::TalcSyncCell<ArenaThenGrow, WasmBinning> =
    talc::cell::TalcSyncCell::new_wasm(ArenaThenGrow::new(ARENA.0.get().cast(), ARENA_SIZE));
