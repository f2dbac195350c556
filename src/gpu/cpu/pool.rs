//! A persistent worker pool with low dispatch latency.
//!
//! A decode step of a small model is a few hundred matrix products of a few microseconds each,
//! so waking threads through the OS for every one (tens of microseconds) would cost more than the
//! work. Workers therefore spin on an epoch counter for a while after each job and only then
//! park; the caller takes part in every job as thread 0 and spins for the others' completion
//! before it, too, blocks. One job runs at a time: the pool is not `Sync`, so only its owner
//! can submit (the CPU backend keeps one per inference worker).
//!
//! Each thread index of a job is claimed once, by its worker or by the caller: after its own
//! index the caller claims the indices of workers that have not started yet and runs them
//! itself. So a worker the OS has not scheduled (other processes on the cores) delays nothing;
//! the caller only waits for workers that are actually running.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::hint::spin_loop;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long an idle worker (and a waiting caller) spins before blocking. Long enough to cover
/// the gaps between the ops of one decode step, short enough not to burn a core between tokens.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// Threads a pool can have (one claim bit each).
pub const MAX_THREADS: usize = 64;

/// Spins between two reads of the clock while spinning.
const SPINS_PER_CLOCK_CHECK: u32 = 64;

/// The job of the current epoch, its lifetime erased: `run` does not return (or unwind) before
/// every worker has finished with it.
#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize, usize) + Sync + 'static));

