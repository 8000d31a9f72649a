//! How the binary's allocator (mimalloc) is tuned.
//!
//! Fresh memory is expensive on virtual machines: every page the process touches for the first
//! time is a fault the kernel answers by zeroing it (BENCHMARKS.md has what that cost `verify`
//! on a large dump). mimalloc returns freed pages to the OS
//! after a delay ("purging"), so memory freed between phases (the parsed dump after the model is
//! built, the render after its keys are taken) came back as new faults in the next phase. A
//! kubectl plugin is a short-lived process: keeping freed pages for reuse costs no peak memory
//! and saves those faults.

/// mimalloc's `mi_option_purge_delay`: its position in `mi_option_e` of the mimalloc that
/// `libmimalloc-sys` 0.1.49 builds (`c_src/mimalloc/v3/include/mimalloc.h`), which the bindings do
/// not name. Cargo.toml pins that version exactly, so a new one is read before it is used.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory in the process for reuse instead of returning it to the OS (mimalloc's
/// purge delay −1). Call once at start-up; a no-op for memory when mimalloc is not the global
/// allocator. `MIMALLOC_PURGE_DELAY` in the environment still wins.
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` only stores an integer option; any value is valid for this option.
    #[expect(
        unsafe_code,
        reason = "the one FFI call of the crate: mimalloc's option setter"
    )]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1)
    };
}
