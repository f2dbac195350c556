//! The host from `/proc`: CPU name, memory, CPU use. Linux reads /proc; elsewhere they are
//! unknown.

use std::path::PathBuf;

use super::{HostSample, Roots, Source, TelemetrySample};

/// The CPU's model name, e.g. `AMD EPYC 7B13`.
pub fn cpu_name() -> String {
    #[cfg(target_os = "linux")]
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo")
        && let Some(line) = info.lines().find(|l| l.starts_with("model name"))
        && let Some((_, name)) = line.split_once(':')
    {
        return name.trim().to_string();
    }
    std::env::consts::ARCH.to_string()
}

/// (total, available) host memory in bytes. What is available is also bounded by this
/// process's address-space limit (`ulimit -v`), less what it has mapped already: past that an
/// allocation fails, and Rust aborts on a failed allocation.
pub fn host_memory() -> Option<(u64, u64)> {
    #[cfg(target_os = "linux")]
    {
        let (total, avail) = parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
        Some((total, avail.min(address_space_left().unwrap_or(u64::MAX))))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Bytes this process may still map under `RLIMIT_AS`; `None` when there is no limit.
#[cfg(target_os = "linux")]
fn address_space_left() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())?
        * 1024;
    Some(lim.rlim_cur.saturating_sub(used))
}

/// (total, available) bytes from the text of `/proc/meminfo` (whose values are in KiB).
pub fn parse_meminfo(info: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kb.checked_mul(1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// The host's CPU time counters, summed over all cores, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every state counted, idle included.
    pub total: u64,
    /// Idle and waiting for I/O.
    pub idle: u64,
}

/// The aggregate `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq steal
/// (guest time is already inside user and nice, so it is not added again).
pub fn parse_cpu_times(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    let total = v.iter().try_fold(0u64, |a, &x| a.checked_add(x))?;
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some(CpuTimes { total, idle })
}

/// Percent of CPU time spent busy between two readings; `None` when no time passed or the
/// counters went backwards (a reading from another boot, or a broken file).
pub fn busy_percent(before: CpuTimes, after: CpuTimes) -> Option<f32> {
    let total = after.total.checked_sub(before.total)?;
    let idle = after.idle.checked_sub(before.idle)?;
    if total == 0 || idle > total {
        return None;
    }
    Some(((total - idle) as f64 * 100.0 / total as f64) as f32)
}

/// This process's CPU time (user + system, in clock ticks) from the text of `/proc/self/stat`;
/// the command name in parentheses may hold spaces and parentheses, so fields are counted from
/// the last `)` (utime and stime are fields 14 and 15).
pub fn parse_self_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    utime.checked_add(stime)
}

/// Reads the host's CPU use and memory each time it is asked; CPU use is over the time since
/// the previous call. On systems without `/proc` every field stays `None`.
#[derive(Debug)]
pub struct HostSampler {
    proc: PathBuf,
    prev: Option<CpuTimes>,
    prev_self: Option<u64>,
}

impl Default for HostSampler {
    fn default() -> Self {
        HostSampler::new(&Roots::default())
    }
}

impl HostSampler {
    pub fn new(roots: &Roots) -> HostSampler {
        HostSampler {
            proc: roots.proc.clone(),
            prev: None,
            prev_self: None,
        }
    }

    pub fn sample(&mut self) -> HostSample {
        let now = std::fs::read_to_string(self.proc.join("stat"))
            .ok()
            .and_then(|s| parse_cpu_times(&s));
        // Our own process, always the real one (a replayed tree has no hipscope in it).
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_self_ticks(&s));
        let cpu_pct = match (self.prev, now) {
            (Some(a), Some(b)) => busy_percent(a, b),
            _ => None,
        };
        // Both counters are in clock ticks, the machine's summed over every CPU: the share is
        // of the whole machine, as `cpu_pct` is.
        let own_cpu_pct = match (self.prev, now, self.prev_self, own) {
            (Some(a), Some(b), Some(x), Some(y)) => {
                let total = b.total.checked_sub(a.total).filter(|&t| t > 0);
                total
                    .zip(y.checked_sub(x))
                    .map(|(t, d)| ((d as f64 * 100.0 / t as f64) as f32).min(100.0))
            }
            _ => None,
        };
        if now.is_some() {
            self.prev = now;
        }
        if own.is_some() {
            self.prev_self = own;
        }
        let mem = std::fs::read_to_string(self.proc.join("meminfo"))
            .ok()
            .and_then(|s| parse_meminfo(&s));
        HostSample {
            cpu_pct,
            own_cpu_pct,
            mem_used: mem.map(|(total, avail)| total.saturating_sub(avail)),
            mem_total: mem.map(|(total, _)| total),
        }
    }
}

