//! What the process does when a memory-mapped model file shrinks under it.
//!
//! Model files are mapped, not read: a page of the map is fetched from the file when it is first touched. If
//! another program truncates the file while `infer` runs, touching a page past the new end raises SIGBUS, which
//! would kill the process with no word of why. [`exit_on_sigbus`] replaces that with a one-line message on stderr
//! and exit status 1. (The mapped bytes cannot be trusted after such a change, so stopping is the only safe
//! answer; `--no-mmap` reads the file into memory instead, where later changes to it have no effect.)
//!
//! This needs `sigaction`, hence `unsafe`, hence this crate.

use std::sync::OnceLock;

/// The message the handler writes; set once, before the handler is installed, and never freed.
static MESSAGE: OnceLock<Box<[u8]>> = OnceLock::new();

extern "C" fn on_sigbus(_signal: libc::c_int) {
    if let Some(m) = MESSAGE.get() {
        // SAFETY: `write` and `_exit` are async-signal-safe; `m` is a live, never-freed buffer (a set `OnceLock`
        // is never written again), so the pointer and length are valid for the whole call.
        unsafe {
            libc::write(libc::STDERR_FILENO, m.as_ptr().cast(), m.len());
        }
    }
    // SAFETY: `_exit` is async-signal-safe and ends the process without running anything else.
    unsafe { libc::_exit(1) }
}

/// Makes SIGBUS print `message` (a line ending in `\n`) on stderr and exit with status 1. Returns false if the
/// handler could not be installed (or this platform has no SIGBUS).
pub fn exit_on_sigbus(message: &str) -> bool {
    if MESSAGE.set(message.as_bytes().into()).is_err() {
        return true; // installed before
    }
    #[cfg(unix)]
    {
        // SAFETY: a zeroed `sigaction` is a valid empty value (no flags, empty mask); the handler is an
        // `extern "C" fn(c_int)`, the signature `sa_handler` expects, and only calls async-signal-safe functions.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0
        }
    }
    #[cfg(not(unix))]
    {
        false
    }
}
