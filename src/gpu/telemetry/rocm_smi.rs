//! AMD GPUs through rocm-smi (`librocm_smi64`, loaded at run time with `libloading`), a second
//! source beside sysfs: its readings fill only what sysfs, hwmon and `gpu_metrics` left out
//! ([`merge`]), matched to the card by PCI address, and are credited to `rocm-smi`.
//!
//! Device calls are made only after `rsmi_init` succeeded: on Debian's 5.2.3 a device call after a
//! failed init segfaults. [`RocmSmiSource`] can only be built from a successful init, so no code
//! path reaches a device call without one. A failed init writes to stderr ("Failed to open drm
//! root directory…", 5.2.3); that text is captured ([`stderr_captured`]) and reported, never left
//! on a terminal the TUI owns.
//!
//! Signatures and constants checked against `rocm_smi.h` of Debian's librocm-smi-dev 5.2.3-2
//! (`/usr/include/rocm_smi/rocm_smi.h`) and of ROCm/rocm_smi_lib at a1295714 (2024-10, library
//! 7.x as shipped with ROCm 6.x). Unchanged between them for every call here, except
//! `rsmi_frequencies_t`, which gained a leading `bool has_deep_sleep` in library 7.0 (ROCm 6.0,
//! rocm_smi_lib commit 3d40c4b): [`Frequencies`] reads it by the library's major version.
//! Units (same header): temperatures in millidegrees C, power in microwatts, clocks in Hz, fan
//! speed relative to `RSMI_MAX_FAN_SPEED` (255), memory in bytes.

use std::ffi::{CStr, c_char};
use std::mem::ManuallyDrop;

use libloading::Library;
use serde::Serialize;

use super::{GpuReading, Source, TelemetrySample};

/// Library names to try, newest first (ROCm 6/7, 5.x, Debian's 5.2.3).
pub const LIBRARY_NAMES: &[&str] = &[
    "librocm_smi64.so.7",
    "librocm_smi64.so.6",
    "librocm_smi64.so.5",
    "librocm_smi64.so.1",
];

/// `rsmi_status_t` (a C enum; `RSMI_STATUS_UNKNOWN_ERROR` is 0xFFFFFFFF, so unsigned).
type Status = u32;
const SUCCESS: Status = 0;

/// `rsmi_status_t` names, by value (rocm_smi.h, both versions).
fn status_name(s: Status) -> &'static str {
    match s {
        0 => "RSMI_STATUS_SUCCESS",
        1 => "RSMI_STATUS_INVALID_ARGS",
        2 => "RSMI_STATUS_NOT_SUPPORTED",
        3 => "RSMI_STATUS_FILE_ERROR",
        4 => "RSMI_STATUS_PERMISSION",
        5 => "RSMI_STATUS_OUT_OF_RESOURCES",
        6 => "RSMI_STATUS_INTERNAL_EXCEPTION",
        7 => "RSMI_STATUS_INPUT_OUT_OF_BOUNDS",
        8 => "RSMI_STATUS_INIT_ERROR",
        9 => "RSMI_STATUS_NOT_YET_IMPLEMENTED",
        10 => "RSMI_STATUS_NOT_FOUND",
        11 => "RSMI_STATUS_INSUFFICIENT_SIZE",
        12 => "RSMI_STATUS_INTERRUPT",
        13 => "RSMI_STATUS_UNEXPECTED_SIZE",
        14 => "RSMI_STATUS_NO_DATA",
        15 => "RSMI_STATUS_UNEXPECTED_DATA",
        16 => "RSMI_STATUS_BUSY",
        17 => "RSMI_STATUS_REFCOUNT_OVERFLOW",
        _ => "RSMI_STATUS_UNKNOWN_ERROR",
    }
}

// rsmi_memory_type_t, rsmi_temperature_type_t, rsmi_temperature_metric_t, rsmi_clk_type_t.
const MEM_VRAM: u32 = 0;
const MEM_VIS_VRAM: u32 = 1;
const MEM_GTT: u32 = 2;
const TEMP_EDGE: u32 = 0;
const TEMP_JUNCTION: u32 = 1;
const TEMP_MEMORY: u32 = 2;
const TEMP_CURRENT: u32 = 0;
const CLK_SYS: u32 = 0;
const CLK_MEM: u32 = 4;
/// `RSMI_MAX_NUM_FREQUENCIES`.
const MAX_FREQS: usize = 32;
/// `RSMI_MAX_FAN_SPEED`.
const MAX_FAN: f32 = 255.0;

