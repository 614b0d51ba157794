//! CPU time, for timelines and probes that must make sense on a busy machine: wall time there includes waiting
//! for a core, CPU time only the work done.

use std::time::Duration;

/// CPU time used so far by all of this process's threads, living and finished (`None` where the platform has no
/// such clock).
pub fn process_cpu_time() -> Option<Duration> {
    cpu_time(
        #[cfg(unix)]
        libc::CLOCK_PROCESS_CPUTIME_ID,
    )
}

/// CPU time used so far by the calling thread (`None` where the platform has no such clock).
pub fn thread_cpu_time() -> Option<Duration> {
    cpu_time(
        #[cfg(unix)]
        libc::CLOCK_THREAD_CPUTIME_ID,
    )
}

#[cfg(unix)]
fn cpu_time(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec` through a valid, exclusive pointer to a live local.
    let ok = unsafe { libc::clock_gettime(clock, &mut ts) } == 0;
    ok.then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(not(unix))]
fn cpu_time() -> Option<Duration> {
    None
}
