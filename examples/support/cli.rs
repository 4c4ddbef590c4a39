//! How the examples end: an error is printed as its message, not its debug form, and the exit code is 1.

use std::process::ExitCode;

/// Success for `Ok`; for `Err`, `error: <message>` on standard error and a failure exit code.
pub fn finish(result: Result<(), Box<dyn std::error::Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