/// `rsmi_version_t`.
#[repr(C)]
struct Version {
    major: u32,
    minor: u32,
    patch: u32,
    build: *const c_char,
}

/// Room for either layout of `rsmi_frequencies_t`: `{u32 num_supported; u32 current; u64
/// frequency[32]}` (264 bytes, library < 7) or with a leading `bool has_deep_sleep` (272 bytes,
/// library ≥ 7; `num_supported` at 4, `frequency` at 16 by C alignment).
#[repr(C, align(8))]
struct Frequencies([u8; 272]);

impl Frequencies {
    fn u32_at(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().unwrap_or([0; 4]))
    }

    /// The current frequency in Hz, read by the layout of library major version `major`; `None`
    /// when the indices make no sense (a layout mismatch reads as nonsense, not as a clock).
    fn current_hz(&self, major: u32) -> Option<u64> {
        let (num, cur, freqs) = if major >= 7 { (4, 8, 16) } else { (0, 4, 8) };
        let (n, c) = (self.u32_at(num) as usize, self.u32_at(cur) as usize);
        if n == 0 || n > MAX_FREQS || c >= n {
            return None;
        }
        let off = freqs + 8 * c;
        let hz = u64::from_ne_bytes(self.0[off..off + 8].try_into().ok()?);
        (hz > 0).then_some(hz)
    }
}

/// Why rocm-smi gives nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RsmiError {
    #[error("librocm_smi64 not found (tried {})", LIBRARY_NAMES.join(", "))]
    NotFound,
    #[error("{library} lacks {symbol}: not a rocm-smi library hipscope knows")]
    Symbol {
        library: String,
        symbol: &'static str,
    },
    #[error("rsmi_init failed: {name} ({code}){}", said_suffix(.said))]
    Init {
        code: Status,
        name: &'static str,
        /// What the library wrote to stderr while it failed.
        said: String,
    },
    #[error("rsmi_num_monitor_devices failed: {0}")]
    Count(&'static str),
}

fn said_suffix(said: &str) -> String {
    let s = said.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.is_empty() {
        String::new()
    } else {
        format!(": it said {s:?}")
    }
}

type InitFn = unsafe extern "C" fn(u64) -> Status;
type VoidFn = unsafe extern "C" fn() -> Status;
type CountFn = unsafe extern "C" fn(*mut u32) -> Status;
type VersionFn = unsafe extern "C" fn(*mut Version) -> Status;
type U64Fn = unsafe extern "C" fn(u32, *mut u64) -> Status;
type U32Fn = unsafe extern "C" fn(u32, *mut u32) -> Status;
type NameFn = unsafe extern "C" fn(u32, *mut c_char, usize) -> Status;
type MemFn = unsafe extern "C" fn(u32, u32, *mut u64) -> Status;
type TempFn = unsafe extern "C" fn(u32, u32, u32, *mut i64) -> Status;
type SensorU64Fn = unsafe extern "C" fn(u32, u32, *mut u64) -> Status;
type SensorI64Fn = unsafe extern "C" fn(u32, u32, *mut i64) -> Status;
type ClkFn = unsafe extern "C" fn(u32, u32, *mut Frequencies) -> Status;

/// The loaded library: the calls every version has are required, the device readings optional
/// (a missing one is a reading left out).
pub struct RocmSmi {
    // Never unloaded: a GPU library's destructors are best not run mid-process.
    _lib: ManuallyDrop<Library>,
    /// The name that loaded, e.g. `librocm_smi64.so.1`.
    pub soname: &'static str,
    /// `rsmi_version_get`: (major, minor, patch).
    pub version: Option<(u32, u32, u32)>,
    initialised: bool,
    init: InitFn,
    shut_down: VoidFn,
    num_devices: CountFn,
    pci_id: Option<U64Fn>,
    name: Option<NameFn>,
    busy: Option<U32Fn>,
    mem_busy: Option<U32Fn>,
    mem_total: Option<MemFn>,
    mem_usage: Option<MemFn>,
    temp: Option<TempFn>,
    power_ave: Option<SensorU64Fn>,
    socket_power: Option<U64Fn>,
    power_cap: Option<SensorU64Fn>,
    clk: Option<ClkFn>,
    fan_rpms: Option<SensorI64Fn>,
    fan_speed: Option<SensorI64Fn>,
}

