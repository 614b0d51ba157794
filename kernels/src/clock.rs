//! The process's CPU time, for timelines that must make sense on a busy machine: wall time there includes waiting
//! for a core, CPU time only the work done (all threads together).

use std::time::Duration;

/// CPU time used so far by all of this process's threads, living and finished (`None` where the platform has no
/// such clock).
pub fn process_cpu_time() -> Option<Duration> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `clock_gettime` writes one `timespec` through a valid, exclusive pointer to a live local.
        let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0;
        ok.then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
    #[cfg(not(unix))]
    {
        None
    }
}
