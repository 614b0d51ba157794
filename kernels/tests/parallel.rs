//! The team of `infer_kernels::parallel`: every index runs exactly once, inside or outside a team, nested regions
//! and panicking tasks neither hang nor lose work, and row parts are handed out whole and disjoint.

use std::sync::atomic::{AtomicUsize, Ordering};

use infer_kernels::parallel::{Chunks, DistinctIndices, Picked, for_each_index, for_each_row, with_team};

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
}

/// Counts how often each index ran, over many regions in a row (the team reuses its state between them).
fn count_runs(regions: usize, n: usize) -> Vec<usize> {
    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    for _ in 0..regions {
        for_each_index(n, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
    }
    hits.into_iter().map(AtomicUsize::into_inner).collect()
}

#[test]
fn every_index_runs_once_per_region() {
    for threads in [1, 2, 3] {
        pool(threads).install(|| {
            for n in [0, 1, 2, 7, 64] {
                let outside = count_runs(50, n);
                let inside = with_team(|| count_runs(500, n));
                assert!(outside.iter().all(|&c| c == 50), "threads={threads} n={n}: {outside:?}");
                assert!(inside.iter().all(|&c| c == 500), "threads={threads} n={n} in a team: {inside:?}");
            }
        });
    }
}

#[test]
fn a_team_finishes_without_its_helpers() {
    // A pool of two whose other thread is held elsewhere for the whole team: the caller must do every task alone.
    let p = pool(2);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    p.spawn(move || {
        started_tx.send(()).unwrap();
        rx.recv().unwrap();
    });
    started_rx.recv().unwrap();
    let counts = p.install(|| with_team(|| count_runs(20, 9)));
    tx.send(()).unwrap();
    assert!(counts.iter().all(|&c| c == 20), "{counts:?}");
}

#[test]
fn a_caller_waiting_long_for_a_helper_does_not_run_its_own_queued_helpers() {
    // Four threads, two held elsewhere: one helper job runs, another stays queued behind the caller. Slow tasks make
    // the caller wait past its spinning phase; it must keep waiting, not pick up the queued helper (whose loop only
    // ends when the caller stops the team).
    let p = pool(4);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    for _ in 0..2 {
        let (started_tx, rx) = (started_tx.clone(), rx.clone());
        p.spawn(move || {
            started_tx.send(()).unwrap();
            let _ = rx.lock().unwrap().recv();
        });
    }
    started_rx.recv().unwrap();
    started_rx.recv().unwrap();
    let ran = AtomicUsize::new(0);
    p.install(|| {
        with_team(|| {
            for _ in 0..3 {
                for_each_index(4, |_| {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    ran.fetch_add(1, Ordering::Relaxed);
                });
            }
        })
    });
    assert_eq!(ran.into_inner(), 12);
    tx.send(()).unwrap();
    tx.send(()).unwrap();
}

#[test]
fn nested_regions_run_inside_the_task() {
    pool(2).install(|| {
        let total = AtomicUsize::new(0);
        with_team(|| {
            for_each_index(4, |_| {
                for_each_index(5, |j| {
                    total.fetch_add(j + 1, Ordering::Relaxed);
                });
            })
        });
        assert_eq!(total.into_inner(), 4 * 15);
    });
}

#[test]
fn a_panicking_task_reaches_the_caller_and_the_team_ends() {
    pool(2).install(|| {
        let ran = AtomicUsize::new(0);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_team(|| {
                for_each_index(16, |i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    assert!(i != 5, "task five fails");
                })
            })
        }));
        let msg = result.expect_err("the panic must reach the caller");
        let text = msg.downcast_ref::<&str>().copied().or(msg.downcast_ref::<String>().map(String::as_str));
        assert_eq!(text, Some("task five fails"));
        // Every task still ran: the region completed before the panic was raised.
        assert_eq!(ran.into_inner(), 16);
        // The pool is usable afterwards (no helper left spinning).
        assert_eq!(with_team(|| count_runs(3, 4)), vec![3; 4]);
    });
}

#[test]
fn rows_are_whole_and_disjoint() {
    pool(2).install(|| {
        for parallel in [false, true] {
            let (mut a, mut b) = (vec![0u32; 6 * 4], vec![0u64; 6 * 2]);
            with_team(|| {
                for_each_row(
                    (Chunks::new(&mut a, 4), Chunks::new(&mut b, 2), None::<Chunks<'_, u8>>),
                    parallel,
                    |t, (ra, rb, none)| {
                        assert!(none.is_none());
                        assert_eq!((ra.len(), rb.len()), (4, 2));
                        ra.iter_mut().for_each(|v| *v += t as u32);
                        rb.iter_mut().for_each(|v| *v += 10 * t as u64);
                    },
                )
            });
            assert_eq!(a, (0..24).map(|i| i / 4).collect::<Vec<u32>>(), "parallel={parallel}");
            assert_eq!(b, (0..12).map(|i| 10 * (i / 2)).collect::<Vec<u64>>(), "parallel={parallel}");
        }
    });
}

#[test]
#[should_panic(expected = "row parts differ")]
fn row_parts_must_agree_on_their_count() {
    let (mut a, mut b) = (vec![0u8; 8], vec![0u8; 9]);
    for_each_row((Chunks::new(&mut a, 2), Chunks::new(&mut b, 3)), false, |_, _| {});
}

#[test]
fn picked_rows_follow_their_indices_and_share_one_check() {
    pool(2).install(|| {
        let (mut a, mut b) = (vec![0u32; 5 * 3], vec![0u32; 5 * 2]);
        let idx = [4, 0, 2];
        let picks = DistinctIndices::new(&idx);
        let rows = (Picked::new(&mut a, 3, picks), Picked::new(&mut b, 2, picks));
        with_team(|| {
            for_each_row(rows, true, |i, (ra, rb)| {
                ra.fill(i as u32 + 1);
                rb.fill(10 * (i as u32 + 1));
            })
        });
        assert_eq!(a, [2, 2, 2, 0, 0, 0, 3, 3, 3, 0, 0, 0, 1, 1, 1]);
        assert_eq!(b, [20, 20, 0, 0, 30, 30, 0, 0, 10, 10]);
    });
}

#[test]
#[should_panic(expected = "picked rows repeat")]
fn picked_indices_must_differ() {
    DistinctIndices::new(&[3, 1, 3]);
}

#[test]
#[should_panic(expected = "picked row out of range")]
fn picked_indices_must_be_rows_of_the_slice() {
    let mut a = vec![0u8; 4];
    let _ = Picked::new(&mut a, 2, DistinctIndices::new(&[0, 2]));
}
