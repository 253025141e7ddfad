//! stormglass exports: what leaves the collector for Prometheus, Grafana and the pager.
//!
//! * [`advice`]: the advised timeouts, attempts and retry budgets as the budget table and
//!   gRPC service configs.
//! * [`dashboards`]: the Grafana dashboards of `dashboards/grafana/`, generated from a
//!   declarative list.
//! * [`metrics`]: the figure metrics of docs/metrics.md on `/metrics`, fed by every analysed
//!   interval.
//! * [`rules`]: the Prometheus recording and alerting rules (`stormglass rules`).
//! * [`notify`]: the built-in alert evaluator (honours `for:`), posting to Alertmanager's v2
//!   API and to webhooks, and listing alerts at `/api/v1/alerts`.

pub mod advice;
pub mod dashboards;
pub mod metrics;
pub mod notify;
pub mod promql;
pub mod rules;

pub use metrics::FigureMetrics;
pub use notify::{AlertEvaluator, NotifyConfig};
