//! A memory budget for one piece of untrusted work: [`run_bounded`] runs a closure on its own thread, and the
//! global allocator [`BudgetAlloc`] stops that thread the moment its live allocations would pass the budget.
//!
//! Why an allocator: a chat template comes from the model file, and a few instructions of Jinja can double a
//! string forty times (`{% set ns.s = ns.s ~ ns.s %}` in a loop) or ask a filter for a terabyte in one call. The
//! template engine's fuel counts instructions, not bytes, and it offers no hook between its operations; Rust's
//! `Vec`/`String` abort the process when an allocation fails. The allocator is the one place that sees every byte
//! before it is committed, whatever operation asked for it.
//!
//! Why a thread that is parked rather than an error: an allocator cannot fail softly (returning null aborts the
//! process, and unwinding out of it is undefined behaviour), so a thread that passes its budget is never
//! resumed. It sleeps forever holding what it had (at most the budget); [`run_bounded`] returns
//! [`Bounded::OverBudget`] to its caller at once. The same happens, at its next allocation, to a thread that ran
//! past its time limit. Callers therefore give up on the work for good (a chat template that blew its budget once
//! is not tried again), so each kind of work leaks at most one budget.
//!
//! It lives in this crate because implementing [`GlobalAlloc`] takes `unsafe`, and this crate is where the
//! project's `unsafe` is kept and reviewed. Only the binary (and test or fuzz harnesses that want the bound)
//! install it; without it [`run_bounded`] still runs the work on a thread with the time limit, and says the memory
//! was not bounded ([`budget_enforced`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The system allocator, plus a per-thread budget for threads that [`run_bounded`] started.
///
/// Install it in a binary with `#[global_allocator] static ALLOC: BudgetAlloc = BudgetAlloc;`. Threads without a
/// budget pay one thread-local read per allocation.
pub struct BudgetAlloc;

/// What the bounded thread shares with the caller waiting for it.
struct Shared {
    /// The work finished and its result is in `result`.
    done: AtomicBool,
    /// The thread passed its budget (or was abandoned) and is parked for good.
    tripped: AtomicBool,
    /// The caller stopped waiting (time limit): the next allocation parks the thread.
    abandoned: AtomicBool,
    /// The caller, to wake when `done` or `tripped` changes.
    waiter: Thread,
}

thread_local! {
    /// Bytes this thread may hold; 0 = no budget (every thread but those `run_bounded` starts).
    static LIMIT: Cell<usize> = const { Cell::new(0) };
    /// Bytes allocated minus bytes freed by this thread since its budget began (negative when it frees what was
    /// allocated before).
    static USED: Cell<isize> = const { Cell::new(0) };
    /// The bounded thread's link to its caller (valid while the budget is on: the thread owns an `Arc` of it).
    static SHARED: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
}

/// Accounts `delta` bytes on this thread; on a thread past its budget (or abandoned) this never returns.
#[inline]
fn account(delta: isize) {
    let limit = LIMIT.with(Cell::get);
    if limit == 0 {
        return;
    }
    let used = USED.with(|u| {
        let v = u.get().saturating_add(delta);
        u.set(v);
        v
    });
    let shared = SHARED.with(Cell::get);
    // SAFETY: `SHARED` is set only by `run_bounded`'s thread, which holds an `Arc<Shared>` for as long as its budget
    // is on (the budget is switched off before that `Arc` is dropped), so the pointer is live here.
    let abandoned = !shared.is_null() && unsafe { &*shared }.abandoned.load(Ordering::Relaxed);
    // A panicking thread is let through: its hook takes process-wide locks (stderr, the backtrace symbolizer,
    // whose debug-info buffers alone can pass a small budget), and a thread parked holding them would block every
    // other thread's panic message for good.
    if (used > isize::try_from(limit).unwrap_or(isize::MAX) || abandoned) && !std::thread::panicking() {
        trip(shared);
    }
}

