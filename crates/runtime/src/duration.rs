//! Serde for durations in humantime form (`10s`, `1m 30s`, `250ms`), as config files and
//! `STORMGLASS_*` variables write them.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "{e} in {text:?} (write durations like 10s, 250ms, 1m)"
        ))
    })
}

pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*value).to_string())
}
