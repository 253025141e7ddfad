//! Sampling: how many spans one kept span stands for.
//!
//! OpenTelemetry's probability sampling writes its rejection threshold into the W3C
//! tracestate, in the `ot` vendor entry: `ot=th:T`, `T` 1 to 14 lower-case hex digits, the
//! most significant digits of a 56-bit threshold (trailing zeros dropped). A span is kept
//! when its 56-bit randomness is at least the threshold, so the sampling probability is
//! `(2^56 - T) / 2^56` and the span's adjusted count is its inverse. `th:0` keeps every
//! span (adjusted count 1). See the OpenTelemetry specification, "TraceState: Probability
//! Sampling".

/// 2^56, the threshold's range.
const MAX_THRESHOLD: f64 = 72_057_594_037_927_936.0;

/// The adjusted count the tracestate's `ot=th:` threshold gives, or `None` when it carries
/// none (or an unreadable one).
pub fn adjusted_count(tracestate: &str) -> Option<f64> {
    let ot = tracestate
        .split(',')
        .map(str::trim)
        .find_map(|member| member.strip_prefix("ot="))?;
    let th = ot.split(';').find_map(|field| field.strip_prefix("th:"))?;
    if th.is_empty() || th.len() > 14 || !th.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let digits = u64::from_str_radix(th, 16).ok()?;
    let threshold = (digits << (4 * (14 - th.len()))) as f64;
    let kept = MAX_THRESHOLD - threshold;
    (kept > 0.0).then(|| MAX_THRESHOLD / kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's examples: th:0 keeps all, th:8 half, th:c a quarter; other
    /// vendors' entries and fields are skipped; malformed thresholds read as none.
    #[test]
    fn thresholds_to_adjusted_counts() {
        assert_eq!(adjusted_count("ot=th:0"), Some(1.0));
        assert_eq!(adjusted_count("ot=th:8"), Some(2.0));
        assert_eq!(adjusted_count("vendor=x,ot=rv:abc;th:c"), Some(4.0));
        let one_percent = adjusted_count("ot=th:fd70a4").unwrap();
        assert!((one_percent - 100.0).abs() < 0.01, "{one_percent}");
        assert_eq!(adjusted_count(""), None);
        assert_eq!(adjusted_count("ot=rv:abcdef"), None);
        assert_eq!(adjusted_count("ot=th:xyz"), None);
        assert_eq!(adjusted_count("ot=th:123456789abcdef"), None, "15 digits");
    }
}
