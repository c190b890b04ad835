//! Byte sizes as people write them on a command line: `512MiB`, `8GiB`, `8G`, `1.5GiB`, `4096`.
//!
//! Parsing is delegated to the `parse-size` crate configured for binary units, so `8G` means
//! 8 GiB, as in `free -g`, `ls -h` and every RAM-sizing conversation; bare numbers are bytes.

use thiserror::Error;

/// A size string that could not be understood.
#[derive(Debug, Error)]
#[error("invalid size {input:?}: {reason} (examples: 512MiB, 8GiB, 8G, 1073741824)")]
pub struct SizeError {
    input: String,
    reason: String,
}

/// Most digits accepted (leading zeros aside). `parse-size` 1.1.0 overflows (a panic in debug
/// builds, a silently wrong value such as 0 in release builds) on a number whose first 20 digits
/// are `u64::MAX` and that has a 21st (found by fuzzing). `u64::MAX` itself has 20 digits, so a
/// number with more cannot be a byte count anyway: it is refused before the crate sees it.
const MAX_SIGNIFICANT_DIGITS: usize = 20;

/// Parses a human size such as `512MiB`, `8GiB`, `8G` or `1073741824` into bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let error = |reason: String| SizeError {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if significant_digits(text) > MAX_SIGNIFICANT_DIGITS {
        return Err(error(format!(
            "more than {MAX_SIGNIFICANT_DIGITS} significant digits"
        )));
    }
    parse_size::Config::new()
        .with_binary()
        .parse_size(text)
        .map_err(|reason| error(reason.to_string()))
}

/// Digits in `text`, leading zeros aside. All of them, not just a leading run: the crate reads
/// a number across `.`, `_` and whitespace (`1 024`), and units hold no digits.
fn significant_digits(text: &str) -> usize {
    text.chars()
        .filter(char::is_ascii_digit)
        .skip_while(|&c| c == '0')
        .count()
}

/// Formats bytes for people: `1.50 GiB`, `512.00 MiB`, `4096 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_the_cli_promises() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("8g").unwrap(), 8 << 30);
        assert_eq!(parse_size("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_size(" 16 GiB ").unwrap(), 16 << 30);
    }

    #[test]
    fn rejects_nonsense_with_a_helpful_message() {
        for bad in ["", "lots", "-1G", "8X", "GiB"] {
            let err = parse_size(bad).unwrap_err().to_string();
            assert!(err.contains("invalid size"), "{bad}: {err}");
            assert!(err.contains("512MiB"), "{bad}: {err}");
        }
    }

    /// Regression (fuzz targets `parse_size` and `control_parse`, seeds
    /// `fuzz/corpus/{parse_size,control_parse}/regress-mantissa-overflow`): parse-size 1.1.0 rounds
    /// a 21st significant digit with an unchecked `mantissa += 1`, which overflows when the first
    /// 20 digits are exactly `u64::MAX`: a panic with overflow checks (debug, tests, fuzzing), and a
    /// silent wrap to 0 in release builds, so `ram-cache 184467440737095516157` set a 0-byte budget.
    #[test]
    fn mantissa_overflow_is_an_error() {
        for big in [
            "184467440737095516157",
            "184467440737095516159",
            "18446744073709551615.9",
        ] {
            assert!(parse_size(big).is_err(), "{big}");
        }
        // Far below one byte: must not panic (0 or an error are both fine).
        let _ = parse_size("0.000000184467440737095516159");
        // Found by fuzzing after the first fix: digits split by spaces still form one number
        // for the crate, and zeros after the point do not count against it.
        assert!(parse_size("00184467440737       095   516159").is_err());
        assert!(parse_size(&format!("0.{}184467440737095516159", "0".repeat(40))).is_err());
        // The largest plain byte count still parses.
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(100), "100 B");
        assert_eq!(format_size(512 << 20), "512.00 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}
