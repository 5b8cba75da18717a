//! Wall-clock timestamps, RFC 3339 in UTC with milliseconds (`2026-11-22T10:00:00.000Z`).
//!
//! Timing rules never use this clock (they use tokio's, which tests can pause); it only stamps
//! events and provenance. `Timestamp::now` and `Timestamp::now_unix_micros` are the places
//! toolwarden reads the wall clock.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in wall-clock time with millisecond precision, kept as milliseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The current wall-clock time.
    #[allow(clippy::disallowed_methods)] // the one clock function of toolwarden
    pub fn now() -> Self {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => Self(d.as_millis() as i64),
            Err(e) => Self(-(e.duration().as_millis() as i64)),
        }
    }

    /// The current wall-clock time in microseconds since the Unix epoch (for a clock that derives
    /// many stamps from one reading and a monotonic clock).
    #[allow(clippy::disallowed_methods)] // the one clock function of toolwarden
    pub fn now_unix_micros() -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_micros() as i64,
            Err(e) => -(e.duration().as_micros() as i64),
        }
    }

    /// From microseconds since the Unix epoch (rounded down to the millisecond).
    pub const fn from_unix_micros(us: i64) -> Self {
        Self(us.div_euclid(1000))
    }

    /// From milliseconds since the Unix epoch.
    pub const fn from_unix_millis(ms: i64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn unix_millis(self) -> i64 {
        self.0
    }

    /// This time plus a duration (saturating).
    pub fn plus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fff...](Z|±HH:MM)`.
    pub fn parse(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() < 20
            || b[4] != b'-'
            || b[7] != b'-'
            || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ')
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<i64> {
            let part = s.get(r)?;
            if !part.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            part.parse().ok()
        };
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
            return None;
        }
        let mut i = 19;
        let mut millis = 0i64;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                if i - start < 3 {
                    millis = millis * 10 + i64::from(b[i] - b'0');
                }
                i += 1;
            }
            if i == start {
                return None;
            }
            for _ in (i - start)..3 {
                millis *= 10;
            }
        }
        let offset_min = match b.get(i) {
            Some(b'Z' | b'z') if i + 1 == b.len() => 0,
            Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
                let oh = num(i + 1..i + 3)?;
                let om = num(i + 4..i + 6)?;
                let m = oh * 60 + om;
                if *sign == b'+' { m } else { -m }
            }
            _ => return None,
        };
        let days = days_from_civil(y, mo, d);
        let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60;
        Some(Self(secs * 1000 + millis))
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of `days_from_civil`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

impl Timestamp {
    /// Year, month, day, hour, minute, second and millisecond (UTC).
    fn fields(&self) -> [i64; 7] {
        let secs = self.0.div_euclid(1000);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
        [
            y,
            m,
            d,
            sod / 3600,
            (sod / 60) % 60,
            sod % 60,
            self.0.rem_euclid(1000),
        ]
    }

    /// The RFC 3339 text of a time in the years 0 to 9999 (`2026-11-24T21:47:04.225Z`), written
    /// digit by digit: every event carries one or more, and the formatting machinery of `write!`
    /// cost several times as much. `None` outside those years.
    fn rfc3339(&self) -> Option<[u8; 24]> {
        let fields = self.fields();
        if !(0..=9999).contains(&fields[0]) {
            return None;
        }
        let mut out = *b"0000-00-00T00:00:00.000Z";
        // Where each field's digits start in `out`, and how many there are.
        const PLACES: [(usize, usize); 7] =
            [(0, 4), (5, 2), (8, 2), (11, 2), (14, 2), (17, 2), (20, 3)];
        for ((at, width), value) in PLACES.into_iter().zip(fields) {
            let mut v = value;
            for i in (at..at + width).rev() {
                out[i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        }
        Some(out)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(text) = self.rfc3339()
            && let Ok(text) = std::str::from_utf8(&text)
        {
            return f.write_str(text);
        }
        let [y, m, d, h, mi, s, ms] = self.fields();
        write!(f, "{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if let Some(text) = self.rfc3339()
            && let Ok(text) = std::str::from_utf8(&text)
        {
            return s.serialize_str(text);
        }
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("invalid RFC 3339 timestamp {s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(
            Timestamp::from_unix_millis(0).to_string(),
            "1970-01-01T00:00:00.000Z"
        );
        assert_eq!(
            Timestamp::from_unix_millis(1_795_341_600_123).to_string(),
            "2026-11-22T10:00:00.123Z"
        );
        assert_eq!(
            Timestamp::from_unix_millis(951_782_400_000).to_string(),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn parses_offsets_and_fractions() {
        let t = Timestamp::parse("2026-11-22T11:00:00.5+01:00").unwrap();
        assert_eq!(t.to_string(), "2026-11-22T10:00:00.500Z");
        assert!(Timestamp::parse("2026-13-01T00:00:00Z").is_none());
        assert!(Timestamp::parse("yesterday").is_none());
    }

    /// The text of `ms` as `write!` makes it: what the digit-by-digit writer must match.
    fn formatted(ms: i64) -> String {
        let secs = ms.div_euclid(1000);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
            sod / 3600,
            (sod / 60) % 60,
            sod % 60,
            ms.rem_euclid(1000)
        )
    }

    proptest! {
        #[test]
        fn written_digit_by_digit_as_write_would(ms in -70_000_000_000_000i64..300_000_000_000_000i64) {
            let t = Timestamp::from_unix_millis(ms);
            let expected = formatted(ms);
            prop_assert_eq!(t.to_string(), expected.clone());
            prop_assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{expected}\""));
        }

        #[test]
        fn display_parse_roundtrip(ms in -62_135_596_800_000i64..253_402_300_799_999i64) {
            let t = Timestamp::from_unix_millis(ms);
            prop_assert_eq!(Timestamp::parse(&t.to_string()), Some(t));
        }
    }
}
