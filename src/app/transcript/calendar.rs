//! Dates for people and for file names, in UTC, without a time-zone library.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn parts(secs: u64) -> (i64, u32, u32, u64, u64, u64) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    (y, m, d, rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// `2026-11-22 14:15 UTC`
pub fn format_utc(secs: u64) -> String {
    let (y, m, d, h, min, _) = parts(secs);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02} UTC")
}

/// `20261122-141503`, for file names that sort by time.
pub fn file_stamp(secs: u64) -> String {
    let (y, m, d, h, min, s) = parts(secs);
    format!("{y:04}{m:02}{d:02}-{h:02}{min:02}{s:02}")
}
