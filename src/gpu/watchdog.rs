//! The hang watchdog. A thread that reads only the stream's lock-free in-flight table, the
//! kernels' breadcrumbs and the event prober's results: it makes no runtime call, takes no lock
//! the worker holds, and so keeps working when the worker — or the runtime — is stuck (KFD user
//! queues have no timeout of their own). States: OK, SLOW, HUNG for the oldest op in flight,
//! against that op's budget. On HUNG it hands an event to its sink and writes a report file.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::gpu::device::DeviceInfo;
use crate::gpu::snapshot::{WatchState, WatchdogSnapshot};
use crate::gpu::stream::{Budget, OpKind, OpRecord, StreamShared};
use crate::gpu::telemetry::{Roots, sysfs};

/// Watchdog settings.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchConfig {
    pub tick: Duration,
    /// An event query running longer than this means the runtime is not answering.
    pub probe_timeout: Duration,
    /// Where hang reports go (`None`: not written).
    pub report_dir: Option<PathBuf>,
    /// Completed ops listed in a report.
    pub recent_ops: usize,
    /// A snapshot goes to the sink at least this often, besides every state change.
    pub heartbeat: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            tick: Duration::from_millis(50),
            probe_timeout: Duration::from_secs(1),
            report_dir: default_report_dir(),
            recent_ops: 16,
            heartbeat: Duration::from_millis(500),
        }
    }
}

/// `reports/` in the data dir (`~/.local/share/hipscope/reports`, or under `HIPSCOPE_HOME`).
pub fn default_report_dir() -> Option<PathBuf> {
    crate::gpu::dirs::data_dir().map(|d| d.join("reports"))
}

/// What the watchdog tells its sink.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent {
    Snapshot(WatchdogSnapshot),
    /// Entered HUNG for this op (once per op).
    Hung {
        snapshot: WatchdogSnapshot,
        report_error: Option<String>,
    },
}

/// What the watchdog remembers between ticks.
#[derive(Clone, Debug, Default)]
pub struct WatchMemory {
    last_state: WatchState,
    last_head: u64,
    hung_reported: u64,
    report: Option<PathBuf>,
    report_error: Option<String>,
}

/// Where a watchdog's snapshots and hang events go, on the watchdog thread (send them on a
/// channel; never block in it).
pub type WatchSink = Box<dyn FnMut(WatchEvent) + Send>;

/// The one verdict on something in flight for `age`: HUNG from the budget's `hung` mark on, SLOW
/// from its `slow` mark on, else OK. The device's ops and a remote engine's request (whose
/// budget is [`halving`] its timeout) are judged by it alike.
pub fn verdict(age: Duration, budget: &Budget) -> WatchState {
    if age >= budget.hung {
        WatchState::Hung
    } else if age >= budget.slow {
        WatchState::Slow
    } else {
        WatchState::Ok
    }
}

/// A budget with one timeout: HUNG at `hung`, SLOW at half of it (a remote request's first-token
/// and between-token timeouts).
pub fn halving(hung: Duration) -> Budget {
    Budget {
        slow: hung / 2,
        hung,
    }
}

/// One evaluation: the oldest op in flight against its budget at time `now_ns` (ns since the
/// stream's epoch). Reads only atomics; folds the breadcrumb into `completed`.
pub fn evaluate(
    shared: &StreamShared,
    now_ns: u64,
    probe_timeout: Duration,
) -> (WatchdogSnapshot, Option<OpRecord>) {
    let crumb = shared.fold_breadcrumb();
    let enq = shared.enqueued();
    let comp = shared.completed();
    let busy = shared.probe_busy_since_ns.load(Ordering::Acquire);
    let stuck = busy != 0 && now_ns.saturating_sub(busy) > probe_timeout.as_nanos() as u64;
    let mut snap = WatchdogSnapshot {
        state: WatchState::Ok,
        stream: shared.name.clone(),
        op: None,
        age: Duration::ZERO,
        budget: Duration::ZERO,
        last_completed: shared.op(comp).map(|o| o.label),
        queue_depth: enq.saturating_sub(comp).min(u32::MAX as u64) as u32,
        report: None,
        report_error: None,
        op_started: false,
        event_queries_stuck: stuck,
    };
    if enq <= comp {
        return (snap, None);
    }
    let head = comp + 1;
    let Some(op) = shared.op(head) else {
        // Untracked op (tracking off): nothing to judge it by.
        return (snap, None);
    };
    // It became the oldest when it was enqueued or when its predecessor finished, whichever
    // came later.
    let since = op.enqueued_ns.max(shared.completed_at_ns());
    let age = Duration::from_nanos(now_ns.saturating_sub(since));
    // A replayed graph is named with the kernel inside it that has started (its breadcrumb).
    snap.op = Some(shared.op_label_now(&op));
    snap.age = age;
    snap.budget = op.budget.hung;
    // A host op is run by the thread that issued it: in flight means running.
    snap.op_started = op.kind == OpKind::Host || (crumb >= head && op.kind.writes_breadcrumb());
    snap.state = verdict(age, &op.budget);
    (snap, Some(op))
}

