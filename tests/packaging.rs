//! Where users run it: the Dockerfile passes hadolint, the Kubernetes manifests pass
//! kubernetes-validate (PyPI, installed by tests/run.sh) and agree with each other, and the
//! shipped PrometheusRule is `stormglass rules --format prometheusrule`, accepted by promtool.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::repo_root;
use serde_json::Value;

/// A tool installed beside the test virtualenv's Python (`TEST_PYTHON`).
fn venv_tool(name: &str) -> PathBuf {
    let python = std::env::var("TEST_PYTHON").unwrap_or_else(|_| {
        panic!("TEST_PYTHON is unset: run tests/run.sh, which installs {name}")
    });
    PathBuf::from(python).with_file_name(name)
}

/// Run `program args...` in the repository; its stdout and stderr, asserting success.
fn run(program: &std::path::Path, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): run tests/run.sh", program.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{}: {text}", program.display());
    text
}

/// Every document of a YAML file, as JSON values.
fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// hadolint (every rule, failing on any finding) passes the Dockerfile, and the image
/// listens on the ports it exposes.
#[test]
fn dockerfile_passes_hadolint() {
    run(
        &venv_tool("hadolint"),
        &["--failure-threshold", "style", "Dockerfile"],
    );
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    for (key, port) in [("GRPC", 4317), ("HTTP", 4318), ("API", 9464)] {
        assert!(
            dockerfile.contains(&format!("STORMGLASS_LISTEN__{key}=0.0.0.0:{port}")),
            "listen.{key} on every interface"
        );
        assert!(dockerfile.contains(&format!(" {port}")), "EXPOSE {port}");
    }
    assert!(dockerfile.contains("USER 10001"), "runs as a non-root user");
}

/// The built-in kinds validate strictly against Kubernetes' schemas, and the pieces fit:
/// the Collector resolves the headless Service on the OTLP port, the probes hit /healthz
/// and /readyz, the ServiceMonitor selects the Service and names one of its ports.
#[test]
fn kubernetes_manifests_validate_and_fit_together() {
    let validated = run(
        &venv_tool("kubernetes-validate"),
        &[
            "--strict",
            "dashboards/kubernetes/stormglass.yaml",
            "dashboards/kubernetes/collector.yaml",
        ],
    );
    assert!(
        !validated.contains("WARN") && !validated.contains("ERROR"),
        "{validated}"
    );
    assert_eq!(validated.matches("passed").count(), 5, "{validated}");

    let stormglass = documents("dashboards/kubernetes/stormglass.yaml");
    let service = kind(&stormglass, "Service");
    let set = kind(&stormglass, "StatefulSet");
    assert_eq!(
        service["spec"]["clusterIP"], "None",
        "headless, for the DNS resolver"
    );
    assert_eq!(set["spec"]["serviceName"], service["metadata"]["name"]);
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let env: Vec<&str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    // limits.memory comes from the pod's limit (auto), so the two cannot disagree.
    assert!(!env.contains(&"STORMGLASS_LIMITS__MEMORY"), "{env:?}");
    assert!(
        container["resources"]["limits"]["memory"].is_string(),
        "{container}"
    );

    let collector = documents("dashboards/kubernetes/collector.yaml");
    let config: Value = serde_saphyr::from_str(
        kind(&collector, "ConfigMap")["data"]["config.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let resolver = &config["exporters"]["loadbalancing"]["resolver"]["dns"];
    let name = service["metadata"]["name"].as_str().unwrap();
    assert!(
        resolver["hostname"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{name}.")),
        "{resolver}"
    );
    assert_eq!(resolver["port"], 4317);
    assert_eq!(
        config["exporters"]["loadbalancing"]["routing_key"],
        "traceID"
    );

    let monitor = documents("dashboards/kubernetes/servicemonitor.yaml");
    let monitor = kind(&monitor, "ServiceMonitor");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        service["metadata"]["labels"]
    );
    let port = &monitor["spec"]["endpoints"][0]["port"];
    assert!(
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == *port),
        "the Service has no port {port}"
    );
}

/// The shipped PrometheusRule is what `stormglass rules --format prometheusrule` prints,
/// and its groups are the rule file's, which promtool accepts.
#[test]
fn prometheusrule_is_the_generated_rules() {
    let output = Command::new(env!("CARGO_BIN_EXE_stormglass"))
        .args(["rules", "--format", "prometheusrule"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let shipped =
        std::fs::read_to_string(repo_root().join("dashboards/kubernetes/prometheusrule.yaml"))
            .unwrap();
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        shipped,
        "regenerate: cargo run -p stormglass -- rules --format prometheusrule > \
         dashboards/kubernetes/prometheusrule.yaml"
    );
    let rule = &documents("dashboards/kubernetes/prometheusrule.yaml")[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let file = &documents("dashboards/prometheus/stormglass-rules.yml")[0];
    assert_eq!(rule["spec"], *file, "the same groups as the rule file");

    let scratch = common::temp_dir("prometheusrule");
    let dir = scratch.path();
    let spec = dir.join("spec.yml");
    std::fs::write(&spec, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
    let checked = run(
        std::path::Path::new("promtool"),
        &["check", "rules", spec.to_str().unwrap()],
    );
    assert!(checked.contains("SUCCESS: 86 rules found"), "{checked}");
}