fn opt<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    // SAFETY: each caller names T as the symbol's exact C signature from rocm_smi.h.
    unsafe {
        lib.get::<T>(format!("{name}\0").as_bytes())
            .ok()
            .map(|s| *s)
    }
}

impl RocmSmi {
    /// Loads the first library name that loads and reads its version (no init yet).
    pub fn load() -> Result<RocmSmi, RsmiError> {
        let (lib, soname) = LIBRARY_NAMES
            .iter()
            // SAFETY: loading runs the library's initialisers, which only set up its state.
            .find_map(|n| unsafe { Library::new(*n) }.ok().map(|l| (l, *n)))
            .ok_or(RsmiError::NotFound)?;
        let need = |symbol: &'static str| RsmiError::Symbol {
            library: soname.into(),
            symbol,
        };
        let init = opt::<InitFn>(&lib, "rsmi_init").ok_or_else(|| need("rsmi_init"))?;
        let shut_down =
            opt::<VoidFn>(&lib, "rsmi_shut_down").ok_or_else(|| need("rsmi_shut_down"))?;
        let num_devices = opt::<CountFn>(&lib, "rsmi_num_monitor_devices")
            .ok_or_else(|| need("rsmi_num_monitor_devices"))?;
        let version = opt::<VersionFn>(&lib, "rsmi_version_get").and_then(|f| {
            let mut v = Version {
                major: 0,
                minor: 0,
                patch: 0,
                build: std::ptr::null(),
            };
            // SAFETY: fills the struct with constants; needs no init (rocm_smi.cc).
            (unsafe { f(&mut v) } == SUCCESS).then_some((v.major, v.minor, v.patch))
        });
        Ok(RocmSmi {
            soname,
            version,
            initialised: false,
            init,
            shut_down,
            num_devices,
            pci_id: opt(&lib, "rsmi_dev_pci_id_get"),
            name: opt(&lib, "rsmi_dev_name_get"),
            busy: opt(&lib, "rsmi_dev_busy_percent_get"),
            mem_busy: opt(&lib, "rsmi_dev_memory_busy_percent_get"),
            mem_total: opt(&lib, "rsmi_dev_memory_total_get"),
            mem_usage: opt(&lib, "rsmi_dev_memory_usage_get"),
            temp: opt(&lib, "rsmi_dev_temp_metric_get"),
            power_ave: opt(&lib, "rsmi_dev_power_ave_get"),
            socket_power: opt(&lib, "rsmi_dev_current_socket_power_get"),
            power_cap: opt(&lib, "rsmi_dev_power_cap_get"),
            clk: opt(&lib, "rsmi_dev_gpu_clk_freq_get"),
            fan_rpms: opt(&lib, "rsmi_dev_fan_rpms_get"),
            fan_speed: opt(&lib, "rsmi_dev_fan_speed_get"),
            _lib: ManuallyDrop::new(lib),
        })
    }

    /// `1.0.0`, or `unknown`.
    pub fn version_string(&self) -> String {
        match self.version {
            Some((a, b, c)) => format!("{a}.{b}.{c}"),
            None => "unknown".into(),
        }
    }

    /// `rsmi_init(0)`, then the number of devices it monitors.
    pub fn initialise(&mut self) -> Result<u32, RsmiError> {
        // SAFETY: rsmi_init takes flags only; 0 is the default behaviour.
        let (code, said) = stderr_captured(|| unsafe { (self.init)(0) });
        if code != SUCCESS {
            return Err(RsmiError::Init {
                code,
                name: status_name(code),
                said,
            });
        }
        if !said.trim().is_empty() {
            tracing::debug!("rocm-smi said while starting: {}", said.trim());
        }
        self.initialised = true;
        let mut n = 0u32;
        // SAFETY: after a successful init; writes one u32.
        let s = unsafe { (self.num_devices)(&mut n) };
        if s != SUCCESS {
            return Err(RsmiError::Count(status_name(s)));
        }
        Ok(n)
    }

    /// A device's PCI BDFID (known to the library since init; reads no sensor).
    fn bdf(&self, i: u32) -> Option<u64> {
        let f = self.pci_id?;
        let mut v = 0u64;
        // SAFETY: after a successful init, device index below the count, one u64 written.
        (self.initialised && unsafe { f(i, &mut v) } == SUCCESS).then_some(v)
    }

    /// One device's readings. Only reachable after [`RocmSmi::initialise`] succeeded.
    fn read_device(&self, i: u32) -> RsmiReading {
        debug_assert!(self.initialised);
        if !self.initialised {
            return RsmiReading::default();
        }
        let major = self.version.map_or(0, |v| v.0);
        // SAFETY (every call below): after a successful init, a device index below the count,
        // and an out pointer to a value of the type rocm_smi.h names.
        let one = |f: Option<U64Fn>| {
            let f = f?;
            let mut v = 0u64;
            (unsafe { f(i, &mut v) } == SUCCESS).then_some(v)
        };
        let pct = |f: Option<U32Fn>| {
            let f = f?;
            let mut v = 0u32;
            (unsafe { f(i, &mut v) } == SUCCESS).then_some(v)
        };
        let mem = |f: Option<MemFn>, kind: u32| {
            let f = f?;
            let mut v = 0u64;
            (unsafe { f(i, kind, &mut v) } == SUCCESS).then_some(v)
        };
        let temp = |sensor: u32| {
            let f = self.temp?;
            let mut v = 0i64;
            (unsafe { f(i, sensor, TEMP_CURRENT, &mut v) } == SUCCESS).then_some(v)
        };
        // Sensor 0: the first power sensor and fan, as rocm-smi's own tool reads them.
        let sensor_u64 = |f: Option<SensorU64Fn>| {
            let f = f?;
            let mut v = 0u64;
            (unsafe { f(i, 0, &mut v) } == SUCCESS).then_some(v)
        };
        let sensor_i64 = |f: Option<SensorI64Fn>| {
            let f = f?;
            let mut v = 0i64;
            (unsafe { f(i, 0, &mut v) } == SUCCESS).then_some(v)
        };
        let clk = |kind: u32| {
            let f = self.clk?;
            let mut fr = Frequencies([0; 272]);
            // `fr` has room for either layout of rsmi_frequencies_t.
            if unsafe { f(i, kind, &mut fr) } != SUCCESS {
                return None;
            }
            fr.current_hz(major)
        };
        let name = self.name.and_then(|f| {
            let mut buf = [0 as c_char; 128];
            // Writes at most `len` bytes.
            if unsafe { f(i, buf.as_mut_ptr(), buf.len()) } != SUCCESS {
                return None;
            }
            buf[127] = 0;
            // NUL-terminated within the buffer (its last byte forced to 0).
            let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
            Some(s.to_string_lossy().trim().to_string())
        });
        RsmiReading {
            index: i,
            bdf: one(self.pci_id),
            name: name.filter(|n| !n.is_empty()),
            busy_pct: pct(self.busy),
            mem_busy_pct: pct(self.mem_busy),
            vram_total: mem(self.mem_total, MEM_VRAM),
            vram_used: mem(self.mem_usage, MEM_VRAM),
            vis_vram_total: mem(self.mem_total, MEM_VIS_VRAM),
            vis_vram_used: mem(self.mem_usage, MEM_VIS_VRAM),
            gtt_total: mem(self.mem_total, MEM_GTT),
            gtt_used: mem(self.mem_usage, MEM_GTT),
            temp_edge_mc: temp(TEMP_EDGE),
            temp_junction_mc: temp(TEMP_JUNCTION),
            temp_mem_mc: temp(TEMP_MEMORY),
            power_uw: sensor_u64(self.power_ave).or_else(|| one(self.socket_power)),
            power_cap_uw: sensor_u64(self.power_cap),
            sclk_hz: clk(CLK_SYS),
            mclk_hz: clk(CLK_MEM),
            fan_rpm: sensor_i64(self.fan_rpms),
            fan_speed: sensor_i64(self.fan_speed),
        }
    }
}

