//! The split backend's [`Instrument`]: the GPU side's device, streams and watchdog, the CPU
//! side's ops as a lane of their own, the hang fault on the side of its layer, and both sides'
//! quit.

use std::sync::Arc;
use std::time::Duration;

use super::SplitBackend;
use crate::gpu::backend::{BackendMonitor, Instrument, OpLabel, Result};
use crate::gpu::device::DeviceInfo;
use crate::gpu::snapshot::{
    DeviceRelease, DeviceSummary, QuitStep, StreamSnapshot, WatchdogSnapshot,
};
use crate::gpu::stream::{Budget, StreamShared};
use crate::gpu::watchdog::Watchdog;

/// The GPU side's streams and watchdog, and the CPU side's ops as a lane of their own.
struct SplitMonitor {
    gpu: Option<Arc<dyn BackendMonitor>>,
    cpu: Option<Arc<StreamShared>>,
}

impl BackendMonitor for SplitMonitor {
    fn streams(&self) -> Vec<StreamSnapshot> {
        let mut v = self.gpu.as_ref().map(|m| m.streams()).unwrap_or_default();
        v.extend(self.cpu.as_ref().map(|c| c.snapshot()));
        v
    }

    fn watchdog(&self) -> Option<WatchdogSnapshot> {
        self.gpu.as_ref().and_then(|m| m.watchdog())
    }
}
impl Instrument for SplitBackend {
    fn device(&self) -> DeviceSummary {
        let mut d = self.gpu.device();
        d.reason = format!("{}; {}", d.reason, self.said);
        d
    }

    fn read_bandwidth(&mut self) -> Option<crate::gpu::handle::ReadBandwidth> {
        self.gpu.read_bandwidth()
    }

    fn streams(&self) -> Vec<StreamSnapshot> {
        let mut v = self.gpu.streams();
        v.extend(self.cpu.watch_target().map(|(s, _)| s.snapshot()));
        v
    }

    fn monitor(&self) -> Option<Arc<dyn BackendMonitor>> {
        Some(Arc::new(SplitMonitor {
            gpu: self.gpu.monitor(),
            cpu: self.cpu.watch_target().map(|(s, _)| s),
        }))
    }

    fn watch_target(&self) -> Option<(Arc<StreamShared>, DeviceInfo)> {
        self.gpu.watch_target()
    }

    fn keep_watchdog(&mut self, dog: Watchdog) {
        self.gpu.keep_watchdog(dog);
    }

    fn stuck_op(&mut self, label: OpLabel, budget: Budget) -> Result<()> {
        let s = match label.layer {
            Some(l) => self.place.layer_side(l as usize),
            None => self.place.output_side(),
        };
        self.side(s).stuck_op(label, budget)
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        self.gpu.as_any_mut()
    }

    fn shutdown(
        &mut self,
        drain_deadline: Duration,
        on_step: &mut dyn FnMut(QuitStep),
    ) -> DeviceRelease {
        let g = self.gpu.shutdown(drain_deadline, on_step);
        let c = self.cpu.shutdown(drain_deadline, on_step);
        if g == DeviceRelease::Abandoned || c == DeviceRelease::Abandoned {
            DeviceRelease::Abandoned
        } else {
            DeviceRelease::Clean
        }
    }
}