/// Parks the current (bounded) thread forever, after telling its caller. Allocates nothing.
#[cold]
fn trip(shared: *const Shared) -> ! {
    LIMIT.with(|l| l.set(0));
    if !shared.is_null() {
        // SAFETY: as in `account`: the thread's own `Arc<Shared>` is never dropped, since this thread never resumes.
        let s = unsafe { &*shared };
        s.tripped.store(true, Ordering::SeqCst);
        s.waiter.unpark();
    }
    loop {
        std::thread::park();
    }
}

fn delta(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to `System` with the caller's own arguments, so `System`'s guarantees carry over;
// the accounting before each call only reads and writes this thread's own counters and never allocates.
unsafe impl GlobalAlloc for BudgetAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        account(delta(layout.size()));
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        account(delta(layout.size()));
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if LIMIT.with(Cell::get) != 0 {
            USED.with(|u| u.set(u.get().saturating_sub(delta(layout.size()))));
        }
        // SAFETY: forwarded unchanged; the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        account(delta(new_size).saturating_sub(delta(layout.size())));
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// How bounded work ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Bounded<T> {
    /// It finished within its limits.
    Done(T),
    /// It asked for more memory than its budget; its thread was stopped.
    OverBudget { budget: usize },
    /// It ran longer than its time limit; its thread is stopped at its next allocation.
    TimedOut { limit: Duration },
    /// It panicked (the panic message went to stderr as usual).
    Panicked,
    /// The operating system would not start a thread.
    NoThread(String),
}

/// Whether [`BudgetAlloc`] is the global allocator, so that [`run_bounded`]'s memory budget is enforced. (Probed
/// once: a budget is switched on for this thread around one small allocation, and the counter must move.)
pub fn budget_enforced() -> bool {
    static ENFORCED: OnceLock<bool> = OnceLock::new();
    *ENFORCED.get_or_init(|| {
        let before = (LIMIT.with(Cell::get), USED.with(Cell::get));
        LIMIT.with(|l| l.set(isize::MAX as usize));
        USED.with(|u| u.set(0));
        let probe = std::hint::black_box(Box::new(0u64));
        let moved = USED.with(Cell::get) != 0;
        drop(probe);
        LIMIT.with(|l| l.set(before.0));
        USED.with(|u| u.set(before.1));
        moved
    })
}

/// Runs `work` on a new thread that may hold at most `budget` bytes (when [`BudgetAlloc`] is installed) and must
/// finish within `time_limit`. See the module documentation for what happens to a thread that does not.
pub fn run_bounded<T, F>(budget: usize, time_limit: Duration, work: F) -> Bounded<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let shared = Arc::new(Shared {
        done: AtomicBool::new(false),
        tripped: AtomicBool::new(false),
        abandoned: AtomicBool::new(false),
        waiter: std::thread::current(),
    });
    let slot: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
    let (their_shared, their_slot) = (shared.clone(), slot.clone());
    let spawned = std::thread::Builder::new().name("infer-bounded".into()).spawn(move || {
        SHARED.with(|s| s.set(Arc::as_ptr(&their_shared)));
        USED.with(|u| u.set(0));
        LIMIT.with(|l| l.set(budget.max(1)));
        // A panic ends the work like a result does (with none), so the caller does not wait for the time limit.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        if let (Ok(out), Ok(mut r)) = (out, their_slot.lock()) {
            *r = Some(out);
        }
        LIMIT.with(|l| l.set(0));
        SHARED.with(|s| s.set(std::ptr::null()));
        their_shared.done.store(true, Ordering::SeqCst);
        their_shared.waiter.unpark();
    });
    if let Err(e) = spawned {
        return Bounded::NoThread(e.to_string());
    }
    let start = Instant::now();
    loop {
        if shared.done.load(Ordering::SeqCst) {
            let out = slot.lock().ok().and_then(|mut r| r.take());
            return match out {
                Some(v) => Bounded::Done(v),
                None => Bounded::Panicked,
            };
        }
        if shared.tripped.load(Ordering::SeqCst) {
            return Bounded::OverBudget { budget };
        }
        let elapsed = start.elapsed();
        if elapsed >= time_limit {
            shared.abandoned.store(true, Ordering::SeqCst);
            return Bounded::TimedOut { limit: time_limit };
        }
        std::thread::park_timeout(time_limit - elapsed);
    }
}