/// The host's CPU use and memory, as a telemetry source.
pub struct HostSource(HostSampler);

impl HostSource {
    pub fn new(roots: &Roots) -> HostSource {
        HostSource(HostSampler::new(roots))
    }
}

impl Source for HostSource {
    fn name(&self) -> &'static str {
        "/proc host"
    }

    fn sample(&mut self, out: &mut TelemetrySample) {
        out.host = self.0.sample();
    }
}

/// SIMD features the dot products can use, e.g. `x86_64 avx2 fma f16c`.
pub fn simd_features() -> String {
    let mut s = std::env::consts::ARCH.to_string();
    #[cfg(target_arch = "x86_64")]
    for (name, on) in [
        ("avx2", std::arch::is_x86_feature_detected!("avx2")),
        ("fma", std::arch::is_x86_feature_detected!("fma")),
        ("f16c", std::arch::is_x86_feature_detected!("f16c")),
        ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
    ] {
        if on {
            s.push(' ');
            s.push_str(name);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  4705 356 584 3699 23 0 27 5 11 0\n\
                        cpu0 1393 280 260 1846 10 0 13 2 5 0\n\
                        intr 114930548 113199788 3 0 5\n";

    #[test]
    fn cpu_line_sums_the_eight_states_and_counts_iowait_as_idle() {
        let t = parse_cpu_times(STAT).unwrap();
        assert_eq!(t.total, 4705 + 356 + 584 + 3699 + 23 + 27 + 5);
        assert_eq!(t.idle, 3699 + 23);
        // Old kernels print only four fields.
        let old = parse_cpu_times("cpu 10 0 5 85\n").unwrap();
        assert_eq!((old.total, old.idle), (100, 85));
        assert_eq!(parse_cpu_times("cpu0 1 2 3 4\n"), None, "no aggregate line");
        assert_eq!(parse_cpu_times("cpu 1 2 x 4\n"), None);
        assert_eq!(parse_cpu_times("cpu 1 2\n"), None);
        assert_eq!(
            parse_cpu_times(&format!("cpu {} 1 0 0\n", u64::MAX)),
            None,
            "overflow"
        );
    }

    #[test]
    fn busy_percent_is_the_share_of_non_idle_ticks() {
        let a = CpuTimes {
            total: 1000,
            idle: 800,
        };
        let b = CpuTimes {
            total: 1400,
            idle: 900,
        };
        assert_eq!(busy_percent(a, b), Some(75.0));
        assert_eq!(busy_percent(a, a), None, "no time passed");
        assert_eq!(busy_percent(b, a), None, "counters went backwards");
    }

    #[test]
    fn own_cpu_time_is_read_after_the_command_name() {
        // A command name with a space and a parenthesis; utime 1500, stime 250.
        let stat = "4242 (my (odd) app) S 1 4242 4242 0 -1 4194560 900 0 0 0 1500 250 0 0 20 0 \
                    3 0 12345 1000000 500 18446744073709551615";
        assert_eq!(parse_self_ticks(stat), Some(1750));
        assert_eq!(parse_self_ticks("4242 (x) S 1 2"), None);
        assert_eq!(parse_self_ticks("no parenthesis"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn own_cpu_use_is_counted_while_this_process_works() {
        let mut s = HostSampler::default();
        s.sample();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(400) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let h = s.sample();
        let own = h.own_cpu_pct.expect("a second reading gives a share");
        let all = h.cpu_pct.expect("a second reading gives a share");
        assert!(own > 0.0, "a busy thread uses CPU: {own}");
        // This process is part of the machine (a tick of slack between the two files).
        assert!(own <= all + 5.0, "own {own}% > machine {all}%");
    }

    #[test]
    fn meminfo_is_read_in_kib() {
        let info = "MemTotal:       24568248 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(info),
            Some((24_568_248 * 1024, 20_000_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_sampler_agrees_with_sysinfo() {
        // sysinfo(2) is a second way to the kernel's memory total. A container may show a
        // smaller /proc/meminfo (lxcfs), never a larger one; a unit slip would be 1024× off.
        let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::sysinfo(&mut info) }, 0);
        let total = info.totalram as u64 * u64::from(info.mem_unit);
        let mut s = HostSampler::default();
        let first = s.sample();
        assert_eq!(first.cpu_pct, None, "one reading is not a rate");
        let mem_total = first.mem_total.unwrap();
        assert!(
            total / 64 < mem_total && mem_total <= total,
            "{mem_total} vs {total}"
        );
        assert!(first.mem_used.unwrap() < mem_total);
        // Burn some CPU so that ticks pass between the readings.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let pct = s.sample().cpu_pct.expect("a rate from the second reading");
        assert!((0.0..=100.0).contains(&pct), "{pct}");
    }
}
