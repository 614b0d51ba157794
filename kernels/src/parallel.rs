//! Parallel regions with cheap hand-offs: a team of rayon threads that stays together for a whole forward pass.
//!
//! A decode step runs a few hundred short parallel regions (every matmul, every row-wise pass, attention), each
//! tens of microseconds long. A rayon fork/join per region costs a few microseconds: the idle worker sleeps in
//! `sched_yield` between regions, the job travels through a deque, and the joining thread waits on a latch.
//! Measured on SmolLM2 with 16 sequences, a step spent about a tenth of both threads' time there.
//!
//! [`with_team`] instead lends the current rayon pool's other threads to one caller for the duration of a closure.
//! They spin on a shared word between regions, so [`for_each_index`] hands work over by publishing it in one
//! atomic store, and tasks are claimed one by one with a compare-and-swap, so a thread that is late (the machine
//! is shared) only takes fewer tasks. Outside a team, [`for_each_index`] is an ordinary rayon loop.
//!
//! Helpers never wait for each other or for the caller: the caller runs tasks too, so a region completes even when
//! no helper ever arrives (every pool thread busy elsewhere).

use std::any::Any;
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use rayon::prelude::*;

/// Spins (each a `spin_loop` hint, some nanoseconds) before a waiting thread starts yielding its core: long enough
/// to cover the serial gap between two regions, short enough not to starve other work on an oversubscribed machine.
const SPINS_BEFORE_YIELD: u32 = 4_000;

/// One published region: the task body and how many tasks. Lives on the caller's stack while the region runs.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

/// The state shared by a team's caller and helpers.
///
/// `state` packs the region's epoch (high 32 bits) and the next unclaimed task (low 32 bits). A helper reads the
/// epoch, then `job` and `n`, then claims a task with a compare-and-swap that expects the same epoch: success
/// proves the region was still unclaimed-in-part, so the caller had not yet moved on and `job`/`n` were that
/// region's. Only then is the job dereferenced.
struct Team {
    state: AtomicU64,
    job: AtomicUsize,
    n: AtomicUsize,
    done: AtomicUsize,
    stop: AtomicBool,
    /// The first panic of a task in the current region, re-raised by the caller once the region is over.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Set while the caller runs a region, so that a nested [`for_each_index`] inside a task runs serially.
    busy: Cell<bool>,
}

// SAFETY: `busy` is only touched by the team's caller thread (the thread-local below points to the team only there);
// every other field is atomic.
unsafe impl Sync for Team {}

thread_local! {
    /// The team this thread leads, if any.
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with the current rayon pool's other threads spinning as helpers, so that every [`for_each_index`] the
/// calling thread makes inside `f` (directly or through the kernels) is handed over without a fork/join. With one
/// thread, or inside another team, it just calls `f`.
pub fn with_team<R>(f: impl FnOnce() -> R) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0 || !LEADING.get().is_null() {
        return f();
    }
    let team = Team {
        state: AtomicU64::new(0),
        job: AtomicUsize::new(0),
        n: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        panic: Mutex::new(None),
        busy: Cell::new(false),
    };
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            let t = &team;
            scope.spawn(move |_| t.serve());
        }
        /// Clears the thread-local and releases the helpers even if `f` panics, so the scope can end.
        struct Lead<'t>(&'t Team);
        impl Drop for Lead<'_> {
            fn drop(&mut self) {
                LEADING.set(std::ptr::null());
                self.0.stop.store(true, Ordering::Release);
            }
        }
        LEADING.set(&team);
        let _lead = Lead(&team);
        f()
    })
}

/// Runs `f(i)` for every `i` in `0..n`, each exactly once, across the threads: through the team when the calling
/// thread leads one, else as a rayon loop with one index per job.
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync) {
    match n {
        0 => {}
        1 => f(0),
        _ => {
            let team = LEADING.get();
            if team.is_null() {
                (0..n).into_par_iter().with_max_len(1).for_each(&f);
            } else {
                // SAFETY: the pointer was set by `with_team` on this thread and is cleared before the team is dropped.
                unsafe { &*team }.run(n, &f);
            }
        }
    }
}

/// The number of threads a region is spread over: the current rayon pool's.
pub fn threads() -> usize {
    rayon::current_num_threads()
}

impl Team {
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.busy.get() || n >= u32::MAX as usize {
            // A region inside a task of this team's current region: the helpers are busy with the outer one.
            (0..n).for_each(f);
            return;
        }
        self.busy.set(true);
        let job = Job { f };
        self.job.store(&job as *const Job<'_> as usize, Ordering::Relaxed);
        self.n.store(n, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        // Publish: a new epoch with task 0 next. The release orders the stores above before it.
        let epoch = (self.state.load(Ordering::Relaxed) >> 32) + 1;
        self.state.store(epoch << 32, Ordering::Release);
        let mine = self.work();
        // Wait for the helpers' tasks; their increments of `done` release their writes.
        let mut spins = 0u32;
        while self.done.load(Ordering::Acquire) + mine < n {
            // Not `rayon::yield_now`: the job it found could be a helper of this very team, whose loop only ends
            // when this thread stops the team.
            wait(&mut spins, false);
        }
        self.busy.set(false);
        if let Some(payload) = self.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            std::panic::resume_unwind(payload);
        }
    }

