//! The `mxswitch` command line.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("mxswitch: no command yet");
    ExitCode::FAILURE
}
