//! `stormglass analyze --fail-on`: the deploy gate. A report fails the gate when a finding
//! or an alert condition (without its `for:`) at or above a severity holds, or one of the
//! named findings or alerts does.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use stormglass_analytics::alerts::DEFINITIONS;
use stormglass_analytics::report::{FINDING_KINDS, Report};

/// Severities, least severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Info,
    Warning,
    Critical,
}

impl Level {
    fn parse(name: &str) -> Option<Level> {
        match name {
            "info" => Some(Level::Info),
            "warning" => Some(Level::Warning),
            "critical" => Some(Level::Critical),
            _ => None,
        }
    }
}

/// What fails the gate: a level, or findings' kinds and alerts' names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailOn {
    AtLeast(Level),
    Named(BTreeSet<String>),
}

impl FromStr for FailOn {
    type Err = String;

    fn from_str(text: &str) -> Result<FailOn, String> {
        let text = text.trim();
        if let Some(level) = Level::parse(text) {
            return Ok(FailOn::AtLeast(level));
        }
        let mut names = BTreeSet::new();
        for name in text.split(',').map(str::trim) {
            let known = FINDING_KINDS.iter().any(|(kind, _)| *kind == name)
                || DEFINITIONS.iter().any(|d| d.name == name);
            if !known {
                let kinds: Vec<&str> = FINDING_KINDS.iter().map(|(kind, _)| *kind).collect();
                let alerts: Vec<&str> = DEFINITIONS.iter().map(|d| d.name).collect();
                return Err(format!(
                    "{name:?} is no level, finding or alert; expected info, warning, critical, \
                     or a comma-separated list of findings ({}) and alerts ({})",
                    kinds.join(", "),
                    alerts.join(", ")
                ));
            }
            names.insert(name.to_owned());
        }
        Ok(FailOn::Named(names))
    }
}

/// One finding or alert condition that fails the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub what: &'static str,
    pub name: String,
    pub severity: String,
    pub subject: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({}): {}",
            self.what, self.name, self.severity, self.subject
        )
    }
}

impl FailOn {
    fn fails(&self, name: &str, severity: &str) -> bool {
        match self {
            FailOn::AtLeast(level) => Level::parse(severity).is_some_and(|s| s >= *level),
            FailOn::Named(names) => names.contains(name),
        }
    }

    /// The report's findings and alert conditions that fail the gate, findings first.
    pub fn failures(&self, report: &Report) -> Vec<Failure> {
        let findings = report
            .findings
            .iter()
            .filter(|f| self.fails(&f.kind, &f.severity))
            .map(|f| Failure {
                what: "finding",
                name: f.kind.clone(),
                severity: f.severity.clone(),
                subject: format!(
                    "{} -> {} {} x{}{}",
                    f.caller,
                    f.callee,
                    f.operation,
                    f.count,
                    f.example_trace_id
                        .as_ref()
                        .map(|t| format!(", e.g. trace {t}"))
                        .unwrap_or_default()
                ),
            });
        let alerts = report
            .alerts
            .iter()
            .filter(|a| self.fails(&a.name, &a.severity))
            .map(|a| Failure {
                what: "alert",
                name: a.name.clone(),
                severity: a.severity.clone(),
                subject: a
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .chain([format!("value={}", a.value)])
                    .collect::<Vec<_>>()
                    .join(" "),
            });
        findings.chain(alerts).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use stormglass_analytics::report::{Alert, Finding};

    use super::*;

    fn report() -> Report {
        let mut r = Report::default();
        let finding = |kind: &str, severity: &str| Finding {
            kind: kind.into(),
            severity: severity.into(),
            caller: "a".into(),
            callee: "b".into(),
            operation: "op".into(),
            count: 2,
            detail: None,
            example_trace_id: Some("t1".into()),
        };
        r.findings = vec![
            finding("immediate_retry", "info"),
            finding("deadline_inversion", "warning"),
        ];
        r.alerts = vec![Alert {
            name: "StormglassTailRatioHigh".into(),
            severity: "warning".into(),
            labels: BTreeMap::from([("service".into(), "b".into())]),
            value: 3.0,
            detail: None,
        }];
        r
    }

    fn names(fail_on: &str) -> Vec<String> {
        fail_on
            .parse::<FailOn>()
            .unwrap()
            .failures(&report())
            .into_iter()
            .map(|f| f.name)
            .collect()
    }

    /// A level fails on everything at or above it; nothing is at or above critical here.
    #[test]
    fn a_level_fails_at_or_above_it() {
        assert_eq!(
            names("info"),
            [
                "immediate_retry",
                "deadline_inversion",
                "StormglassTailRatioHigh"
            ]
        );
        assert_eq!(
            names("warning"),
            ["deadline_inversion", "StormglassTailRatioHigh"]
        );
        assert!(names("critical").is_empty());
    }

    /// Names pick findings and alerts whatever their severity; one that holds nothing passes.
    #[test]
    fn names_fail_on_exactly_those() {
        assert_eq!(
            names("immediate_retry, StormglassTailRatioHigh"),
            ["immediate_retry", "StormglassTailRatioHigh"]
        );
        assert!(names("unsafe_retry,StormglassUnsafeRetries").is_empty());
    }

    /// A name that is no finding, alert or level is an error that lists what is.
    #[test]
    fn unknown_names_are_errors() {
        let e = "warnings".parse::<FailOn>().unwrap_err();
        assert!(e.contains("\"warnings\""), "{e}");
        assert!(e.contains("unsafe_retry") && e.contains("StormglassUnsafeRetries"));
        assert!("unsafe_retry,nope".parse::<FailOn>().is_err());
    }

    /// Each failure reads as one line naming what holds, where, and an example trace.
    #[test]
    fn failures_name_what_holds() {
        let lines: Vec<String> = "warning"
            .parse::<FailOn>()
            .unwrap()
            .failures(&report())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lines,
            [
                "finding deadline_inversion (warning): a -> b op x2, e.g. trace t1",
                "alert StormglassTailRatioHigh (warning): service=b value=3",
            ]
        );
    }
}
