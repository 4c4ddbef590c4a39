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

/// Applies `--max-memory <size>` (e.g. `2G`, `512M`): the memory budget of Armoury's readers and model execution
/// for this run (`armoury::limits`); without it the default is half the machine's memory, or
/// `$ARMOURY_MAX_MEMORY`.
#[allow(dead_code)]
pub fn set_max_memory(value: &str) -> Result<(), String> {
    armoury::limits::set_max_memory(armoury::limits::parse_size(value).map_err(|e| e.to_string())?);
    Ok(())
}