/// Facts for hang reports, read once when the watchdog starts (sysfs reads of a wedged GPU's
/// driver are best not attempted at hang time).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SystemFacts {
    pub device: DeviceInfo,
    pub kernel: String,
    /// `name = value` of amdgpu module parameters that matter for hangs.
    pub module_params: Vec<(String, String)>,
    /// `cardN/name = version` from `/sys/class/drm/card*/device/fw_version/*`.
    pub firmware: Vec<(String, String)>,
    pub env: Vec<(String, String)>,
}

impl SystemFacts {
    pub fn gather(device: &DeviceInfo) -> SystemFacts {
        Self::gather_from(device, &Roots::from_env().sys)
    }

    pub fn gather_from(device: &DeviceInfo, sys: &Path) -> SystemFacts {
        let roots = Roots {
            sys: sys.to_path_buf(),
            ..Roots::from_env()
        };
        let env = [
            "HSA_OVERRIDE_GFX_VERSION",
            "HIP_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES",
            "CUDA_VISIBLE_DEVICES",
            "HSA_ENABLE_SDMA",
        ]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
        SystemFacts {
            device: device.clone(),
            kernel: sysfs::kernel_release(&roots).unwrap_or_default(),
            // CWSR hang on gfx1151 (ROCm/ROCm#5590); MES firmware hangs (ROCm/ROCm#5724).
            module_params: sysfs::module_params(&roots),
            firmware: sysfs::firmware(&roots),
            env,
        }
    }
}

/// The text of a hang report.
pub fn report_text(
    facts: &SystemFacts,
    shared: &StreamShared,
    snap: &WatchdogSnapshot,
    recent: usize,
) -> String {
    let mut s = String::new();
    let d = &facts.device;
    let _ = writeln!(s, "hipscope hang report");
    let _ = writeln!(s, "pid: {}", std::process::id());
    let _ = writeln!(
        s,
        "time since stream start: {:.3} s",
        shared.now_ns() as f64 / 1e9
    );
    let _ = writeln!(s, "\n[device]");
    let _ = writeln!(s, "name: {}", d.name);
    let _ = writeln!(s, "arch: {} ({})", d.arch, d.arch_source);
    // No runtime: the CPU backend's own ops.
    let _ = writeln!(
        s,
        "backend: {}",
        d.backend.map(|b| b.name()).unwrap_or("cpu")
    );
    let _ = writeln!(s, "pci: {}", d.pci_bus_id.as_deref().unwrap_or("?"));
    let _ = writeln!(s, "driver: {}", d.driver_version);
    let _ = writeln!(s, "runtime: {}", d.runtime_version);
    let _ = writeln!(s, "kernel: {}", facts.kernel);
    for n in &d.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let _ = writeln!(s, "\n[watchdog]");
    let _ = writeln!(s, "state: {:?}", snap.state);
    let _ = writeln!(s, "stream: {}", snap.stream);
    let _ = writeln!(s, "op: {}", snap.op.as_deref().unwrap_or("-"));
    let _ = writeln!(
        s,
        "age: {:.3} s (budget {:.3} s)",
        snap.age.as_secs_f64(),
        snap.budget.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "op started (breadcrumb): {}",
        if snap.op_started { "yes" } else { "not seen" }
    );
    let _ = writeln!(s, "queue depth: {}", snap.queue_depth);
    let _ = writeln!(
        s,
        "event queries: {}",
        if snap.event_queries_stuck {
            "NOT RETURNING (runtime stuck; state from breadcrumbs)"
        } else {
            "answering"
        }
    );
    if let Some(e) = shared.probe_error.get() {
        let _ = writeln!(s, "event query error: {e}");
    }
    let _ = writeln!(s, "breadcrumb: {}", shared.read_breadcrumb());
    let _ = writeln!(
        s,
        "enqueued: {}  completed: {}",
        shared.enqueued(),
        shared.completed()
    );
    let _ = writeln!(s, "\n[in flight, oldest first]");
    for o in shared.in_flight(32) {
        let _ = writeln!(
            s,
            "#{} {} [{}] enqueued at {:.3} s",
            o.seq,
            o.label,
            o.kind.name(),
            o.enqueued_ns as f64 / 1e9
        );
    }
    let _ = writeln!(s, "\n[last completed]");
    for o in shared.recent_completed(recent) {
        let _ = writeln!(s, "#{} {} [{}]", o.seq, o.label, o.kind.name());
    }
    let _ = writeln!(s, "\n[amdgpu module parameters]");
    if facts.module_params.is_empty() {
        let _ = writeln!(s, "(none readable)");
    }
    for (k, v) in &facts.module_params {
        let _ = writeln!(s, "{k} = {v}");
    }
    let _ = writeln!(s, "\n[firmware]");
    if facts.firmware.is_empty() {
        let _ = writeln!(s, "(none readable)");
    }
    for (k, v) in &facts.firmware {
        let _ = writeln!(s, "{k} = {v}");
    }
    let _ = writeln!(s, "\n[environment]");
    for (k, v) in &facts.env {
        let _ = writeln!(s, "{k}={v}");
    }
    s
}

