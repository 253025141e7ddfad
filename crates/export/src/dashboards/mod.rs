//! The Grafana dashboards of `dashboards/grafana/`, generated from a declarative list
//! ([`list::dashboards`]), as the monitoring mixins generate theirs: a panel says what it
//! shows (kind, title, description, unit, queries, where an alert's threshold is drawn);
//! everything every panel shares (data source, scoping variables, legend, tooltip, line
//! style, layout) is written once, here.
//!
//! Queries are scoped as the monitoring mixins scope theirs, written once: in a query,
//! `$series` stands for the selector of one or more collectors' own series (cluster, job
//! and instance), `$recorded` for that of the recording rules' (cluster and job: they sum
//! over instances) and `$edge` for the caller and callee filters.
//!
//! A test holds the shipped files equal to [`render`]'s output; after changing the list,
//! regenerate them with `STORMGLASS_BLESS=1 cargo nextest run --workspace -E
//! 'test(dashboards_are_generated)'`.

mod list;

use serde_json::{Map, Value, json};

pub use list::dashboards;

/// One dashboard: its uid (also its file's name), title, description, the label it is
/// filtered by, and its panels in reading order.
pub struct Dashboard {
    pub uid: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub filter: Filter,
    pub panels: Vec<Panel>,
}

/// The variables a dashboard filters by, beyond cluster, job and instance, each listing the
/// values of the metric named.
pub enum Filter {
    None,
    /// `$service`.
    Service(&'static str),
    /// `$caller` and `$callee`.
    Edge(&'static str),
}

/// The kinds of panel the dashboards use.
#[derive(Clone, Copy)]
pub enum Kind {
    Timeseries,
    Table,
    Stat,
    NodeGraph,
}

/// One panel: built with [`timeseries`], [`table`], [`stat`] or [`node_graph`] and the
/// methods below.
pub struct Panel {
    kind: Kind,
    title: &'static str,
    description: &'static str,
    width: u32,
    height: u32,
    unit: Option<&'static str>,
    min: Option<f64>,
    max: Option<f64>,
    red_from: Option<f64>,
    queries: Vec<Query>,
    extra: Option<Value>,
}

struct Query {
    /// PromQL with `$series`, `$recorded` and `$edge` (see the module docs).
    expr: &'static str,
    legend: &'static str,
    /// An instant query in table format.
    table: bool,
    ref_id: Option<&'static str>,
}

/// The legend of a query drawn as an alert's threshold: a dashed red line.
const ALERT_THRESHOLD: &str = "alert threshold";

fn panel(kind: Kind, title: &'static str, description: &'static str) -> Panel {
    Panel {
        kind,
        title,
        description,
        width: 12,
        height: 8,
        unit: None,
        min: None,
        max: None,
        red_from: None,
        queries: Vec::new(),
        extra: None,
    }
}

pub fn timeseries(title: &'static str, description: &'static str) -> Panel {
    panel(Kind::Timeseries, title, description)
}

pub fn table(title: &'static str, description: &'static str) -> Panel {
    panel(Kind::Table, title, description)
}

pub fn stat(title: &'static str, description: &'static str) -> Panel {
    panel(Kind::Stat, title, description)
}

pub fn node_graph(title: &'static str, description: &'static str) -> Panel {
    panel(Kind::NodeGraph, title, description)
}

impl Panel {
    /// Width in grid columns (of 24; 12 unless set) and height in rows (8 unless set).
    pub fn size(mut self, width: u32, height: u32) -> Panel {
        self.width = width;
        self.height = height;
        self
    }

    pub fn unit(mut self, unit: &'static str) -> Panel {
        self.unit = Some(unit);
        self
    }

    /// The y axis (or value range) starts at 0.
    pub fn from_zero(mut self) -> Panel {
        self.min = Some(0.0);
        self
    }

    /// A share: from 0 to 1.
    pub fn share(mut self) -> Panel {
        self.min = Some(0.0);
        self.max = Some(1.0);
        self
    }

    /// Values from `from` up are red (drawn as a line on a time series).
    pub fn red_from(mut self, from: f64) -> Panel {
        self.red_from = Some(from);
        self
    }

    /// A range query and its legend.
    pub fn query(mut self, expr: &'static str, legend: &'static str) -> Panel {
        self.queries.push(Query {
            expr,
            legend,
            table: false,
            ref_id: None,
        });
        self
    }

    /// The alert's threshold, drawn as a dashed red line.
    pub fn alert_line(self, expr: &'static str) -> Panel {
        self.query(expr, ALERT_THRESHOLD)
    }

    /// An instant query in table format.
    pub fn table_query(mut self, expr: &'static str) -> Panel {
        self.queries.push(Query {
            expr,
            legend: "",
            table: true,
            ref_id: None,
        });
        self
    }

    /// The last query's reference, where a transformation names it (else A, B, ...).
    pub fn ref_id(mut self, id: &'static str) -> Panel {
        if let Some(q) = self.queries.last_mut() {
            q.ref_id = Some(id);
        }
        self
    }

    /// Grafana JSON merged over the generated panel, for what only this panel has
    /// (transformations, cell colours): objects merge, `null` removes, values replace.
    pub fn with(mut self, extra: Value) -> Panel {
        self.extra = Some(extra);
        self
    }
}

/// Every dashboard as (file name, JSON text), as shipped in `dashboards/grafana/`.
pub fn render() -> Vec<(String, String)> {
    dashboards()
        .iter()
        .map(|d| {
            let text = serde_json::to_string_pretty(&dashboard(d)).unwrap_or_default();
            (format!("{}.json", d.uid), text + "\n")
        })
        .collect()
}

/// `expr` with its scoping tokens written out (see the module docs).
fn scoped(expr: &str) -> String {
    expr.replace(
        "$series",
        r#"cluster=~"$cluster",job=~"$job",instance=~"$instance""#,
    )
    .replace("$recorded", r#"cluster=~"$cluster",job=~"$job""#)
    .replace("$edge", r#"caller=~"$caller",callee=~"$callee""#)
}

/// A number as Grafana's files write it: whole numbers without a fraction.
fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

fn datasource() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

fn variable(name: &str, label: &str, query: String, multi: bool) -> Value {
    let all = if multi {
        json!({"selected": true, "text": ["All"], "value": ["$__all"]})
    } else {
        json!({"selected": true, "text": "All", "value": "$__all"})
    };
    json!({
        "name": name, "label": label, "type": "query", "datasource": datasource(),
        "query": {"query": query, "refId": "StandardVariableQuery"}, "refresh": 2,
        "includeAll": true, "multi": multi, "allValue": ".*", "current": all,
        "hide": 0, "sort": 1, "regex": "", "options": [],
    })
}

/// The variables: the data source, cluster, job and instance (scoping every query as the
/// monitoring mixins do), then the dashboard's filter.
fn variables(filter: &Filter) -> Vec<Value> {
    let memory = "stormglass_memory_limit_bytes";
    let mut list = vec![
        json!({"name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "hide": 0, "refresh": 1, "regex": "", "options": []}),
        variable(
            "cluster",
            "Cluster",
            format!("label_values({memory}, cluster)"),
            false,
        ),
        variable(
            "job",
            "Job",
            format!("label_values({memory}{{cluster=~\"$cluster\"}}, job)"),
            true,
        ),
        variable(
            "instance",
            "Instance",
            format!("label_values({memory}{{cluster=~\"$cluster\",job=~\"$job\"}}, instance)"),
            true,
        ),
    ];
    match filter {
        Filter::None => {}
        Filter::Service(metric) => list.push(variable(
            "service",
            "Service",
            format!("label_values({metric}, service)"),
            true,
        )),
        Filter::Edge(metric) => {
            list.push(variable(
                "caller",
                "Caller",
                format!("label_values({metric}, caller)"),
                true,
            ));
            list.push(variable(
                "callee",
                "Callee",
                format!("label_values({metric}{{caller=~\"$caller\"}}, callee)"),
                true,
            ));
        }
    }
    // Only the scoping variables carry a regex; the filters list every value.
    for v in list.iter_mut().skip(4) {
        if let Some(v) = v.as_object_mut() {
            v.remove("regex");
        }
    }
    list
}

fn dashboard(d: &Dashboard) -> Value {
    // Panels flow left to right on Grafana's 24-column grid, a new row when one is full.
    let (mut x, mut y, mut row) = (0, 0, 0);
    let mut panels = Vec::new();
    for (i, p) in d.panels.iter().enumerate() {
        if x + p.width > 24 {
            (x, y, row) = (0, y + row, 0);
        }
        let grid = json!({"h": p.height, "w": p.width, "x": x, "y": y});
        panels.push(render_panel(i + 1, p, grid));
        x += p.width;
        row = row.max(p.height);
    }
    json!({
        "uid": d.uid, "title": d.title, "description": d.description, "tags": ["stormglass"],
        "editable": true, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "timezone": "browser", "time": {"from": "now-1h", "to": "now"}, "graphTooltip": 1,
        "templating": {"list": variables(&d.filter)}, "annotations": {"list": []},
        "links": [{"title": "stormglass dashboards", "type": "dashboards",
            "tags": ["stormglass"], "asDropdown": true, "keepTime": true, "includeVars": true,
            "icon": "external link", "targetBlank": false, "tooltip": ""}],
        "panels": panels,
    })
}

fn render_panel(id: usize, p: &Panel, grid: Value) -> Value {
    let steps = match p.red_from {
        Some(from) => json!([{"color": "green", "value": null},
            {"color": "red", "value": number(from)}]),
        None => json!([{"color": "green", "value": null}]),
    };
    let mut defaults = Map::new();
    if let Some(unit) = p.unit {
        defaults.insert("unit".into(), json!(unit));
    }
    if let Some(min) = p.min {
        defaults.insert("min".into(), number(min));
    }
    if let Some(max) = p.max {
        defaults.insert("max".into(), number(max));
    }
    defaults.insert(
        "thresholds".into(),
        json!({"mode": "absolute", "steps": steps}),
    );
    let (type_name, options) = match p.kind {
        Kind::Timeseries => {
            defaults.insert("color".into(), json!({"mode": "palette-classic"}));
            let style = if p.red_from.is_some() { "line" } else { "off" };
            defaults.insert(
                "custom".into(),
                json!({"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                    "showPoints": "never", "spanNulls": false,
                    "thresholdsStyle": {"mode": style}}),
            );
            (
                "timeseries",
                json!({"legend": {"displayMode": "table", "placement": "bottom",
                    "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}}),
            )
        }
        Kind::Table => {
            defaults.insert("color".into(), json!({"mode": "palette-classic"}));
            ("table", json!({"showHeader": true}))
        }
        Kind::Stat => {
            defaults.insert("color".into(), json!({"mode": "thresholds"}));
            (
                "stat",
                json!({"reduceOptions": {"calcs": ["lastNotNull"]},
                    "colorMode": "background", "textMode": "value_and_name"}),
            )
        }
        Kind::NodeGraph => {
            defaults.insert("color".into(), json!({"mode": "thresholds"}));
            ("nodegraph", json!({}))
        }
    };
    let overrides = if p.queries.iter().any(|q| q.legend == ALERT_THRESHOLD) {
        json!([{"matcher": {"id": "byName", "options": ALERT_THRESHOLD}, "properties": [
            {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.fillOpacity", "value": 0},
        ]}])
    } else {
        json!([])
    };
    let targets: Vec<Value> = p
        .queries
        .iter()
        .zip('A'..)
        .map(|(q, letter)| {
            let mut t = json!({
                "refId": q.ref_id.map_or_else(|| letter.to_string(), str::to_owned),
                "datasource": datasource(), "expr": scoped(q.expr), "legendFormat": q.legend,
            });
            if q.table {
                t["instant"] = json!(true);
                t["format"] = json!("table");
            }
            t
        })
        .collect();
    let generated = json!({
        "id": id, "type": type_name, "title": p.title, "description": p.description,
        "datasource": datasource(), "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": options, "targets": targets,
    });
    match &p.extra {
        Some(extra) => merged(generated, extra),
        None => generated,
    }
}

/// `extra` over `base`: objects merge, `null` removes the key, anything else replaces.
fn merged(base: Value, extra: &Value) -> Value {
    match (base, extra) {
        (Value::Object(mut base), Value::Object(extra)) => {
            for (key, value) in extra {
                if value.is_null() {
                    base.remove(key);
                } else {
                    let old = base.remove(key).unwrap_or(Value::Null);
                    base.insert(key.clone(), merged(old, value));
                }
            }
            Value::Object(base)
        }
        (_, extra) => extra.clone(),
    }
}