struct Shared {
    /// Threads per job, the owner included; fixed once the pool is built.
    n_threads: AtomicUsize,
    spin: Duration,
    /// Bumped by the owner to publish a job (Release); workers run each epoch once.
    epoch: AtomicU64,
    /// Written by the owner only while no worker can read it (before the epoch bump, after
    /// `pending` reached zero).
    job: UnsafeCell<Option<JobPtr>>,
    /// Bit i set: index i of the current job is taken (by its worker or by the owner).
    claimed: AtomicU64,
    /// Indices 1.. of the current job not yet finished.
    pending: AtomicUsize,
    shutdown: AtomicBool,
    /// The owner blocked waiting for `pending` to reach zero (set under `done_lock`).
    owner_waiting: AtomicBool,
    done_lock: Mutex<()>,
    done: Condvar,
    /// The first panic of a worker in the current job, re-raised in the owner.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: the only non-Sync field is `job`. The owner writes it only when every index of the
// previous job has been claimed and finished (`pending` zero, Acquired), and before the Release
// store that opens `claimed` for the next job; a worker reads it only after winning a claim
// (AcqRel), and stops before its Release decrement of `pending`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds valid data.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fixed set of worker threads that run one job at a time on all threads.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Set while a job runs, so that a nested `run` executes inline instead of deadlocking.
    /// (Being a `Cell`, it also makes the pool `!Sync`: only its owner thread can submit.)
    running: Cell<bool>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .field("spin", &self.shared.spin)
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all, the calling thread included (so `n_threads - 1`
    /// workers are spawned; 0 counts as 1, and more than 64 as 64).
    pub fn new(n_threads: usize) -> ThreadPool {
        ThreadPool::with_spin(n_threads, DEFAULT_SPIN)
    }

    /// As `new`, with the time idle threads spin before they block.
    pub fn with_spin(n_threads: usize, spin: Duration) -> ThreadPool {
        let wanted = n_threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            n_threads: AtomicUsize::new(wanted),
            spin,
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            claimed: AtomicU64::new(u64::MAX),
            pending: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            owner_waiting: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
            panic: Mutex::new(None),
        });
        let mut workers = Vec::with_capacity(wanted - 1);
        for index in 1..wanted {
            let s = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("hipscope-cpu-{index}"))
                .spawn(move || worker(s, index));
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => {
                    // Fewer threads is slower, not wrong: carry on with those that started.
                    // No job has run yet, and the first one publishes this count to them.
                    tracing::warn!("CPU pool: could not start worker {index} of {wanted}: {e}");
                    shared.n_threads.store(index, Ordering::Relaxed);
                    break;
                }
            }
        }
        ThreadPool {
            shared,
            workers,
            running: Cell::new(false),
        }
    }

    /// Threads taking part in each job, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads.load(Ordering::Relaxed)
    }

    /// Runs `f(first_row, part)` over `data` (rows of `row_len`) cut into one run of whole rows
    /// per thread; on the calling thread alone when `data` holds fewer than `min_len` elements
    /// (waking the workers would cost more than they save).
    pub fn split_rows<T: Send>(
        &self,
        data: &mut [T],
        row_len: usize,
        min_len: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let n = self.n_threads();
        let rows = data.len() / row_len.max(1);
        if n == 1 || data.len() < min_len || rows < 2 {
            return f(0, data);
        }
        let per = rows.div_ceil(n);
        let parts: Vec<std::sync::Mutex<(usize, &mut [T])>> = data
            .chunks_mut(per * row_len)
            .enumerate()
            .map(|(i, p)| std::sync::Mutex::new((i * per, p)))
            .collect();
        self.run(&|i, _| {
            if let Some(p) = parts.get(i) {
                let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                let (r0, part) = &mut *p;
                f(*r0, part);
            }
        });
    }

    /// Run `f(thread_index, n_threads)` for every index in `0..n_threads` and return when all
    /// finished. The calling thread runs index 0, and any index whose worker has not started
    /// by the time it is done. A panic in any of them is re-raised here once all finished.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if crate::gpu::trace::on() {
            // Each thread's share is an event on its own track of the timeline.
            let traced = |i: usize, n: usize| {
                let t0 = crate::gpu::trace::now_ns();
                f(i, n);
                crate::gpu::trace::cpu_job(i, t0);
            };
            return self.run_jobs(&traced);
        }
        self.run_jobs(f)
    }

    fn run_jobs(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.n_threads();
        if n == 1 || self.running.get() {
            for i in 0..n {
                f(i, n);
            }
            return;
        }
        self.running.set(true);
        let s = &*self.shared;
        // SAFETY: the pointer is only dereferenced by workers that claimed an index of this
        // job, and we wait for all of those below before returning or unwinding.
        let erased: *const (dyn Fn(usize, usize) + Sync + 'static) =
            unsafe { std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), _>(f) };
        // SAFETY: no worker reads `job` now: every index of the last job was claimed and is done.
        unsafe { *s.job.get() = Some(JobPtr(erased)) };
        s.pending.store(n - 1, Ordering::Relaxed);
        // Open the claims (index 0 is ours); Release publishes the job to whoever claims.
        s.claimed.store(1, Ordering::Release);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        for w in &self.workers {
            // Cheap (one atomic swap) unless the worker is parked, when it is needed.
            w.thread().unpark();
        }
        let mine = panic::catch_unwind(AssertUnwindSafe(|| f(0, n)));
        for i in 1..n {
            let bit = 1u64 << i;
            if s.claimed.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
                run_index(s, f, i, n);
            }
        }
        self.wait_for_workers();
        // SAFETY: every index is claimed and finished; no worker will read the job again.
        unsafe { *s.job.get() = None };
        self.running.set(false);
        if let Err(p) = mine {
            panic::resume_unwind(p);
        }
        if let Some(p) = lock(&s.panic).take() {
            panic::resume_unwind(p);
        }
    }

    fn wait_for_workers(&self) {
        let s = &*self.shared;
        let start = Instant::now();
        let mut spins = 0u32;
        while s.pending.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) && start.elapsed() > s.spin {
                let mut g = lock(&s.done_lock);
                s.owner_waiting.store(true, Ordering::SeqCst);
                // The last worker reads owner_waiting after its decrement: either it sees true
                // and notifies under the lock (which we hold until we wait), or we see zero.
                while s.pending.load(Ordering::SeqCst) != 0 {
                    g = s.done.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.owner_waiting.store(false, Ordering::SeqCst);
                return;
            }
            spin_loop();
        }
    }
}

/// Runs index `i` of the job, records a panic, and counts it done.
fn run_index(s: &Shared, f: &(dyn Fn(usize, usize) + Sync), i: usize, n: usize) {
    if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| f(i, n))) {
        let mut slot = lock(&s.panic);
        if slot.is_none() {
            *slot = Some(p);
        }
    }
    if s.pending.fetch_sub(1, Ordering::SeqCst) == 1 && s.owner_waiting.load(Ordering::SeqCst) {
        let _g = lock(&s.done_lock);
        s.done.notify_one();
    }
}

fn worker(s: Arc<Shared>, index: usize) {
    let bit = 1u64 << index;
    let mut seen = 0u64;
    loop {
        seen = wait_for_epoch(&s, seen);
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Whoever sets the bit runs the index; the owner may have taken it already.
        if s.claimed.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            continue;
        }
        // SAFETY: winning the claim Acquired the owner's Release that followed writing `job`,
        // and the owner keeps the closure alive until `pending` (decremented last) is zero.
        if let Some(job) = unsafe { *s.job.get() } {
            let f = unsafe { &*job.0 };
            run_index(&s, f, index, s.n_threads.load(Ordering::Relaxed));
        }
    }
}

