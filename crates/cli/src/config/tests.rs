use std::time::Duration;

use super::*;

/// The example configuration (docs/configuration.md shows an excerpt), every key at its
/// default, or commented out where unset by default.
const EXAMPLE_YAML: &str = include_str!("../../stormglass.example.yaml");

/// A file holding `text`, removed when the guard drops; its name ends in `name` because
/// the loader picks the format by extension.
fn write(name: &str, text: &str) -> tempfile::TempPath {
    let path = tempfile::Builder::new()
        .prefix("stormglass-config-")
        .suffix(name)
        .tempfile()
        .unwrap()
        .into_temp_path();
    std::fs::write(&path, text).unwrap();
    path
}

/// No file, no environment: the embedded defaults of docs/configuration.md.
#[test]
fn defaults() {
    let config = load(None, [], &vec![]).unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.listen.grpc.to_string(), "127.0.0.1:4317");
    assert_eq!(config.assembly.idle, Duration::from_secs(10));
}

/// The configuration's analysis thresholds default to the analysis's own defaults.
#[test]
fn threshold_defaults_are_the_analysis_defaults() {
    assert_eq!(Config::default().params(), Params::default());
}

/// The example file loads and equals the defaults it documents.
#[test]
fn example_config_is_the_defaults() {
    let path = write("example.yaml", EXAMPLE_YAML);
    assert_eq!(load(Some(&*path), [], &vec![]).unwrap(), Config::default());
}

/// `limits.memory` takes a size (file or environment) or `auto`; `auto` is 80% of the
/// cgroup's limit, 1 GiB without one; a set size wins over the cgroup; a word that is
/// neither is an error naming the key.
#[test]
fn memory_limit_auto_or_size() {
    let env = |v: &str| vec![("STORMGLASS_LIMITS__MEMORY".to_owned(), v.to_owned())];
    let sized = load(None, env("256MiB"), &vec![]).unwrap().limits.memory;
    assert_eq!(sized, MemoryLimit::Bytes(bytesize::ByteSize::mib(256)));
    assert_eq!(sized.resolve(Some(1 << 30)).0, 256 << 20);
    let file = write("memory.yaml", "limits:\n  memory: 1073741824\n");
    let bytes = load(Some(&*file), [], &vec![]).unwrap().limits.memory;
    assert_eq!(bytes, MemoryLimit::Bytes(bytesize::ByteSize::gib(1)));
    let auto = load(None, env("auto"), &vec![]).unwrap().limits.memory;
    assert_eq!(auto, MemoryLimit::Auto);
    assert_eq!(auto.resolve(Some(1000 << 20)).0, 800 << 20);
    assert_eq!(auto.resolve(None).0, 1 << 30);
    for bad in ["lots", "8MiB"] {
        let error = load(None, env(bad), &vec![]).unwrap_err().to_string();
        assert!(error.contains("limits.memory"), "{bad}: {error}");
    }
}

/// A section whose keys are all commented out is the defaults; a trace link template
/// without `{trace_id}` is an error naming the key.
#[test]
fn links_section() {
    let empty = write("links-empty.yaml", "links:\n  # trace_url: x\n");
    assert_eq!(load(Some(&*empty), [], &vec![]).unwrap(), Config::default());
    let tempo = write(
        "links.yaml",
        "links:\n  trace_url: http://tempo:3200/trace/{trace_id}\n",
    );
    let config = load(Some(&*tempo), [], &vec![]).unwrap();
    assert_eq!(
        config.links.trace_url.as_deref(),
        Some("http://tempo:3200/trace/{trace_id}")
    );
    let bad = write(
        "links-bad.yaml",
        "links:\n  trace_url: http://tempo/trace\n",
    );
    let errors = load(Some(&*bad), [], &vec![]).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors:?}");
    assert_eq!(errors.0[0].0, "links.trace_url");
}

/// YAML and TOML spell the same configuration.
#[test]
fn yaml_and_toml_agree() {
    let yaml = write(
        "a.yaml",
        "assembly:\n  idle: 2s\n  max_spans: 10\nlisten:\n  grpc: 127.0.0.1:0\n",
    );
    let toml = write(
        "a.toml",
        "[assembly]\nidle = \"2s\"\nmax_spans = 10\n[listen]\ngrpc = \"127.0.0.1:0\"\n",
    );
    let a = load(Some(&*yaml), [], &vec![]).unwrap();
    assert_eq!(a, load(Some(&*toml), [], &vec![]).unwrap());
    assert_eq!(a.assembly.idle, Duration::from_secs(2));
    assert_eq!(a.assembly.max_spans, 10);
    assert_eq!(a.listen.grpc.port(), 0);
}