impl Drop for RocmSmi {
    fn drop(&mut self) {
        if self.initialised {
            // SAFETY: pairs the successful rsmi_init.
            unsafe { (self.shut_down)() };
        }
    }
}

/// Runs `f` with file descriptor 2 pointed at a temporary file, and returns what was written
/// there. Used around `rsmi_init`, which prints its failures: on a terminal the TUI owns they
/// would land in the middle of the screen. Output of other threads in that instant is captured
/// too (and logged with it); if the redirection cannot be set up, `f` runs as it is.
pub fn stderr_captured<R>(f: impl FnOnce() -> R) -> (R, String) {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    // One redirection at a time: two interleaved ones would restore each other's file.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(mut tmp) = tempfile::tempfile() else {
        return (f(), String::new());
    };
    // SAFETY: dup of our own stderr; checked below.
    let saved = unsafe { libc::dup(2) };
    if saved < 0 {
        return (f(), String::new());
    }
    // SAFETY: both descriptors are open; fd 2 is restored below on every path.
    if unsafe { libc::dup2(tmp.as_raw_fd(), 2) } < 0 {
        unsafe { libc::close(saved) };
        return (f(), String::new());
    }
    let r = f();
    // SAFETY: `saved` is the original stderr.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let mut said = String::new();
    if tmp.rewind().is_ok() {
        let _ = tmp.take(16 << 10).read_to_string(&mut said);
    }
    (r, said)
}