/// Spins, then parks, until the epoch differs from `seen`; returns the new epoch.
fn wait_for_epoch(s: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let e = s.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        spins += 1;
        if spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) && start.elapsed() > s.spin {
            break;
        }
        spin_loop();
    }
    loop {
        // The owner bumps the epoch before unparking, so a bump between this load and `park`
        // leaves the unpark token set and `park` returns at once.
        let e = s.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        thread::park();
    }
}

fn shutdown_workers(s: &Shared, workers: &mut Vec<JoinHandle<()>>) {
    s.shutdown.store(true, Ordering::SeqCst);
    s.epoch.fetch_add(1, Ordering::SeqCst);
    for w in workers.iter() {
        w.thread().unpark();
    }
    for w in workers.drain(..) {
        // A worker never panics outside catch_unwind; nothing to report if one did.
        let _ = w.join();
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        shutdown_workers(&self.shared, &mut self.workers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Every row is handed out once, with its own index, in whole rows, for any thread count;
    /// below the size floor everything runs as one part.
    #[test]
    fn split_rows_hands_out_each_row_once() {
        for n in 1..=3 {
            let pool = ThreadPool::new(n);
            for rows in [1, 2, 5, 64] {
                let mut data: Vec<usize> = vec![usize::MAX; rows * 3];
                let parts = AtomicUsize::new(0);
                pool.split_rows(&mut data, 3, 0, &|r0, part| {
                    assert_eq!(part.len() % 3, 0);
                    parts.fetch_add(1, Ordering::Relaxed);
                    for (i, v) in part.iter_mut().enumerate() {
                        assert_eq!(*v, usize::MAX, "element written twice");
                        *v = r0 + i / 3;
                    }
                });
                let want: Vec<usize> = (0..rows * 3).map(|i| i / 3).collect();
                assert_eq!(data, want, "{n} threads, {rows} rows");
                assert!(parts.load(Ordering::Relaxed) <= n.max(1));
                let parts = AtomicUsize::new(0);
                pool.split_rows(&mut data, 3, usize::MAX, &|r0, part| {
                    assert_eq!((r0, part.len()), (0, rows * 3));
                    parts.fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(parts.load(Ordering::Relaxed), 1);
            }
        }
    }

    #[test]
    fn every_index_runs_once_per_job() {
        for n in 1..=4 {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..1000 {
                pool.run(&|i, nt| {
                    assert_eq!(nt, n);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 1000);
            }
        }
    }

    #[test]
    fn jobs_see_each_others_writes_after_run() {
        // Each job reads what the previous job wrote on other threads: run must be a barrier.
        let pool = ThreadPool::new(3);
        let cells: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for round in 1..500usize {
            pool.run(&|i, _| {
                for c in &cells {
                    assert_eq!(c.load(Ordering::Relaxed), round - 1);
                }
                let _ = i;
            });
            pool.run(&|i, _| cells[i].store(round, Ordering::Relaxed));
        }
    }

    #[test]
    fn the_caller_runs_indices_of_workers_that_have_not_started() {
        // Index 1 blocks until index 2 has run. With one core for three threads, or a worker
        // descheduled, the caller must take over index 2 rather than wait for its worker; and
        // every index still runs exactly once.
        let pool = ThreadPool::new(3);
        for _ in 0..200 {
            let done2 = AtomicBool::new(false);
            let runs: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|i, _| {
                runs[i].fetch_add(1, Ordering::SeqCst);
                if i == 2 {
                    done2.store(true, Ordering::SeqCst);
                }
                if i == 1 {
                    let t = Instant::now();
                    while !done2.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
                        spin_loop();
                    }
                }
            });
            assert!(done2.load(Ordering::SeqCst));
            for r in &runs {
                assert_eq!(r.load(Ordering::SeqCst), 1);
            }
        }
    }

    #[test]
    fn workers_wake_after_parking() {
        let pool = ThreadPool::with_spin(2, Duration::from_micros(1));
        let count = AtomicUsize::new(0);
        for _ in 0..20 {
            thread::sleep(Duration::from_millis(2));
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(count.load(Ordering::Relaxed), 40);
    }

    #[test]
    fn a_worker_panic_reaches_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|i, _| {
                if i == 1 {
                    panic!("worker boom");
                }
            })
        }));
        let msg = r
            .err()
            .and_then(|p| p.downcast_ref::<&str>().map(|s| s.to_string()));
        assert_eq!(msg.as_deref(), Some("worker boom"));
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
