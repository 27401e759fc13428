//! Durations as people write them: `500ms`, `10s`, `1.5s`, `2m`, `1h`, `1m30s`, `1h 30min`
//! (parsed by `humantime`), up to [`MAX`].

use std::time::Duration;

const HINT: &str = "write a number and a unit (ms, s, m, h or d), e.g. 500ms, 10s, 2m or 1m30s";

/// The longest duration any option accepts: longer ones are mistakes (and would overflow
/// the clock arithmetic they feed).
pub const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration (`0` needs no unit), refusing anything longer than [`MAX`].
pub fn parse(text: &str) -> Result<Duration, String> {
    use humantime::DurationError as E;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("the duration is empty; {HINT}"));
    }
    match humantime::parse_duration(trimmed) {
        Ok(d) if d > MAX => Err(format!(
            "`{trimmed}` is out of range: at most {}d (a year) is accepted",
            MAX.as_secs() / 86_400
        )),
        Ok(d) => Ok(d),
        Err(E::NumberOverflow) => Err(format!(
            "`{trimmed}` is out of range: at most {}d (a year) is accepted",
            MAX.as_secs() / 86_400
        )),
        Err(E::UnknownUnit { unit, .. }) if unit.is_empty() => {
            Err(format!("`{trimmed}` has no unit; {HINT}"))
        }
        Err(E::UnknownUnit { unit, .. }) => {
            Err(format!("`{trimmed}`: unknown unit `{unit}`; {HINT}"))
        }
        Err(_) => Err(format!("`{trimmed}` is not a duration; {HINT}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_forms_parse() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1h 30min"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("365d"), Ok(MAX));
    }

    #[test]
    fn bad_forms_say_what_to_write() {
        for (text, hint) in [
            ("10", "no unit"),
            ("abc", "not a duration"),
            ("10x", "unknown unit"),
            ("", "empty"),
            ("-1s", "not a duration"),
            ("999999999999h", "out of range"),
            ("366d", "out of range"),
            ("99999999999999999999999s", "out of range"),
            ("18446744073709551615s", "out of range"),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.contains(hint), "{text}: {error}");
        }
    }
}
