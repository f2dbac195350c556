//! Facts about the host, for the device panel. Linux reads /proc; elsewhere they are unknown.

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

/// (total, available) host memory in bytes.
pub fn host_memory() -> Option<(u64, u64)> {
    #[cfg(target_os = "linux")]
    {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let field = |name: &str| -> Option<u64> {
            let line = info.lines().find(|l| l.starts_with(name))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        };
        Some((field("MemTotal:")?, field("MemAvailable:")?))
    }
    #[cfg(not(target_os = "linux"))]
    None
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
