//! The subcommands of the `mxswitch` binary, one module each, and the one
//! rule they share: a failure is reported as one `error: ...` line on stderr
//! with a non-zero exit status, never a panic or a backtrace.

use std::fmt::Display;
use std::process::ExitCode;

use clap::error::ErrorKind;

pub mod export;
pub mod launch;
pub mod plan;
pub mod quantize;
pub mod train;

/// Exit status of a command that failed on its input or environment.
const EXIT_FAILURE: u8 = 1;
/// Exit status of a command line that did not parse (clap's convention).
const EXIT_USAGE: u8 = 2;

/// What a command that succeeded returns: nothing (exit 0) or its own
/// exit status (an interrupted `train` exits 130).
pub trait Outcome {
    fn exit_code(self) -> ExitCode;
}

impl Outcome for () {
    fn exit_code(self) -> ExitCode {
        ExitCode::SUCCESS
    }
}

impl Outcome for ExitCode {
    fn exit_code(self) -> ExitCode {
        self
    }
}

/// Turn a command's result into the process exit status, printing a failure
/// as one line.
pub fn finish<T: Outcome, E: Display>(result: Result<T, E>) -> ExitCode {
    match result {
        Ok(outcome) => outcome.exit_code(),
        Err(err) => {
            eprintln!("error: {}", single_line(&err.to_string()));
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// Report a command line that clap rejected. Help and version requests print
/// as clap formats them; real errors become one line, without clap's usage
/// block (`--help` shows it).
pub fn report_parse_error(err: clap::Error) -> ExitCode {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Nothing sensible is left to do if stdout is gone.
            let _ = err.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            ExitCode::from(EXIT_USAGE)
        }
        _ => {
            let msg = clap_one_line(&err.render().to_string());
            if msg.starts_with("error:") {
                eprintln!("{msg}");
            } else {
                eprintln!("error: {msg}");
            }
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// clap's rendered error up to its `Usage:` block, joined into one line, e.g.
/// "error: the following required arguments were not provided: --output <OUT.safetensors>".
fn clap_one_line(rendered: &str) -> String {
    rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Keep a message on one line even if a path or a library message in it
/// holds a line break.
fn single_line(msg: &str) -> String {
    msg.replace(['\r', '\n'], " ")
}