/// One device as rocm-smi reports it, in the library's own units; every reading an `Option`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RsmiReading {
    pub index: u32,
    /// `rsmi_dev_pci_id_get`'s BDFID.
    pub bdf: Option<u64>,
    pub name: Option<String>,
    pub busy_pct: Option<u32>,
    pub mem_busy_pct: Option<u32>,
    pub vram_used: Option<u64>,
    pub vram_total: Option<u64>,
    pub vis_vram_used: Option<u64>,
    pub vis_vram_total: Option<u64>,
    pub gtt_used: Option<u64>,
    pub gtt_total: Option<u64>,
    pub temp_edge_mc: Option<i64>,
    pub temp_junction_mc: Option<i64>,
    pub temp_mem_mc: Option<i64>,
    pub power_uw: Option<u64>,
    pub power_cap_uw: Option<u64>,
    pub sclk_hz: Option<u64>,
    pub mclk_hz: Option<u64>,
    pub fan_rpm: Option<i64>,
    /// 0–255 of the fan's maximum.
    pub fan_speed: Option<i64>,
}

/// A BDFID as sysfs writes the address: `((domain & 0xffffffff) << 32) | (bus << 8) |
/// (device << 3) | function` (bits 28–31, the partition id of ROCm 6, are left out).
pub fn bdf_string(id: u64) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        id >> 32,
        (id >> 8) & 0xff,
        (id >> 3) & 0x1f,
        id & 0x7
    )
}

/// Fills what `g` lacks from `r` (converted to the app's units) and credits it to rocm-smi.
pub fn merge(g: &mut GpuReading, r: &RsmiReading) {
    let before = g.present();
    let c = |mc: Option<i64>| mc.map(|v| v as f32 / 1000.0);
    let mhz = |hz: Option<u64>| hz.and_then(|h| u32::try_from(h / 1_000_000).ok());
    let watts = |uw: Option<u64>| uw.filter(|&v| v > 0).map(|v| v as f32 / 1e6);
    g.gpu_util_pct = g.gpu_util_pct.or(r.busy_pct.map(|v| v as f32));
    g.mem_util_pct = g.mem_util_pct.or(r.mem_busy_pct.map(|v| v as f32));
    g.vram_used = g.vram_used.or(r.vram_used);
    g.vram_total = g.vram_total.or(r.vram_total);
    g.vis_vram_used = g.vis_vram_used.or(r.vis_vram_used);
    g.vis_vram_total = g.vis_vram_total.or(r.vis_vram_total);
    g.gtt_used = g.gtt_used.or(r.gtt_used);
    g.gtt_total = g.gtt_total.or(r.gtt_total);
    g.temp_edge_c = g.temp_edge_c.or(c(r.temp_edge_mc));
    g.temp_junction_c = g.temp_junction_c.or(c(r.temp_junction_mc));
    g.temp_mem_c = g.temp_mem_c.or(c(r.temp_mem_mc));
    g.power_w = g.power_w.or(watts(r.power_uw));
    g.power_cap_w = g.power_cap_w.or(watts(r.power_cap_uw));
    g.sclk_mhz = g.sclk_mhz.or(mhz(r.sclk_hz));
    g.mclk_mhz = g.mclk_mhz.or(mhz(r.mclk_hz));
    g.fan_rpm = g.fan_rpm.or(r.fan_rpm.and_then(|v| u32::try_from(v).ok()));
    g.fan_pct = g.fan_pct.or(r
        .fan_speed
        .filter(|v| (0..=255).contains(v))
        .map(|v| v as f32 * 100.0 / MAX_FAN));
    g.credit(&before, "rocm-smi");
}

