//! Wall-clock times as the health endpoint and the command-line tool print them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for times before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `2026-11-22T10:00:00.123Z`: RFC 3339, in UTC, to the millisecond.
///
/// The same text as `humantime::format_rfc3339_millis` (checked by a test), which the library
/// cannot use in every build (`humantime` comes with the `cli` feature only) and which panics
/// on times before 1970 or after 9999; this clamps times before 1970 to the epoch.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// let t = UNIX_EPOCH + Duration::from_millis(1_795_341_600_123);
/// assert_eq!(incumbent::time::rfc3339(t), "2026-11-22T10:00:00.123Z");
/// ```
pub fn rfc3339(t: SystemTime) -> String {
    let unix_ms = unix_ms(t);
    let secs = unix_ms / 1000;
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(0));
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        unix_ms % 1000
    )
}

/// A duration for people: `12ms`, `1.5s`, `2m3s`, `4h5m`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(incumbent::time::human(Duration::from_millis(1500)), "1.5s");
/// ```
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 && !ms.is_multiple_of(1000) {
        format!("{:.1}s", d.as_secs_f64())
    } else if ms < 60_000 {
        format!("{}s", d.as_secs())
    } else if ms < 3_600_000 {
        format!("{}m{}s", d.as_secs() / 60, d.as_secs() % 60)
    } else {
        format!("{}h{}m", d.as_secs() / 3600, d.as_secs() % 3600 / 60)
    }
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_in_utc_with_milliseconds() {
        let at = |ms| rfc3339(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(at(1_795_341_600_123), "2026-11-22T10:00:00.123Z");
        assert_eq!(at(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    /// The calendar code agrees with `humantime`'s RFC 3339 formatting, from 1970 to 9999.
    #[cfg(feature = "cli")]
    #[test]
    fn timestamps_match_humantime() {
        const LAST_MS: u64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
        // Every day from 1970 to 9999, each at another time of day.
        for day in 0..=LAST_MS / 86_400_000 {
            let ms = day * 86_400_000 + (day * 7_919_001) % 86_400_000;
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(
                rfc3339(t),
                humantime::format_rfc3339_millis(t).to_string(),
                "{ms}"
            );
        }
        let last = UNIX_EPOCH + Duration::from_millis(LAST_MS);
        assert_eq!(rfc3339(last), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            rfc3339(last),
            humantime::format_rfc3339_millis(last).to_string()
        );
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339(before), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn durations_read_naturally() {
        let ms = Duration::from_millis;
        assert_eq!(human(ms(12)), "12ms");
        assert_eq!(human(ms(1500)), "1.5s");
        assert_eq!(human(ms(30_000)), "30s");
        assert_eq!(human(ms(123_000)), "2m3s");
        assert_eq!(human(ms(14_700_000)), "4h5m");
    }
}
