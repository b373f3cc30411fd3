//! The `warden` binary: see [`warden::cli`].

fn main() -> std::process::ExitCode {
    warden::cli::main()
}