/// Environment beats the file, flags beat the environment.
#[test]
fn override_order() {
    let path = write(
        "b.yaml",
        "assembly:\n  idle: 2s\nlisten:\n  http: 127.0.0.1:1\n",
    );
    let env = [
        ("STORMGLASS_ASSEMBLY__IDLE".to_owned(), "3s".to_owned()),
        ("STORMGLASS_ASSEMBLY__MAX_SPANS".to_owned(), "7".to_owned()),
        (
            "STORMGLASS_LISTEN__HTTP".to_owned(),
            "127.0.0.1:2".to_owned(),
        ),
        ("OTHER".to_owned(), "x".to_owned()),
        // Tool switches, not keys: must not fail as unknown sections.
        ("STORMGLASS_QUERY_TIMINGS".to_owned(), "1".to_owned()),
        ("STORMGLASS_QUERY_PLANS".to_owned(), "edges".to_owned()),
    ];
    let flags = vec![("listen.http", "127.0.0.1:3".to_owned())];
    let config = load(Some(&*path), env, &flags).unwrap();
    assert_eq!(config.assembly.idle, Duration::from_secs(3));
    assert_eq!(config.assembly.max_spans, 7);
    assert_eq!(config.listen.http.port(), 3);
}

/// Every problem is reported at once, each naming its key.
#[test]
fn errors_name_their_keys() {
    let path = write(
        "bad.yaml",
        "assembly:\n  idle: soon\nlisten:\n  grpc: nowhere\nlimits:\n  max_request_bytes: 0\n  receiver_nice: 20\nanalytic:\n  x: 1\n",
    );
    let env = [("STORMGLASS_ASSEMBLY__IDEL".to_owned(), "1s".to_owned())];
    let errors = load(Some(&*path), env, &vec![]).unwrap_err();
    let keys: Vec<&str> = errors.0.iter().map(|(k, _)| k.as_str()).collect();
    assert!(keys.contains(&"listen.grpc"), "{errors}");
    assert!(keys.contains(&"limits.max_request_bytes"), "{errors}");
    assert!(keys.contains(&"limits.receiver_nice"), "{errors}");
    assert!(keys.contains(&"analytic"), "{errors}");
    assert!(keys.contains(&"assembly.idle"), "{errors}");
    assert!(keys.contains(&"assembly.idel"), "{errors}");
    assert_eq!(keys.len(), 6, "{errors}");
    assert!(
        errors.to_string().contains("(found \"nowhere\")"),
        "{errors}"
    );
}

/// The `alerts` section holds thresholds and receivers side by side; receivers come from
/// the file or, comma-separated, from the environment, and bad ones name their key.
#[test]
fn alert_receivers_and_thresholds_share_a_section() {
    let path = write(
        "alerts.yaml",
        "alerts:\n  amplification: 3\n  alertmanagers: [http://127.0.0.1:9093]\n  labels: {source: stormglass}\n",
    );
    let config = load(Some(&*path), [], &vec![]).unwrap();
    assert_eq!(config.alerts.amplification, 3.0);
    assert_eq!(config.notify.alertmanagers, ["http://127.0.0.1:9093"]);
    assert_eq!(config.notify.labels["source"], "stormglass");
    let env = [(
        "STORMGLASS_ALERTS__WEBHOOKS".to_owned(),
        "http://a/hook, http://b/hook".to_owned(),
    )];
    let config = load(None, env, &vec![]).unwrap();
    assert_eq!(config.notify.webhooks, ["http://a/hook", "http://b/hook"]);

    let bad = write(
        "bad-alerts.yaml",
        "alerts:\n  alertmanagers: [ftp://am:9093]\n  resend_interval: often\n  amplificaton: 2\n  bearer_token: t\n  basic_auth: {username: u, password: p}\n",
    );
    let errors = load(Some(&*bad), [], &vec![]).unwrap_err();
    let keys: Vec<&str> = errors.0.iter().map(|(k, _)| k.as_str()).collect();
    assert!(keys.contains(&"alerts.alertmanagers.0"), "{errors}");
    assert!(keys.contains(&"alerts.resend_interval"), "{errors}");
    assert!(keys.contains(&"alerts.amplificaton"), "{errors}");
    assert!(keys.contains(&"alerts.basic_auth"), "{errors}");
    assert!(
        !errors.to_string().contains("p}"),
        "secrets are not echoed: {errors}"
    );
}

/// `alerts.for` replaces one alert's hold, from the file or the environment (whose keys
/// are lower case); a name that is no alert, or a duration that is none, names its key.
#[test]
fn alert_holds_by_name() {
    let amplification = stormglass_analytics::alerts::DEFINITIONS
        .iter()
        .find(|d| d.name == "StormglassRetryAmplificationHigh")
        .unwrap();
    let env = [(
        "STORMGLASS_ALERTS__FOR__STORMGLASSRETRYAMPLIFICATIONHIGH".to_owned(),
        "0s".to_owned(),
    )];
    let config = load(None, env, &vec![]).unwrap();
    assert_eq!(config.alerts.hold(amplification), Duration::ZERO);
    assert_eq!(
        Config::default().alerts.hold(amplification),
        Duration::from_secs(120)
    );
    let path = write(
        "holds.yaml",
        "alerts:\n  for: {StormglassRetryAmplificationHigh: 30s}\n",
    );
    let config = load(Some(&*path), [], &vec![]).unwrap();
    assert_eq!(config.alerts.hold(amplification), Duration::from_secs(30));

    let bad = write(
        "holds-bad.yaml",
        "alerts:\n  for: {StormglassRetryAmplificationHi: 0s}\n",
    );
    let errors = load(Some(&*bad), [], &vec![]).unwrap_err();
    assert_eq!(
        errors.0[0].0, "alerts.for.StormglassRetryAmplificationHi",
        "{errors}"
    );
    let bad = write(
        "holds-word.yaml",
        "alerts:\n  for: {StormglassDown: soon}\n",
    );
    let errors = load(Some(&*bad), [], &vec![]).unwrap_err();
    assert!(errors.0[0].0.starts_with("alerts.for"), "{errors}");
}

