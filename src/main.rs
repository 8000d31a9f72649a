//! The `kubectl-kproxy` binary: parse arguments, run, map the result to exit codes 0/1/2.
fn main() -> std::process::ExitCode {
    kproxy::cli::main()
}
