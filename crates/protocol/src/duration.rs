//! Durations and sizes as the config file writes them.
//!
//! Durations are strings with units (`"250ms"`, `"30s"`, `"2m"`, `"1h"`, `"1d"`, also `"1m30s"`,
//! `"1.5s"` and every unit spelled out: `"5 seconds"`, `"2 minutes"`, `"1.5 hours"`) or integer
//! seconds. Sizes are strings with units (`"64KiB"`, `"1MiB"`, `"10MB"`) or integer bytes.
//! Negative values parse, so that the config loader can say what is wrong with them: a negative
//! duration is an error there (it would silently turn a limit off), a negative count or size a
//! warning (docs/CONFIG.md).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a duration or size string did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    input: String,
    expected: &'static str,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} {:?}", self.expected, self.input)?;
        match self.expected {
            "duration" => f.write_str(
                ": expected a number with a unit — ms, s, m, h or d, or spelled out: millisecond(s), sec(s) or second(s), min(s) or minute(s), hr(s) or hour(s), day(s) — (e.g. \"250ms\", \"30s\", \"2m\", \"1m30s\", \"1.5 hours\") or integer seconds",
            ),
            _ => f.write_str(
                ": expected a number with a unit B, KB, KiB, MB, MiB, GB or GiB (e.g. \"64KiB\", \"1MiB\") or integer bytes",
            ),
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses a duration string into signed milliseconds.
pub fn parse_duration(s: &str) -> Result<i64, ParseError> {
    let err = || ParseError {
        input: s.to_owned(),
        expected: "duration",
    };
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(rest) => (true, rest.trim_start()),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if body.is_empty() {
        return Err(err());
    }
    // A bare number is seconds.
    if body.bytes().all(|c| c.is_ascii_digit()) {
        let secs: i64 = body.parse().map_err(|_| err())?;
        let ms = secs.checked_mul(1000).ok_or_else(err)?;
        return Ok(if neg { -ms } else { ms });
    }
    let mut total: f64 = 0.0;
    let mut rest = body;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(err());
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1.0,
            "s" | "sec" | "secs" | "second" | "seconds" => 1_000.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
            "d" | "day" | "days" => 86_400_000.0,
            _ => return Err(err()),
        };
        total += n * factor;
        rest = rest[unit_len..].trim_start();
    }
    if !total.is_finite() || total > i64::MAX as f64 / 2.0 {
        return Err(err());
    }
    let ms = total.round() as i64;
    Ok(if neg { -ms } else { ms })
}

/// Formats a duration the way the config writes it: the largest unit that divides it evenly.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".to_owned()
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

/// Parses a size string into signed bytes.
pub fn parse_size(s: &str) -> Result<i64, ParseError> {
    let err = || ParseError {
        input: s.to_owned(),
        expected: "size",
    };
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(rest) => (true, rest.trim_start()),
        None => (false, t),
    };
    let num_len = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    if num_len == 0 {
        return Err(err());
    }
    let n: f64 = body[..num_len].parse().map_err(|_| err())?;
    let factor: f64 = match body[num_len..].trim() {
        "" | "B" | "b" => 1.0,
        "KB" | "kB" | "kb" => 1e3,
        "MB" | "mb" => 1e6,
        "GB" | "gb" => 1e9,
        "KiB" | "K" | "k" => 1024.0,
        "MiB" | "M" => 1024.0 * 1024.0,
        "GiB" | "G" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(err()),
    };
    let bytes = n * factor;
    if !bytes.is_finite() || bytes > i64::MAX as f64 / 2.0 {
        return Err(err());
    }
    let b = bytes.round() as i64;
    Ok(if neg { -b } else { b })
}

/// A duration as written in the config: signed milliseconds, so that a negative value can be
/// reported (and treated as `0`) rather than rejected by the parser.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DurationValue(pub i64);

impl DurationValue {
    /// From an unsigned duration.
    pub fn from_duration(d: Duration) -> Self {
        Self(d.as_millis().min(i64::MAX as u128) as i64)
    }

