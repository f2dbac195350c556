//! The CPU backend's [`Instrument`]: the host as the device, every op in the in-flight table for
//! the watchdog, and the hang fault held on the calling thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::CpuBackend;
use crate::gpu::backend::{Instrument, OpLabel, Result};
use crate::gpu::device::DeviceInfo;
use crate::gpu::snapshot::DeviceSummary;
use crate::gpu::stream::{Budget, StreamShared};
use crate::gpu::telemetry::host::{cpu_name, host_memory, simd_features};
use crate::gpu::watchdog::Watchdog;

impl Instrument for CpuBackend {
    fn device(&self) -> DeviceSummary {
        let mem = host_memory();
        DeviceSummary {
            backend: "cpu".into(),
            name: cpu_name(),
            arch: simd_features(),
            total_memory: mem.map(|m| m.0),
            free_memory: mem.map(|m| m.1),
            compute_units: Some(self.pool.n_threads() as u32),
            warp_size: None,
            reason: self.reason.clone(),
            graphs: None,
            launch_overlap: None,
        }
    }

    fn watch_target(&self) -> Option<(Arc<StreamShared>, DeviceInfo)> {
        let d = self.device();
        Some((
            self.ops.shared(),
            DeviceInfo {
                name: d.name,
                arch: d.arch,
                arch_source: "cpuid".into(),
                total_memory: d.total_memory.unwrap_or(0),
                compute_units: self.pool.n_threads() as u32,
                notes: vec![self.reason.clone()],
                ..DeviceInfo::default()
            },
        ))
    }

    fn keep_watchdog(&mut self, dog: Watchdog) {
        self.watchdog = Some(dog);
    }

    fn stuck_op(&mut self, label: OpLabel, budget: Budget) -> Result<()> {
        let _op = self.ops.begin_budgeted(label, Some(budget));
        let hold = crate::gpu::fault::stuck_hold();
        tracing::warn!("{label}: holding this thread for {hold:?} (HIPSCOPE_FAULT)");
        let t = Instant::now();
        while t.elapsed() < hold {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}