    /// Claims and runs tasks of the current region until none is left; returns how many this thread ran.
    fn work(&self) -> usize {
        let mut ran = 0;
        loop {
            let s = self.state.load(Ordering::Acquire);
            let job = self.job.load(Ordering::Relaxed);
            let n = self.n.load(Ordering::Relaxed);
            let i = (s & u32::MAX as u64) as usize;
            if i >= n || job == 0 {
                return ran;
            }
            if self.state.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                // SAFETY: the claim succeeded on the epoch `job` and `n` were read under, so that region is not
                // finished and its caller is still waiting in `run`, with `job` alive on its stack.
                let job = unsafe { &*(job as *const Job<'_>) };
                // A panicking task must still count as done, or the caller would wait forever (and a caller that
                // unwound early would free `job` under the helpers). The first panic is re-raised by the caller.
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.f)(i))) {
                    let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(payload);
                }
                ran += 1;
            }
        }
    }

    /// A helper's life: wait for a region, help with it, report the tasks it ran, until the caller stops the team.
    fn serve(&self) {
        if std::ptr::eq(LEADING.get(), self) {
            // The caller picked up one of its own helper jobs (through some rayon call while it leads): serving its
            // own team would never end, since only the caller stops it.
            return;
        }
        let mut seen = 0u64;
        let mut spins = 0u32;
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let s = self.state.load(Ordering::Acquire);
            if s >> 32 == seen {
                wait(&mut spins, true);
                continue;
            }
            spins = 0;
            seen = s >> 32;
            let ran = self.work();
            if ran > 0 {
                self.done.fetch_add(ran, Ordering::Release);
            }
        }
    }
}

/// One round of waiting: spin first, then (for an idle helper, `help`) run pending rayon work, such as a region
/// not routed through the team, or give the core away.
fn wait(spins: &mut u32, help: bool) {
    if *spins < SPINS_BEFORE_YIELD {
        *spins += 1;
        std::hint::spin_loop();
    } else if !help || rayon::yield_now() != Some(rayon::Yield::Executed) {
        std::thread::yield_now();
    }
}

/// Rows of one or more buffers (borrowed for `'a`), handed to tasks one index at a time: row `i` of every part
/// goes to the same task, and no two tasks get the same `i`, so each may write its rows while others write theirs.
pub trait Rows<'a>: Sync {
    /// What a task gets for one index.
    type Row;
    /// How many rows; `None` for a part that fits any count (an absent [`Option`]).
    fn count(&self) -> Option<usize>;
    /// Row `i`.
    ///
    /// # Safety
    /// `i` < the count, and row `i` may be taken only once.
    unsafe fn row(&self, i: usize) -> Self::Row;
}

/// A mutable slice split into rows of `width` elements for [`for_each_row`].
pub struct Chunks<'a, T> {
    ptr: *mut T,
    width: usize,
    count: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: a `Chunks` is a `&mut [T]` that hands out disjoint pieces (see `Rows::row`); sending or sharing it is
// sending those pieces to other threads, which `T: Send` allows.
unsafe impl<T: Send> Send for Chunks<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Chunks<'_, T> {}

impl<'a, T> Chunks<'a, T> {
    /// `slice` as rows of `width` elements; its length must be a whole number of rows.
    pub fn new(slice: &'a mut [T], width: usize) -> Self {
        assert!(width > 0 && slice.len().is_multiple_of(width), "{} elements are not rows of {width}", slice.len());
        Chunks { ptr: slice.as_mut_ptr(), width, count: slice.len() / width, _borrow: std::marker::PhantomData }
    }
}

impl<'a, T: Send> Rows<'a> for Chunks<'a, T> {
    type Row = &'a mut [T];
    #[inline]
    fn count(&self) -> Option<usize> {
        Some(self.count)
    }
    #[inline]
    unsafe fn row(&self, i: usize) -> &'a mut [T] {
        assert!(i < self.count);
        // SAFETY: row `i` lies inside the slice borrowed for 'a, and the caller takes it only once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.width), self.width) }
    }
}

/// Row indices checked once to be distinct, so that any number of [`Picked`] row sets (keys and values, say) can
/// share them without checking again.
#[derive(Clone, Copy, Debug)]
pub struct DistinctIndices<'a> {
    idx: &'a [usize],
    /// One past the largest index (0 when empty).
    end: usize,
}