/// Whether the device at `bdf` may be read: not when sysfs found its card runtime-suspended
/// (reading its sensors would wake it, as sysfs's own reader avoids).
pub fn may_read(out: &TelemetrySample, bdf: Option<u64>) -> bool {
    let pci = bdf.map(bdf_string);
    !out.gpus
        .iter()
        .any(|g| g.suspended && pci.is_some() && g.pci == pci)
}

/// Merges every device into the sample: into the GPU with its PCI address, else (a card sysfs
/// did not list) as a GPU of its own, `rsmiN`.
pub fn merge_all(out: &mut TelemetrySample, readings: &[RsmiReading]) {
    for r in readings {
        let pci = r.bdf.map(bdf_string);
        let found = out
            .gpus
            .iter_mut()
            .find(|g| g.vendor == "amd" && pci.is_some() && g.pci == pci);
        match found {
            Some(g) => merge(g, r),
            None => {
                let mut g = GpuReading {
                    id: format!("rsmi{}", r.index),
                    vendor: "amd".into(),
                    name: r
                        .name
                        .clone()
                        .unwrap_or_else(|| format!("AMD GPU (rocm-smi {})", r.index)),
                    pci,
                    ..Default::default()
                };
                merge(&mut g, r);
                out.gpus.push(g);
            }
        }
    }
}

/// The sampler's rocm-smi source: built only from a successful `rsmi_init`.
pub struct RocmSmiSource {
    smi: RocmSmi,
    devices: u32,
}

impl RocmSmiSource {
    /// Loads and initialises the library; any failure means no source.
    pub fn open() -> Result<RocmSmiSource, RsmiError> {
        let mut smi = RocmSmi::load()?;
        match smi.initialise() {
            Ok(devices) => Ok(RocmSmiSource { smi, devices }),
            Err(e) => {
                tracing::debug!("rocm-smi ({}): {e}", smi.soname);
                Err(e)
            }
        }
    }

    pub fn devices(&self) -> u32 {
        self.devices
    }
}

impl Source for RocmSmiSource {
    fn name(&self) -> &'static str {
        "rocm-smi"
    }

    fn sample(&mut self, out: &mut TelemetrySample) {
        let readings: Vec<RsmiReading> = (0..self.devices)
            .filter(|&i| may_read(out, self.smi.bdf(i)))
            .map(|i| self.smi.read_device(i))
            .collect();
        merge_all(out, &readings);
    }
}

/// What `doctor` says about rocm-smi: which library loaded, its version, and what `rsmi_init`
/// answered (the device count, or the failure with what the library printed).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Probe {
    pub soname: String,
    pub version: String,
    pub devices: Option<u32>,
    pub error: Option<String>,
}

/// Loads and initialises rocm-smi once, for the report; `None` when no library loads.
pub fn probe() -> Option<Probe> {
    let mut smi = match RocmSmi::load() {
        Ok(s) => s,
        Err(RsmiError::NotFound) => return None,
        Err(e) => {
            return Some(Probe {
                soname: String::new(),
                version: "unknown".into(),
                devices: None,
                error: Some(e.to_string()),
            });
        }
    };
    let r = smi.initialise();
    Some(Probe {
        soname: smi.soname.into(),
        version: smi.version_string(),
        devices: r.as_ref().ok().copied(),
        error: r.err().map(|e| e.to_string()),
    })
}

#[cfg(test)]
mod tests;
