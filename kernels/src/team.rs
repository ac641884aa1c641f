//! A team of spinning threads for the many small parallel regions of a decode step.
//!
//! A decode step runs ~120 GEMMs (and as many attention calls) of a few tens of microseconds
//! each. As rayon regions, each one wakes the pool's sleeping threads again (3–9 µs each on the
//! project's 2-vCPU machine, measured with a serial gap of 20–100 µs between regions), so two
//! threads decoded SmolLM2-135M hardly faster than one (Q8_0: 97 and 100 tok/s; llama.cpp, whose
//! threads spin between its operations, went from 99 to 124). [`with_team`] runs a closure on
//! the calling rayon thread while every other thread of the pool spins, waiting for work;
//! [`for_each`] inside it hands tasks out to the team through one atomic counter (or, outside
//! a team, to rayon as before). Paired against the same build without it (six rounds, decode of
//! 128 steps): 1.07× at batch 1 and 1.20× at batch 8 in Q8_0, 1.09× and 1.13× with bf16 weights.
//!
//! Which thread runs a task never changes its result: each task writes what it alone computes
//! (the kernels' outputs are reduced in a fixed order inside a task), so the numbers are those of
//! rayon's schedule, bit for bit.
//!
//! Protocol: one `state` word holds the job's generation (high 32 bits) and the next task
//! (low 32). A thread claims task `i` of generation `g` by a compare-exchange from `(g, i)` to
//! `(g, i + 1)`; only then does it read the job (so the job it reads is that generation's: the
//! owner does not publish another until every claimed task has reported done). A new generation
//! is first published closed (no task claimable) while its task count and job are written, so a
//! thread holding a stale word of the previous generation cannot pair it with the new count. The
//! owner claims tasks too, so a job completes even if no member is spinning yet, then waits
//! until every task is done.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use rayon::prelude::*;

