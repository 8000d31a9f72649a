//! The `kubectl-kproxy` binary: parse arguments, run, map the result to exit codes 0/1/2.

/// mimalloc: parsing and graphing a node's dump makes millions of small allocations, which glibc's
/// allocator serves markedly slower (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    kproxy::allocator::keep_freed_memory();
    kproxy::cli::main()
}
