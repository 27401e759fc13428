//! Durations as people write them: `500ms`, `10s`, `1.5s`, `2m`, `1h`, `1m30s`.

use std::time::Duration;

const HINT: &str = "write a number and a unit (ms, s, m or h), e.g. 500ms, 10s, 2m or 1m30s";

/// Parses one or more `<number><unit>` parts and adds them up.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("the duration is empty; {HINT}"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a duration; {HINT}"))?;
        let seconds = match unit {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            "" => return Err(format!("`{text}` has no unit; {HINT}")),
            other => return Err(format!("`{text}`: unknown unit `{other}`; {HINT}")),
        };
        total += Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("`{text}` is out of range; {HINT}"))?;
        rest = next;
    }
    Ok(total)
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
    }

    #[test]
    fn bad_forms_say_what_to_write() {
        for (text, hint) in [
            ("10", "no unit"),
            ("abc", "not a duration"),
            ("10x", "unknown unit"),
            ("", "empty"),
            ("-1s", "not a duration"),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.contains(hint), "{text}: {error}");
        }
    }
}