/// Writes a report under `dir` and returns its path.
pub fn write_report(dir: &Path, text: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let p = dir.join(format!("hang-{stamp}-{}.txt", std::process::id()));
    std::fs::write(&p, text)?;
    Ok(p)
}

/// One tick's decision, given the previous memory: what to emit.
pub fn step(
    mem: &mut WatchMemory,
    mut snap: WatchdogSnapshot,
    head: Option<&OpRecord>,
    now_ns: u64,
    last_emit_ns: u64,
    heartbeat: Duration,
    write: &mut dyn FnMut(&WatchdogSnapshot) -> Result<PathBuf, String>,
) -> Option<WatchEvent> {
    let head_seq = head.map(|h| h.seq).unwrap_or(0);
    if head_seq != mem.last_head {
        mem.report = None;
        mem.report_error = None;
    }
    snap.report = mem.report.clone();
    snap.report_error = mem.report_error.clone();
    let changed = snap.state != mem.last_state || head_seq != mem.last_head;
    mem.last_state = snap.state;
    mem.last_head = head_seq;
    if snap.state == WatchState::Hung && mem.hung_reported != head_seq {
        mem.hung_reported = head_seq;
        let (report, err) = match write(&snap) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        };
        mem.report = report.clone();
        mem.report_error = err.clone();
        snap.report = report;
        snap.report_error = err.clone();
        return Some(WatchEvent::Hung {
            snapshot: snap,
            report_error: err,
        });
    }
    if changed || now_ns.saturating_sub(last_emit_ns) >= heartbeat.as_nanos() as u64 {
        return Some(WatchEvent::Snapshot(snap));
    }
    None
}

