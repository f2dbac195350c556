//! The split backend's [`Instrument`]: every part's streams (each GPU's, the CPU part's ops as a
//! lane of their own), the worst of the GPUs' watchdog verdicts, the hang fault on the part of
//! its layer, and every part's quit, in order: GPU 0, GPU 1, …, then the CPU.

use std::sync::Arc;
use std::time::Duration;

use super::SplitBackend;
use crate::gpu::backend::{BackendMonitor, Instrument, OpLabel, Result};
use crate::gpu::device::DeviceInfo;
use crate::gpu::snapshot::{
    DeviceRelease, DeviceSummary, QuitStep, QuitStepStatus, StreamSnapshot, WatchState,
    WatchdogSnapshot,
};
use crate::gpu::stream::{Budget, StreamShared};
use crate::gpu::watchdog::Watchdog;

/// Every GPU's streams and watchdog, and the CPU part's ops as a lane of their own.
struct SplitMonitor {
    gpus: Vec<Arc<dyn BackendMonitor>>,
    cpu: Option<Arc<StreamShared>>,
}

impl BackendMonitor for SplitMonitor {
    fn streams(&self) -> Vec<StreamSnapshot> {
        let mut v: Vec<StreamSnapshot> = self.gpus.iter().flat_map(|m| m.streams()).collect();
        v.extend(self.cpu.as_ref().map(|c| c.snapshot()));
        v
    }

    /// The GPU whose op is worst off (HUNG over SLOW over OK; the first GPU among equals), so
    /// that a hang on GPU 1 is what the Watchdog panel shows, with its stream's name.
    fn watchdog(&self) -> Option<WatchdogSnapshot> {
        let rank = |s: &WatchdogSnapshot| match s.state {
            WatchState::Hung => 2,
            WatchState::Slow => 1,
            WatchState::Ok => 0,
        };
        let mut best: Option<WatchdogSnapshot> = None;
        for w in self.gpus.iter().filter_map(|m| m.watchdog()) {
            if best.as_ref().is_none_or(|b| rank(&w) > rank(b)) {
                best = Some(w);
            }
        }
        best
    }
}

impl Instrument for SplitBackend {
    fn device(&self) -> DeviceSummary {
        let mut d = self.parts.get(1).unwrap_or(&self.parts[0]).device();
        d.reason = format!("{}; {}", d.reason, self.said);
        d
    }

    fn read_bandwidth(&mut self) -> Option<crate::gpu::snapshot::ReadBandwidth> {
        self.parts.get_mut(1)?.read_bandwidth()
    }

    fn streams(&self) -> Vec<StreamSnapshot> {
        let mut v: Vec<StreamSnapshot> = self.parts[1..].iter().flat_map(|g| g.streams()).collect();
        v.extend(self.parts[0].watch_target().map(|(s, _)| s.snapshot()));
        v
    }

    fn monitor(&self) -> Option<Arc<dyn BackendMonitor>> {
        Some(Arc::new(SplitMonitor {
            gpus: self.parts[1..].iter().filter_map(|g| g.monitor()).collect(),
            cpu: self.parts[0].watch_target().map(|(s, _)| s),
        }))
    }

    /// GPU 0's stream: the process's watchdog from `gpu::open`; the other GPUs were opened with
    /// a watchdog of their own each.
    fn watch_target(&self) -> Option<(Arc<StreamShared>, DeviceInfo)> {
        self.parts.get(1)?.watch_target()
    }

    fn keep_watchdog(&mut self, dog: Watchdog) {
        if let Some(g) = self.parts.get_mut(1) {
            g.keep_watchdog(dog);
        }
    }

    fn stuck_op(&mut self, label: OpLabel, budget: Budget) -> Result<()> {
        let s = match label.layer {
            Some(l) => self.place.layer_side(l as usize),
            None => self.place.output_side(),
        };
        self.side(s).stuck_op(label, budget)
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        self.parts.get_mut(1)?.as_any_mut()
    }

    /// Every GPU in order, then the CPU part, each drained within the same deadline (measured
    /// from the start, so that the whole release stays within it); a step names its device.
    fn shutdown(
        &mut self,
        drain_deadline: Duration,
        on_step: &mut dyn FnMut(QuitStep),
    ) -> DeviceRelease {
        let start = std::time::Instant::now();
        let n = self.parts.len();
        let mut release = DeviceRelease::Clean;
        for i in (1..n).chain(std::iter::once(0)) {
            let left = drain_deadline.saturating_sub(start.elapsed());
            let who = super::side_of(i);
            let several = n > 2;
            let r = self.parts[i].shutdown(left, &mut |mut s: QuitStep| {
                if several {
                    s.name = format!("{who}: {}", s.name);
                }
                on_step(s)
            });
            if r == DeviceRelease::Abandoned {
                release = DeviceRelease::Abandoned;
            }
            // Each device's release as a step of its own (the CPU part reports none itself).
            if several {
                on_step(QuitStep {
                    name: format!("{who}: released"),
                    status: match r {
                        DeviceRelease::Clean => QuitStepStatus::Done,
                        DeviceRelease::Abandoned => {
                            QuitStepStatus::Failed("left without waiting for it".into())
                        }
                    },
                    elapsed: start.elapsed(),
                });
            }
        }
        release
    }
}
