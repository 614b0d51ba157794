//! The memory budget of `run_bounded`: work that grows past it, or asks for a huge block at once, is stopped and
//! reported, and the process lives on; work within it returns its result.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use infer_kernels::budget::{Bounded, BudgetAlloc, budget_enforced, run_bounded};

#[global_allocator]
static ALLOC: BudgetAlloc = BudgetAlloc;

const MIB: usize = 1 << 20;
const LONG: Duration = Duration::from_secs(30);

#[test]
fn the_allocator_is_installed_here() {
    assert!(budget_enforced());
}

#[test]
fn work_within_the_budget_returns_its_result() {
    let r = run_bounded(16 * MIB, LONG, || vec![7u8; 8 * MIB].iter().map(|&b| b as usize).sum::<usize>());
    assert_eq!(r, Bounded::Done(7 * 8 * MIB));
    // Memory freed along the way does not count against what is held at once.
    let r = run_bounded(16 * MIB, LONG, || {
        for _ in 0..100 {
            std::hint::black_box(vec![1u8; 8 * MIB]);
        }
        1
    });
    assert_eq!(r, Bounded::Done(1));
}

#[test]
fn doubling_a_string_is_stopped_at_the_budget() {
    let start = Instant::now();
    let r = run_bounded(16 * MIB, LONG, || {
        let mut s = String::from("x");
        for _ in 0..60 {
            s = s.clone() + &s;
        }
        s.len()
    });
    assert_eq!(r, Bounded::OverBudget { budget: 16 * MIB });
    assert!(start.elapsed() < LONG);
}

#[test]
fn one_huge_request_is_stopped_before_it_is_served() {
    // A terabyte: served, it would abort the process (or wake the OOM killer).
    let r = run_bounded(16 * MIB, LONG, || Vec::<u8>::with_capacity(1 << 40).capacity());
    assert_eq!(r, Bounded::OverBudget { budget: 16 * MIB });
    let r = run_bounded(16 * MIB, LONG, || {
        let mut v = vec![0u8; MIB];
        v.reserve_exact(1 << 40);
        v.capacity()
    });
    assert_eq!(r, Bounded::OverBudget { budget: 16 * MIB });
}

#[test]
fn work_past_its_time_is_abandoned_and_stops_at_its_next_allocation() {
    let steps = Arc::new(AtomicU64::new(0));
    let s = steps.clone();
    let r = run_bounded(16 * MIB, Duration::from_millis(200), move || {
        loop {
            s.fetch_add(1, Ordering::Relaxed);
            std::hint::black_box(vec![0u8; 64]);
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    assert_eq!(r, Bounded::TimedOut { limit: Duration::from_millis(200) });
    // The thread is abandoned by now. A step already past its allocation (asleep, say) may still count one more
    // step before it allocates again; that allocation parks it for good. So, however late the thread is scheduled,
    // the count never passes `seen + 1`. A thread that kept running would pass it within a few of its 1 ms steps;
    // it is watched for a second (far more than that, on a loaded machine too).
    let seen = steps.load(Ordering::SeqCst);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let now = steps.load(Ordering::SeqCst);
        assert!(now <= seen + 1, "the abandoned thread kept running: {} steps after it was abandoned", now - seen);
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_panic_is_reported_at_once() {
    let start = Instant::now();
    let r: Bounded<()> = run_bounded(16 * MIB, LONG, || panic!("deliberate"));
    assert_eq!(r, Bounded::Panicked);
    assert!(start.elapsed() < LONG);
}

#[test]
fn other_threads_are_not_limited() {
    // A budget on one thread leaves this one free to allocate far more.
    let r = run_bounded(MIB, LONG, || 1);
    assert_eq!(r, Bounded::Done(1));
    let big = vec![1u8; 64 * MIB];
    assert_eq!(big.len(), 64 * MIB);
}