/// Sampling ratios come per service from the file or the environment (whose keys are
/// lower case); a ratio outside (0, 1] names its key.
#[test]
fn sampling_ratios_per_service() {
    let path = write("sampling.yaml", "sampling:\n  ratios: {Checkout: 0.25}\n");
    let env = [(
        "STORMGLASS_SAMPLING__RATIOS__CART".to_owned(),
        "0.5".to_owned(),
    )];
    let config = load(Some(&*path), env, &vec![]).unwrap();
    let conventions = config.conventions();
    assert_eq!(conventions.sampling_weight("Checkout"), Some(4.0));
    assert_eq!(conventions.sampling_weight("cart"), Some(2.0));
    assert_eq!(conventions.sampling_weight("web"), None);
    let bad = write("bad-sampling.yaml", "sampling:\n  ratios: {web: 2}\n");
    let errors = load(Some(&*bad), [], &vec![]).unwrap_err();
    assert_eq!(errors.0[0].0, "sampling.ratios.web", "{errors}");
}

/// A file in an unknown format is refused with a message naming the fix.
#[test]
fn unknown_file_format() {
    let path = write("c.json", "{}");
    let errors = load(Some(&*path), [], &vec![]).unwrap_err();
    assert!(errors.0[0].1.contains(".yaml, .yml or .toml"));
}

/// The field names a section's `Deserialize` declares (what `deserialize_struct` is given).
fn fields_of<'de, T: Deserialize<'de>>() -> Vec<&'static str> {
    use serde::de::{Error as _, Visitor, value::Error};
    struct Probe<'a>(&'a mut Vec<&'static str>);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            Err(Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Error> {
            self.0.extend_from_slice(fields);
            Err(Error::custom("probed"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields = Vec::new();
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// Every key of every section is in the example file, shown (or commented out, for those
/// unset by default) at two spaces' indent, and the example shows no key the sections lack:
/// a key added to a section without its line in the example fails here.
#[test]
fn example_config_shows_every_key_and_no_other() {
    let sections: Vec<(&str, Vec<&str>)> = vec![
        ("listen", fields_of::<ListenConfig>()),
        ("limits", fields_of::<LimitsConfig>()),
        ("assembly", fields_of::<AssemblyConfig>()),
        ("analytics", fields_of::<AnalyticsConfig>()),
        ("advice", fields_of::<AdviceConfig>()),
        ("orphans", fields_of::<OrphansConfig>()),
        ("deadlines", fields_of::<DeadlinesConfig>()),
        ("clocks", fields_of::<ClocksConfig>()),
        ("retries", fields_of::<RetriesConfig>()),
        ("idempotency", fields_of::<IdempotencyConfig>()),
        ("sampling", fields_of::<SamplingConfig>()),
        ("shutdown", fields_of::<ShutdownConfig>()),
        ("archive", fields_of::<ArchiveConfig>()),
        ("tls", fields_of::<TlsConfig>()),
        ("auth", fields_of::<AuthConfig>()),
        ("links", fields_of::<LinksConfig>()),
        ("report", fields_of::<ReportConfig>()),
        (
            "alerts",
            [fields_of::<AlertThresholds>(), fields_of::<NotifyConfig>()].concat(),
        ),
    ];
    assert_eq!(
        sections.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        SECTIONS.to_vec(),
        "every section, in the example's order"
    );
    // Keys in the example: `  key:` or `  # key:` under each top-level `section:` line.
    let mut shown: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    let mut current = None;
    for line in EXAMPLE_YAML.lines() {
        if let Some((name, _)) = line.split_once(':')
            && !line.starts_with([' ', '#'])
        {
            current = Some(name);
            continue;
        }
        let Some(section) = current else { continue };
        let key = line
            .strip_prefix("  ")
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .filter(|l| !l.starts_with(' '))
            .and_then(|l| l.split_once(':'))
            .map(|(k, _)| k)
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        if let Some(key) = key {
            shown.entry(section).or_default().push(key);
        }
    }
    for (section, fields) in &sections {
        let mut expected: Vec<&str> = fields.clone();
        expected.sort_unstable();
        let mut got = shown.get(section).cloned().unwrap_or_default();
        got.sort_unstable();
        got.dedup();
        assert_eq!(
            got, expected,
            "keys of `{section}` in stormglass.example.yaml"
        );
    }
}