    /// Whether the written value was negative.
    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The duration, with negative values treated as zero.
    pub fn duration(self) -> Duration {
        Duration::from_millis(self.0.max(0) as u64)
    }
}

impl Serialize for DurationValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 < 0 {
            s.collect_str(&format_args!(
                "-{}",
                format_duration(Duration::from_millis(self.0.unsigned_abs()))
            ))
        } else {
            s.serialize_str(&format_duration(self.duration()))
        }
    }
}

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a duration such as \"250ms\", \"30s\", \"2m\", \"1h\" or integer seconds",
                )
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                v.checked_mul(1000)
                    .map(DurationValue)
                    .ok_or_else(|| E::custom(format!("duration {v}s is out of range")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .ok()
                    .and_then(|v| v.checked_mul(1000))
                    .map(DurationValue)
                    .ok_or_else(|| E::custom(format!("duration {v}s is out of range")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                if v.is_finite() && v.abs() < 1e15 {
                    Ok(DurationValue((v * 1000.0).round() as i64))
                } else {
                    Err(E::custom(format!("duration {v}s is out of range")))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                parse_duration(v).map(DurationValue).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A size in bytes as written in the config (signed, see [`DurationValue`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SizeValue(pub i64);

impl SizeValue {
    /// The size, with negative values treated as zero.
    pub fn bytes(self) -> u64 {
        self.0.max(0) as u64
    }
}

impl Serialize for SizeValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(self.0)
    }
}

impl<'de> Deserialize<'de> for SizeValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SizeValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64KiB\", \"1MiB\" or integer bytes")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(SizeValue(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(SizeValue)
                    .map_err(|_| E::custom("size out of range"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                parse_size(v).map(SizeValue).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("250ms", 250),
            ("30s", 30_000),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1m30s", 90_000),
            ("1.5s", 1_500),
            ("0", 0),
            ("45", 45_000),
            ("-5s", -5_000),
            (" 10s ", 10_000),
            // Every unit spelled out, singular or plural, with or without a space.
            ("5 seconds", 5_000),
            ("1 second", 1_000),
            ("5 sec", 5_000),
            ("1.5 min", 90_000),
            ("2 minutes", 120_000),
            ("5 hrs", 18_000_000),
            ("1.5 hours", 5_400_000),
            ("1 hour 30 minutes", 5_400_000),
            ("2 days", 172_800_000),
            ("300 milliseconds", 300),
            ("20msec", 20),
        ];
        for (input, ms) in cases {
            assert_eq!(parse_duration(input), Ok(ms), "{input}");
        }
        for bad in [
            "",
            "s",
            "10x",
            "ten seconds",
            "1..2s",
            "-",
            "5 secondss",
            "5 weeks",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} should not parse");
        }
        assert_eq!(
            parse_duration("10x").unwrap_err().to_string(),
            "invalid duration \"10x\": expected a number with a unit — ms, s, m, h or d, or spelled out: millisecond(s), sec(s) or second(s), min(s) or minute(s), hr(s) or hour(s), day(s) — (e.g. \"250ms\", \"30s\", \"2m\", \"1m30s\", \"1.5 hours\") or integer seconds"
        );
    }

    #[test]
    fn formatting_picks_the_largest_even_unit() {
        for (ms, s) in [
            (0, "0s"),
            (250, "250ms"),
            (30_000, "30s"),
            (120_000, "2m"),
            (90_000, "90s"),
            (3_600_000, "1h"),
        ] {
            assert_eq!(format_duration(Duration::from_millis(ms)), s);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn duration_values_from_integers_keep_their_sign() {
        let v: DurationValue = serde_json::from_str("-3").unwrap();
        assert!(v.is_negative());
        assert_eq!(v.duration(), Duration::ZERO);
        let v: DurationValue = serde_json::from_str("\"2m\"").unwrap();
        assert_eq!(v.duration(), Duration::from_secs(120));
        assert_eq!(serde_json::to_string(&v).unwrap(), "\"2m\"");
    }
}
