//! Any bytes as stormglass's configuration, as `stormglass serve` loads it: the text before
//! the first NUL as a YAML file and as a TOML file, each line after it as an environment
//! override (`ASSEMBLY__IDLE=2s`: the key path split at `__`, lower-cased), merged into one
//! tree and typed into real sections (durations, sizes, paths, secrets), every bad key
//! reported. Never a panic, and typing always ends.
#![no_main]

use libfuzzer_sys::fuzz_target;

use stormglass_runtime::config_tree::{Format, parse, scalar, section, set};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (file, environment) = text.split_once('\0').unwrap_or((text, ""));
    for format in [Format::Yaml, Format::Toml] {
        let Ok(mut tree) = parse(file, format) else {
            continue;
        };
        for line in environment.lines() {
            if let Some((key, value)) = line.split_once('=') {
                let keys: Vec<String> = key.split("__").map(str::to_ascii_lowercase).collect();
                set(&mut tree, &keys, scalar(value));
            }
        }
        let serde_json::Value::Object(mut sections) = tree else {
            continue;
        };
        let mut errors = Vec::new();
        let _: stormglass_assembly::AssemblyConfig =
            section(&mut sections, "assembly", &mut errors);
        let _: stormglass_runtime::TlsConfig = section(&mut sections, "tls", &mut errors);
        let _: stormglass_runtime::AuthConfig = section(&mut sections, "auth", &mut errors);
    }
});
