//! The `kubectl-kproxy` binary: parse arguments, run, map the result to exit codes 0/1/2.

/// mimalloc: parsing and graphing a node's dump makes millions of small allocations, which glibc's
/// allocator serves markedly slower (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The commands: private to the binary, so the library (and every layer below it) cannot use
/// them.
mod cli;

// The library's layers, under the names cli/ uses for them (`crate::model::…`).
use kproxy::{
    allocator, apply, collect, compare, exit, fleet, graph, kube_client, model, monitor, output,
    parsers, pipeline, proxier, publish, state, trace,
};

fn main() -> std::process::ExitCode {
    // The long-running commands (`monitor`, `resync --watch`) give freed memory back: their
    // resident size between verifies is what they hold, not the peak of one verify. A value
    // spelled the same (`--node monitor`) only costs that command the faults it would save.
    let long_running = std::env::args_os()
        .skip(1)
        .any(|a| a == "monitor" || a == "--watch");
    if !long_running {
        allocator::keep_freed_memory();
    }
    cli::main()
}