/// The running watchdog thread.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching `shared`; `sink` receives snapshots and hang events on the watchdog
    /// thread. The thread stops when the `Watchdog` is stopped or dropped.
    pub fn spawn(
        shared: Arc<StreamShared>,
        device: &DeviceInfo,
        cfg: WatchConfig,
        mut sink: WatchSink,
    ) -> std::io::Result<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let facts = SystemFacts::gather(device);
        let handle = std::thread::Builder::new()
            .name("hipscope-watchdog".into())
            .spawn(move || {
                let mut mem = WatchMemory::default();
                let mut last_emit = 0u64;
                while !s2.load(Ordering::Acquire) {
                    let now = shared.now_ns();
                    let (snap, head) = evaluate(&shared, now, cfg.probe_timeout);
                    let mut write = |snap: &WatchdogSnapshot| -> Result<PathBuf, String> {
                        let dir = cfg
                            .report_dir
                            .as_ref()
                            .ok_or_else(|| "no data directory for reports".to_string())?;
                        let text = report_text(&facts, &shared, snap, cfg.recent_ops);
                        write_report(dir, &text).map_err(|e| format!("{}: {e}", dir.display()))
                    };
                    if let Some(ev) = step(
                        &mut mem,
                        snap,
                        head.as_ref(),
                        now,
                        last_emit,
                        cfg.heartbeat,
                        &mut write,
                    ) {
                        last_emit = now;
                        sink(ev);
                    }
                    std::thread::sleep(cfg.tick);
                }
            })?;
        Ok(Watchdog {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread (it never blocks, so this returns within a tick).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Watchdog {
    /// Waits at most one tick: the thread makes no runtime call and takes no lock.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::stream::{Budget, OpKind};

    fn op(seq: u64, label: &str, enq: u64, slow_ms: u64, hung_ms: u64) -> OpRecord {
        OpRecord {
            seq,
            label: label.into(),
            kind: OpKind::Kernel,
            enqueued_ns: enq,
            budget: Budget {
                slow: Duration::from_millis(slow_ms),
                hung: Duration::from_millis(hung_ms),
            },
        }
    }

    fn snap(state: WatchState) -> WatchdogSnapshot {
        WatchdogSnapshot {
            state,
            ..Default::default()
        }
    }

    #[test]
    fn hung_is_reported_once_per_op_with_the_report_path() {
        let mut mem = WatchMemory::default();
        let head = op(7, "layer 3 · ffn_down", 0, 10, 100);
        let writes = std::cell::Cell::new(0);
        let mut w = |_: &WatchdogSnapshot| {
            writes.set(writes.get() + 1);
            Ok(PathBuf::from("/tmp/r.txt"))
        };
        let hb = Duration::from_secs(100);
        let e = step(
            &mut mem,
            snap(WatchState::Slow),
            Some(&head),
            1,
            0,
            hb,
            &mut w,
        );
        assert!(matches!(e, Some(WatchEvent::Snapshot(s)) if s.state == WatchState::Slow));
        let e = step(
            &mut mem,
            snap(WatchState::Hung),
            Some(&head),
            2,
            1,
            hb,
            &mut w,
        );
        match e {
            Some(WatchEvent::Hung { snapshot, .. }) => {
                assert_eq!(snapshot.report, Some(PathBuf::from("/tmp/r.txt")))
            }
            other => panic!("expected Hung, got {other:?}"),
        }
        // Still hung: no second report, no event until the heartbeat.
        assert_eq!(
            step(
                &mut mem,
                snap(WatchState::Hung),
                Some(&head),
                3,
                2,
                hb,
                &mut w
            ),
            None
        );
        assert_eq!(writes.get(), 1);
        // The op finished; the next one is OK.
        let next = op(8, "layer 3 · add", 0, 10, 100);
        let e = step(
            &mut mem,
            snap(WatchState::Ok),
            Some(&next),
            4,
            3,
            hb,
            &mut w,
        );
        assert!(matches!(e, Some(WatchEvent::Snapshot(s)) if s.report.is_none()));
    }

    #[test]
    fn a_report_that_cannot_be_written_says_why_until_the_op_changes() {
        let mut mem = WatchMemory::default();
        let head = op(3, "load · stuck op", 0, 10, 100);
        let mut w = |_: &WatchdogSnapshot| Err("/ro/reports: read-only file system".to_string());
        let hb = Duration::from_secs(100);
        let e = step(
            &mut mem,
            snap(WatchState::Hung),
            Some(&head),
            1,
            0,
            hb,
            &mut w,
        );
        let Some(WatchEvent::Hung {
            snapshot,
            report_error,
        }) = e
        else {
            panic!("expected Hung, got {e:?}")
        };
        assert_eq!(snapshot.report, None);
        assert_eq!(snapshot.report_error, report_error);
        assert!(report_error.is_some_and(|e| e.contains("read-only")));
        // Later snapshots of the same op keep saying why (the banner shows it).
        let Some(WatchEvent::Snapshot(s)) = step(
            &mut mem,
            snap(WatchState::Hung),
            Some(&head),
            200,
            1,
            Duration::ZERO,
            &mut w,
        ) else {
            panic!("expected a heartbeat snapshot")
        };
        assert!(s.report_error.is_some());
        let next = op(4, "embed", 0, 10, 100);
        let e = step(
            &mut mem,
            snap(WatchState::Ok),
            Some(&next),
            300,
            200,
            hb,
            &mut w,
        );
        assert!(matches!(e, Some(WatchEvent::Snapshot(s)) if s.report_error.is_none()));
    }

    #[test]
    fn a_host_op_in_flight_has_started_and_turns_hung_on_its_budget() {
        let mut ts = crate::gpu::stream::TrackedStream::on_host("cpu");
        let l = ts.label("layer 15 · stuck op");
        let b = Budget {
            slow: Duration::from_millis(100),
            hung: Duration::from_millis(1000),
        };
        let _op = ts.host_op(l, Some(b));
        let shared = ts.shared().clone();
        let enq = shared.op(1).expect("op").enqueued_ns;
        let (s, _) = evaluate(&shared, enq + 1_500_000_000, Duration::from_secs(1));
        assert_eq!(s.state, WatchState::Hung);
        assert!(s.op_started, "a host op in flight is running");
        assert_eq!(s.op.as_deref(), Some("layer 15 · stuck op"));
    }

    #[test]
    fn the_verdict_changes_at_each_mark_of_the_budget() {
        let b = halving(Duration::from_secs(10));
        assert_eq!(b.slow, Duration::from_secs(5));
        let at = |ms: u64| verdict(Duration::from_millis(ms), &b);
        assert_eq!(at(4_999), WatchState::Ok);
        assert_eq!(at(5_000), WatchState::Slow);
        assert_eq!(at(9_999), WatchState::Slow);
        assert_eq!(at(10_000), WatchState::Hung);
    }

    #[test]
    fn states_follow_the_heads_budget() {
        let mut fake = crate::gpu::fake::FakeDevice::new(crate::gpu::fake::FakeScript::default());
        let mut ts = crate::gpu::stream::TrackedStream::new("x", &mut fake).expect("stream");
        let l = ts.label("layer 0 · matvec");
        let b = Budget {
            slow: Duration::from_millis(100),
            hung: Duration::from_millis(1000),
        };
        let seq = ts.begin(OpKind::Kernel, l, Some(b));
        ts.commit(seq);
        let shared = ts.shared().clone();
        let enq = shared.op(seq).expect("op").enqueued_ns;
        let pt = Duration::from_secs(1);
        let at = |ms: u64| evaluate(&shared, enq + ms * 1_000_000, pt).0;
        assert_eq!(at(50).state, WatchState::Ok);
        assert_eq!(at(150).state, WatchState::Slow);
        let h = at(1000);
        assert_eq!(h.state, WatchState::Hung);
        assert_eq!(h.op.as_deref(), Some("layer 0 · matvec"));
        assert_eq!(h.queue_depth, 1);
        assert_eq!(h.budget, Duration::from_millis(1000));
        shared.advance_completed(seq);
        assert_eq!(at(5000).state, WatchState::Ok);
        assert_eq!(at(5000).op, None);
    }

    #[test]
    fn system_facts_read_module_params_and_firmware_from_sysfs() {
        let root = std::env::temp_dir().join(format!("hipscope-sys-{}", std::process::id()));
        let p = root.join("module/amdgpu/parameters");
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::write(p.join("cwsr_enable"), "0\n").expect("write");
        let fw = root.join("class/drm/card1/device/fw_version");
        std::fs::create_dir_all(&fw).expect("mkdir");
        std::fs::write(fw.join("mes_fw_version"), "0x00000083\n").expect("write");
        std::fs::write(root.join("class/drm/card1/device/vendor"), "0x1002\n").expect("write");
        std::fs::create_dir_all(root.join("class/drm/card1-DP-1")).expect("mkdir");
        let f = SystemFacts::gather_from(&DeviceInfo::default(), &root);
        assert_eq!(f.module_params, vec![("cwsr_enable".into(), "0".into())]);
        assert_eq!(
            f.firmware,
            vec![("card1/mes_fw_version".into(), "0x00000083".into())]
        );
        let _ = std::fs::remove_dir_all(root);
    }
}