struct Team {
    /// The generation (high 32 bits) and the next unclaimed task (low 32).
    state: AtomicU64,
    /// Tasks of the current generation (stored before the generation is published).
    tasks: AtomicUsize,
    /// Tasks of the current generation done.
    done: AtomicUsize,
    stop: AtomicBool,
    /// The current generation's function, lifetime erased: written by the owner before it
    /// publishes a generation, read by a thread only after it claimed one of that generation's
    /// tasks (so never while being written: the owner waits for every claimed task first).
    job: UnsafeCell<Option<*const (dyn Fn(usize) + Sync)>>,
    /// The rayon thread index of the owner (a member job it picks up itself returns at once).
    owner: AtomicUsize,
    /// The first panic of a task of the current job, raised again by the owner once every task
    /// is done (a task must never unwind past its claim: the job's other tasks still run).
    panic: std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

// SAFETY: `job` is accessed as the protocol above says (one writer, readers only between its
// publication and the owner's next write, which waits for them); the closure is `Sync`.
unsafe impl Sync for Team {}

thread_local! {
    /// The team this thread owns, while [`with_team`] runs here.
    static OWNED: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// A `next` no task count reaches: the generation is being set up, nothing can be claimed.
const CLOSED: u64 = 0xffff_ffff;

fn pack(generation: u64, next: u64) -> u64 {
    generation << 32 | next
}

impl Team {
    fn new() -> Self {
        Team {
            state: AtomicU64::new(0),
            tasks: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            owner: AtomicUsize::new(usize::MAX),
            panic: std::sync::Mutex::new(None),
        }
    }

    /// Claims and runs tasks of generation `g` until none is left; returns whether it ran any.
    fn work(&self, g: u64) -> bool {
        let mut ran = false;
        loop {
            let cur = self.state.load(Ordering::Acquire);
            let (cg, next) = (cur >> 32, cur & 0xffff_ffff);
            if cg != g || next as usize >= self.tasks.load(Ordering::Acquire) {
                return ran;
            }
            let claimed = pack(g, next + 1);
            if self
                .state
                .compare_exchange_weak(cur, claimed, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // SAFETY: task `next` of generation `g` is claimed and not done, so the owner has
            // published this generation's job and waits in `run` before writing another; the
            // closure is alive until then.
            let f = unsafe { (*self.job.get()).expect("a published job") };
            // SAFETY: as above.
            let task = std::panic::AssertUnwindSafe(|| unsafe { (*f)(next as usize) });
            if let Err(payload) = std::panic::catch_unwind(task) {
                let mut first = self.panic.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(payload);
            }
            self.done.fetch_add(1, Ordering::AcqRel);
            ran = true;
        }
    }

    /// A member's loop: run each new generation's tasks until the team stops.
    fn member(&self) {
        if rayon::current_thread_index() == Some(self.owner.load(Ordering::Acquire)) {
            return;
        }
        let mut idle = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            let g = self.state.load(Ordering::Acquire) >> 32;
            if self.work(g) {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle < 1 << 10 {
                    std::hint::spin_loop();
                } else {
                    // Idle for more than a few microseconds (the step's serial parts): offer the
                    // core to any other runnable thread (the worker's mask thread computes the
                    // next constrained step's masks during the forward pass); with none, this
                    // returns at once and the member keeps watching.
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Runs `f(0..tasks)` on the owner and the spinning members; returns when all are done.
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        // SAFETY: the pointer is followed only for tasks claimed before this returns, and this
        // returns only once every task is done.
        let erased: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        assert!((tasks as u64) < CLOSED, "{tasks} tasks in one job");
        let g = (self.state.load(Ordering::Acquire) >> 32) + 1;
        // Close the new generation before changing `tasks`: a member holding a stale state word
        // of the previous generation, once it reads the new (larger) count, must fail its claim
        // (the word changed), never claim a task of the old word that the new count allows.
        self.state.store(pack(g, CLOSED), Ordering::Release);
        // SAFETY: no task of the previous generation is claimed and not done (we waited), and
        // no task of this one can be claimed while it is closed, so no thread reads `job` now.
        unsafe { *self.job.get() = Some(erased) };
        self.tasks.store(tasks, Ordering::Release);
        self.done.store(0, Ordering::Release);
        self.state.store(pack(g, 0), Ordering::Release);
        self.work(g);
        while self.done.load(Ordering::Acquire) < tasks {
            std::hint::spin_loop();
        }
        let payload = self.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(payload) = payload {
            std::panic::resume_unwind(payload);
        }
    }
}

/// Runs `f` with the other threads of the current rayon pool spinning as a team for
/// [`for_each`] (for a decode step: many small regions). With one thread, just `f`.
pub fn with_team<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_num_threads() <= 1 {
        return f();
    }
    let team = Team::new();
    let team = &team;
    rayon::scope(|s| {
        team.owner.store(
            rayon::current_thread_index().unwrap_or(usize::MAX),
            Ordering::Release,
        );
        for _ in 1..rayon::current_num_threads() {
            s.spawn(move |_| team.member());
        }
        // Restores this thread's team and stops the members however `f` ends (a panic too:
        // the scope then waits for the members, which must have stopped).
        struct Stop<'t> {
            team: &'t Team,
            previous: *const Team,
        }
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                OWNED.set(self.previous);
                self.team.stop.store(true, Ordering::Release);
            }
        }
        let _stop = Stop {
            team,
            previous: OWNED.replace(team as *const Team),
        };
        f()
    })
}

/// `f(i)` for every `i < tasks`, in parallel: on this thread's team inside [`with_team`], else
/// on the rayon pool.
pub fn for_each(tasks: usize, f: impl Fn(usize) + Sync + Send) {
    let team = OWNED.get();
    if team.is_null() {
        (0..tasks).into_par_iter().for_each(f);
    } else {
        // SAFETY: `OWNED` points at the team of the enclosing `with_team` on this thread, which
        // outlives this call.
        unsafe { &*team }.run(tasks, &f);
    }
}

/// `f(i, chunk)` for every `chunk`-long piece of `data` (the last may be shorter), in parallel
/// as [`for_each`] runs tasks: on this thread's team inside [`with_team`], else on rayon.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    assert!(chunk > 0, "chunks of 0");
    if OWNED.get().is_null() {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
        return;
    }
    /// The data's start, shared by tasks that take disjoint chunks of it.
    struct Base<T>(*mut T);
    // SAFETY: each task forms only its own chunk (disjoint ranges of one `&mut [T]`).
    unsafe impl<T: Send> Sync for Base<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send> Send for Base<T> {}
    let (len, base) = (data.len(), Base(data.as_mut_ptr()));
    let base = &base;
    for_each(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        // SAFETY: `start..start + n` lies inside `data`, which is borrowed mutably for the whole
        // call, and no other task forms an overlapping range.
        let c =
            unsafe { std::slice::from_raw_parts_mut(base.0.add(start), chunk.min(len - start)) };
        f(i, c);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_inside_and_outside_a_team() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let count = |inside: bool| {
            let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            let body = || {
                for round in 0..200 {
                    for_each(1 + round % 7 * 100, |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                }
            };
            pool.install(|| if inside { with_team(body) } else { body() });
            hits.iter()
                .map(|h| h.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        let (inside, outside) = (count(true), count(false));
        assert_eq!(inside, outside);
        assert!(inside[0] == 200 && inside[600] > 0 && inside[601] == 0);
    }

    #[test]
    fn a_job_never_ends_while_a_task_runs_and_no_task_runs_twice() {
        // Jobs of growing task counts one after another (the case a stale claim once broke:
        // a member paired the previous job's word with the next job's larger count).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            with_team(|| {
                for round in 0..50_000usize {
                    let tasks = 1 + round % 7;
                    let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                    for_each(tasks, |i| {
                        // A little work, so the member claims tasks while the owner does too.
                        let t = std::time::Instant::now();
                        while t.elapsed() < std::time::Duration::from_nanos(300) {}
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(
                        hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                        "round {round}"
                    );
                }
            })
        });
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_after_the_others_finished() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let done = AtomicUsize::new(0);
        let caught = pool.install(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                with_team(|| {
                    for_each(8, |i| {
                        if i == 3 {
                            panic!("task 3");
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    })
                })
            }))
        });
        assert!(caught.is_err(), "the panic reaches the caller");
        assert_eq!(done.load(Ordering::Relaxed), 7, "the other tasks ran");
        // And the pool still works afterwards (the members stopped).
        assert_eq!(pool.install(|| with_team(|| 41 + 1)), 42);
    }

    #[test]
    fn chunks_are_handed_out_once_inside_and_outside_a_team() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for inside in [false, true] {
            let mut data = vec![0u32; 1003];
            let fill = |data: &mut [u32]| {
                for_each_chunk_mut(data, 10, |i, c| {
                    for (j, v) in c.iter_mut().enumerate() {
                        *v += (i * 10 + j) as u32 + 1;
                    }
                })
            };
            pool.install(|| {
                if inside {
                    with_team(|| fill(&mut data))
                } else {
                    fill(&mut data)
                }
            });
            let want: Vec<u32> = (1..=1003).collect();
            assert_eq!(data, want, "inside a team: {inside}");
        }
    }

    #[test]
    fn rayon_regions_inside_a_team_still_finish() {
        // A rayon region inside the team (members busy spinning) runs on the owner alone, and
        // the owner never becomes a member of its own team.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let sum: u64 = pool.install(|| {
            with_team(|| {
                let mut total = 0u64;
                for _ in 0..50 {
                    total += (0..1000u64).into_par_iter().sum::<u64>();
                    for_each(10, |_| {});
                }
                total
            })
        });
        assert_eq!(sum, 50 * 499_500);
    }
}