impl<'a> DistinctIndices<'a> {
    /// Panics if an index appears twice.
    pub fn new(idx: &'a [usize]) -> Self {
        // One index (a single decoding sequence, once per layer) cannot repeat: no sorted copy to allocate.
        if let [i] = idx {
            return DistinctIndices { idx, end: i + 1 };
        }
        let mut sorted = idx.to_vec();
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[0] != w[1]), "picked rows repeat");
        DistinctIndices { idx, end: sorted.last().map_or(0, |&i| i + 1) }
    }
}

/// Rows of a mutable slice (rows of `width` elements) chosen by index: task row `i` is the slice's row `picks[i]`.
/// The indices are distinct ([`DistinctIndices`]), so no row is handed out twice.
pub struct Picked<'a, T> {
    chunks: Chunks<'a, T>,
    picks: &'a [usize],
}

impl<'a, T> Picked<'a, T> {
    /// Panics if an index is out of range.
    pub fn new(slice: &'a mut [T], width: usize, picks: DistinctIndices<'a>) -> Self {
        let chunks = Chunks::new(slice, width);
        assert!(picks.end <= chunks.count, "picked row out of range");
        Picked { chunks, picks: picks.idx }
    }
}

impl<'a, T: Send> Rows<'a> for Picked<'a, T> {
    type Row = &'a mut [T];
    #[inline]
    fn count(&self) -> Option<usize> {
        Some(self.picks.len())
    }
    #[inline]
    unsafe fn row(&self, i: usize) -> &'a mut [T] {
        // SAFETY: the picks are distinct (checked by `DistinctIndices::new`) and in range (checked in `new`), so
        // distinct `i` give distinct rows; the caller takes each `i` once.
        unsafe { self.chunks.row(self.picks[i]) }
    }
}

impl<'a, R: Rows<'a>> Rows<'a> for Option<R> {
    type Row = Option<R::Row>;
    #[inline]
    fn count(&self) -> Option<usize> {
        self.as_ref().and_then(R::count)
    }
    #[inline]
    unsafe fn row(&self, i: usize) -> Self::Row {
        // SAFETY: the caller's contract, passed on.
        self.as_ref().map(|r| unsafe { r.row(i) })
    }
}

/// The common count of several parts, any of which may fit any count.
fn joint_count(counts: &[Option<usize>]) -> Option<usize> {
    let mut known = counts.iter().flatten();
    let first = known.next().copied();
    for &c in known {
        assert_eq!(Some(c), first, "row parts differ in their number of rows");
    }
    first
}

/// Tuples of row parts: row `i` of each, together.
macro_rules! tuple_rows {
    ($($P:ident . $i:tt),+) => {
        impl<'a, $($P: Rows<'a>),+> Rows<'a> for ($($P,)+) {
            type Row = ($($P::Row,)+);
            #[inline]
            fn count(&self) -> Option<usize> {
                joint_count(&[$(self.$i.count()),+])
            }
            #[inline]
            unsafe fn row(&self, i: usize) -> Self::Row {
                // SAFETY: the caller's contract, passed on to each part.
                unsafe { ($(self.$i.row(i),)+) }
            }
        }
    };
}
tuple_rows!(A.0, B.1);
tuple_rows!(A.0, B.1, C.2);
tuple_rows!(A.0, B.1, C.2, D.3);

/// Runs `f(i, row i)` for every row of `rows`: across the threads (see [`for_each_index`]) when `parallel`, else
/// in order on the calling thread. Each thread gets one contiguous run of rows, so neighbouring rows (and the cache
/// lines they share) stay with one thread: for rows of equal cost. (One task per row interleaved the threads'
/// rows and made a batched step 4% slower.)
pub fn for_each_row<'a, R: Rows<'a>>(rows: R, parallel: bool, f: impl Fn(usize, R::Row) + Sync) {
    for_each_row_in(rows, if parallel { threads() } else { 1 }, f)
}

/// [`for_each_row`] in `tasks` contiguous runs of rows that threads claim one at a time: for rows of unequal cost
/// (causal attention, where later tokens see more of the cache), several runs per thread let a thread that drew
/// cheap runs take more of them.
pub fn for_each_row_in<'a, R: Rows<'a>>(rows: R, tasks: usize, f: impl Fn(usize, R::Row) + Sync) {
    let n = rows.count().expect("for_each_row needs at least one part with a row count");
    let tasks = tasks.clamp(1, n.max(1));
    if tasks == 1 {
        for i in 0..n {
            // SAFETY: each index once.
            f(i, unsafe { rows.row(i) });
        }
    } else {
        // SAFETY: `for_each_index` runs each task once, and tasks cover disjoint index ranges, so no row is taken
        // twice.
        for_each_index(tasks, |t| {
            for i in n * t / tasks..n * (t + 1) / tasks {
                f(i, unsafe { rows.row(i) })
            }
        });
    }
}
