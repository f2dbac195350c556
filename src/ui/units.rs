//! Human-readable numbers for the panels: bytes, durations, rates.

use std::time::Duration;

/// `1.5 GiB`, `512 MiB`, `12 KiB`, `900 B` (binary units, as `rocm-smi` and `nvtop` show memory).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else if value >= 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// `850 µs`, `12.3 ms`, `4.56 s`, `3m 12s`.
pub fn duration(d: Duration) -> String {
    let us = d.as_micros();
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 10_000 {
        format!("{:.2} ms", us as f64 / 1e3)
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1e3)
    } else if us < 60_000_000 {
        format!("{:.2} s", us as f64 / 1e6)
    } else {
        let s = d.as_secs();
        if s < 3600 {
            format!("{}m {:02}s", s / 60, s % 60)
        } else {
            format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
        }
    }
}

/// A rate with a unit suffix: `212 t/s`, `12.5 t/s`, `0.40 t/s`.
/// A duration to the second (`7 s`, `1m 05s`), for estimates.
pub fn duration_coarse(d: Duration) -> String {
    let s = d.as_secs_f64().ceil() as u64;
    if s < 60 {
        format!("{s} s")
    } else {
        duration(Duration::from_secs(s))
    }
}

pub fn rate(per_second: f64, unit: &str) -> String {
    if !per_second.is_finite() || per_second <= 0.0 {
        return format!("– {unit}");
    }
    if per_second >= 100.0 {
        format!("{per_second:.0} {unit}")
    } else if per_second >= 10.0 {
        format!("{per_second:.1} {unit}")
    } else {
        format!("{per_second:.2} {unit}")
    }
}

/// `12,345` — thousands separated, for token and op counts.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Parameter counts as model cards write them: `135M`, `7.2B`.
pub fn params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.0}M", n as f64 / 1e6)
    } else if n >= 1_000 {
        format!("{:.0}K", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

/// Share of `part` in `whole` as 0.0..=1.0 (0 when `whole` is 0).
pub fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(98_362_432), "93.8 MiB");
        assert_eq!(bytes(24 * 1024 * 1024 * 1024), "24.0 GiB");
        assert_eq!(bytes(512 * 1024 * 1024), "512 MiB");
    }

    #[test]
    fn durations_pick_a_readable_unit() {
        assert_eq!(duration(Duration::from_micros(850)), "850 µs");
        assert_eq!(duration(Duration::from_micros(1_500)), "1.50 ms");
        assert_eq!(duration(Duration::from_millis(123)), "123.0 ms");
        assert_eq!(duration(Duration::from_millis(4_560)), "4.56 s");
        assert_eq!(duration(Duration::from_secs(192)), "3m 12s");
        assert_eq!(duration(Duration::from_secs(7_500)), "2h 05m");
    }

    #[test]
    fn rates_and_counts() {
        assert_eq!(rate(212.4, "t/s"), "212 t/s");
        assert_eq!(rate(12.46, "t/s"), "12.5 t/s");
        assert_eq!(rate(0.4, "t/s"), "0.40 t/s");
        assert_eq!(rate(0.0, "t/s"), "– t/s");
        assert_eq!(rate(f64::NAN, "t/s"), "– t/s");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(params(134_515_008), "135M");
        assert_eq!(params(7_241_732_096), "7.2B");
    }
}
