//! The device half of the quit protocol ([`Gpu::teardown`]) and the event-prober thread it
//! stops: the prober queries event completions for the watchdog, off the worker and off the
//! watchdog itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Gpu, Prober, State, TeardownOutcome};
use crate::gpu::device::{EventProbe, GpuError, RawEvent};
use crate::gpu::snapshot::{QuitStep, QuitStepStatus};
use crate::gpu::stream::StreamShared;

impl Gpu {
    /// Starts the event-prober thread that lets the watchdog see event completions even while
    /// the worker is busy or stuck. Queries run there, never on the watchdog thread.
    pub fn start_event_prober(&mut self, interval: Duration) {
        if self.prober.is_some() {
            return;
        }
        let shared = self.stream.shared().clone();
        let probe: Arc<dyn EventProbe> = self.backend.event_probe();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (s2, d2) = (stop.clone(), done.clone());
        let handle = std::thread::Builder::new()
            .name("hipscope-event-prober".into())
            .spawn(move || {
                prober_loop(&shared, probe.as_ref(), &s2, interval);
                d2.store(true, Ordering::Release);
            })
            .ok();
        self.prober = Some(Prober { stop, done, handle });
    }

    /// The device half of the quit protocol: bounded drain, then destroy BLAS handles, events,
    /// modules, arena and pinned memory, stream — each reported through `on_step` with its
    /// duration. If the drain times out or any step fails, every further GPU call is skipped and
    /// the outcome is not clean: the app must then leave with `_exit`.
    pub fn teardown(
        mut self,
        drain_deadline: Duration,
        on_step: &mut dyn FnMut(QuitStep),
    ) -> TeardownOutcome {
        let mut steps = Vec::new();
        let mut failed: Option<String> = match &self.state {
            State::Poisoned(r) => Some(format!("the device failed earlier: {r}")),
            State::TornDown => Some("already torn down".into()),
            State::Alive => None,
        };
        let mut step =
            |name: &str, failed: &mut Option<String>, f: &mut dyn FnMut() -> Result<(), String>| {
                on_step(QuitStep {
                    name: name.into(),
                    status: QuitStepStatus::Running,
                    elapsed: Duration::ZERO,
                });
                let t = Instant::now();
                let status = match failed {
                    Some(why) => QuitStepStatus::Skipped(format!("no GPU calls after: {why}")),
                    None => match f() {
                        Ok(()) => QuitStepStatus::Done,
                        Err(e) => {
                            *failed = Some(format!("{name}: {e}"));
                            QuitStepStatus::Failed(e)
                        }
                    },
                };
                let s = QuitStep {
                    name: name.into(),
                    status,
                    elapsed: t.elapsed(),
                };
                on_step(s.clone());
                steps.push(s);
            };

        step("drain stream", &mut failed, &mut || {
            let deadline = Instant::now() + drain_deadline;
            let last = self.stream.last_seq();
            self.stream
                .wait_for(self.backend.as_mut(), last, deadline)
                .map_err(|e| match e {
                    GpuError::Timeout { what, waited } => format!(
                        "timed out after {waited:.1?} with {} op(s) in flight: {what}",
                        self.stream.shared().queue_depth()
                    ),
                    other => other.to_string(),
                })
        });
        step("destroy BLAS handles", &mut failed, &mut || {
            if let Some(h) = self.blas.take() {
                // SAFETY: drained; the handle is not used again.
                unsafe { self.backend.destroy_blas(h) }.map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        step("destroy events", &mut failed, &mut || {
            if let Some(mut p) = self.prober.take() {
                p.stop.store(true, Ordering::Release);
                let t = Instant::now();
                while !p.done.load(Ordering::Acquire) {
                    if t.elapsed() > Duration::from_secs(1) {
                        return Err(
                            "the event prober is stuck inside an event query (runtime wedged)"
                                .into(),
                        );
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                if let Some(h) = p.handle.take() {
                    let _ = h.join();
                }
            }
            for e in self.stream.event_handles() {
                // SAFETY: drained and the prober has stopped; no one queries these again.
                unsafe { self.backend.destroy_event(e) }.map_err(|e| e.to_string())?;
            }
            self.stream.clear_events();
            if let Some(e) = self.peer_event.take() {
                // SAFETY: drained; a peer's stream that waited on it was drained before it.
                unsafe { self.backend.destroy_event(e) }.map_err(|e| e.to_string())?;
            }
            if let Some(t) = self.timer.take() {
                for &e in t.events() {
                    // SAFETY: drained; the tracer's events are only read by the worker.
                    unsafe { self.backend.destroy_event(e) }.map_err(|e| e.to_string())?;
                }
            }
            Ok(())
        });
        step("unload modules", &mut failed, &mut || {
            // The graphs launch these modules' kernels: they go first.
            for g in self.graphs.take_all() {
                // SAFETY: drained; no replay runs.
                unsafe { self.backend.destroy_graph(g) }.map_err(|e| e.to_string())?;
            }
            for (_, m) in self.modules.drain(..) {
                // SAFETY: drained; nothing runs from these modules.
                unsafe { self.backend.unload_module(m) }.map_err(|e| e.to_string())?;
            }
            self.functions.clear();
            self.stamped_fns.clear();
            self.any_stamped = false;
            self.by_name.clear();
            Ok(())
        });
        step("free arena and pinned memory", &mut failed, &mut || {
            if let Some(a) = self.arena.take() {
                // SAFETY: drained; no buffer is used after teardown.
                unsafe { a.release(self.backend.as_mut()) }.map_err(|e| e.to_string())?;
            }
            self.unregister_all()?;
            for s in self.staging.drain(..) {
                // SAFETY: drained; staging buffers are idle.
                unsafe { self.backend.free_pinned(&s.mem) }.map_err(|e| e.to_string())?;
            }
            for w in self.host_words.drain(..) {
                // SAFETY: drained; no kernel reads the word any more.
                unsafe { self.backend.free_pinned(&w) }.map_err(|e| e.to_string())?;
            }
            if let Some(c) = self.crumb.take() {
                self.stream.shared().detach_breadcrumb();
                // SAFETY: no reader holds the word any more; no kernel is in flight.
                unsafe { self.backend.free_pinned(&c) }.map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        step("destroy stream", &mut failed, &mut || {
            // SAFETY: drained, and everything else on the device is gone.
            unsafe { self.backend.destroy_stream() }.map_err(|e| e.to_string())
        });
        self.state = State::TornDown;
        TeardownOutcome {
            clean: failed.is_none(),
            reason: failed,
            steps,
        }
    }
}

fn prober_loop(
    shared: &StreamShared,
    probe: &dyn EventProbe,
    stop: &AtomicBool,
    interval: Duration,
) {
    // Each query takes the runtime's lock that the worker's launches also take, so the prober
    // asks about as few events as it can: the oldest pending first, stopping at the first one
    // not reached (on one stream, a later event cannot be reached before an earlier one).
    let mut pending: Vec<(u64, u64, usize)> = Vec::with_capacity(shared.events.len());
    while !stop.load(Ordering::Acquire) {
        shared.fold_breadcrumb();
        let done = shared.completed();
        pending.clear();
        for (i, slot) in shared.events.iter().enumerate() {
            let c = slot.covers.load(Ordering::Acquire);
            let h = slot.handle.load(Ordering::Acquire);
            if c != 0 && c != u64::MAX && c > done && h != 0 {
                pending.push((c, h, i));
            }
        }
        pending.sort_unstable();
        for &(c1, h, i) in &pending {
            shared
                .probe_busy_since_ns
                .store(shared.now_ns().max(1), Ordering::Release);
            let r = probe.query(RawEvent(h));
            shared.probe_busy_since_ns.store(0, Ordering::Release);
            match r {
                // Only if the event was not re-recorded meanwhile (then c1 is stale but true).
                Ok(true) if shared.events[i].covers.load(Ordering::Acquire) == c1 => {
                    shared.advance_completed(c1)
                }
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    let _ = shared.probe_error.set(e.to_string());
                    break;
                }
            }
        }
        std::thread::sleep(interval);
    }
}
