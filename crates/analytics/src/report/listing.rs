//! Which part of a report a reader gets: the worst edges and layers up to a limit, around
//! a service, caller or callee, and at most so many findings of a kind, with totals.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{Coverage, EdgeFigures, FindingTotal, Report};

/// Edges and layers a report lists by default (`?limit=`, `analyze --limit`).
pub const DEFAULT_LIMIT: usize = 200;

/// Which edges, layers and entry operations a limited report keeps, and the order it lists
/// them in (the report's `listing.order`): by name, as the whole report, so a listing reads
/// and diffs like it.
pub const IMPACT_ORDER: &str = "the worst kept: edges with the most failed plus retried \
    attempts, then attempts; layers with the most requests above their baseline (retries \
    from upstream), then requests; entry operations with the most failed requests, then \
    requests; listed by name";

/// Which part of a window's report a reader asks for: the worst `limit` edges and layers
/// (all with `None`), around one `service` (its calls in and out, its layer) or one `caller`
/// or `callee`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    pub limit: Option<usize>,
    pub service: Option<String>,
    pub caller: Option<String>,
    pub callee: Option<String>,
}

/// What a selected report lists: per list, how many the window holds under the filters and
/// how many are listed, and whether any was left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Listing {
    pub order: String,
    pub edges: u64,
    pub edges_listed: u64,
    pub layers: u64,
    pub layers_listed: u64,
    /// Entry operations, and the services whose coverage and trace counts are listed (those
    /// of the listed edges and layers): in a report's listing, not in replay's or whatif's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries_listed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services_listed: Option<u64>,
    pub truncated: bool,
}

impl Listing {
    /// In `order`, `(selected, listed)` edges and layers; truncated when fewer are listed.
    pub fn of(order: &str, (edges, edges_listed): (usize, usize), layers: (usize, usize)) -> Self {
        Listing {
            order: order.to_owned(),
            edges: edges as u64,
            edges_listed: edges_listed as u64,
            layers: layers.0 as u64,
            layers_listed: layers.1 as u64,
            truncated: edges_listed < edges || layers.1 < layers.0,
            ..Listing::default()
        }
    }

    /// With `(selected, listed)` entry operations and services too.
    fn with(mut self, entries: (usize, usize), services: (usize, usize)) -> Self {
        self.entries = Some(entries.0 as u64);
        self.entries_listed = Some(entries.1 as u64);
        self.services = Some(services.0 as u64);
        self.services_listed = Some(services.1 as u64);
        self.truncated |= entries.1 < entries.0 || services.1 < services.0;
        self
    }
}

impl Selection {
    fn names(&self, caller: &str, callee: &str) -> bool {
        self.service
            .as_ref()
            .is_none_or(|s| caller == s || callee == s)
            && self.caller.as_ref().is_none_or(|c| caller == c)
            && self.callee.as_ref().is_none_or(|c| callee == c)
    }

    fn filtered(&self) -> bool {
        self.service.is_some() || self.caller.is_some() || self.callee.is_some()
    }

    /// Keep the edges of `items` this selection selects (`names` gives an item's caller and
    /// callee), at most its limit of them, the worst by `worse` (`Less` for the worse
    /// of two), each kept in its place: returns how many it selected before the limit.
    pub fn keep_edges<T>(
        &self,
        items: &mut Vec<T>,
        names: impl Fn(&T) -> (&str, &str),
        worse: impl Fn(&T, &T) -> std::cmp::Ordering,
    ) -> usize {
        items.retain(|item| {
            let (caller, callee) = names(item);
            self.names(caller, callee)
        });
        let selected = items.len();
        keep_worst(items, self.limit, worse);
        selected
    }

    /// The services of the edges of `items` this selection selects (and the selected
    /// service), for the layers listed beside them; `None` when nothing is filtered (every
    /// layer).
    pub fn services<T>(
        &self,
        items: &[T],
        names: impl Fn(&T) -> (&str, &str),
    ) -> Option<HashSet<String>> {
        self.filtered().then(|| {
            items
                .iter()
                .map(&names)
                .filter(|&(caller, callee)| self.names(caller, callee))
                .flat_map(|(caller, callee)| [caller, callee])
                .chain(self.service.as_deref())
                .map(str::to_owned)
                .collect()
        })
    }
}

/// Keep at most `limit` of `items`, the worst by `worse`, each in its place.
pub fn keep_worst<T>(
    items: &mut Vec<T>,
    limit: Option<usize>,
    worse: impl Fn(&T, &T) -> std::cmp::Ordering,
) {
    let limit = limit.unwrap_or(usize::MAX);
    if items.len() <= limit {
        return;
    }
    if limit == 0 {
        items.clear();
        return;
    }
    // The `limit` worst found, not every item sorted: at width a listing keeps 200 of
    // 160,000 edges. Ties go to the first, so the kept are the same as a stable sort's.
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.select_nth_unstable_by(limit - 1, |&a, &b| {
        worse(&items[a], &items[b]).then(a.cmp(&b))
    });
    let mut kept = vec![false; items.len()];
    for &i in &order[..limit] {
        kept[i] = true;
    }
    let mut kept = kept.into_iter();
    items.retain(|_| kept.next().unwrap_or(false));
}

/// Of `items`, those of the selected services (`service` names an item's), the worst
/// `limit` by `impact` (the highest first), each in its place; with how many were selected.
fn worst_of<T, K: Ord>(
    items: &[T],
    selected: impl Fn(&str) -> bool,
    service: impl Fn(&T) -> &str,
    limit: Option<usize>,
    impact: impl Fn(&T) -> K,
) -> (usize, Vec<&T>) {
    let mut kept: Vec<&T> = items.iter().filter(|i| selected(service(i))).collect();
    let total = kept.len();
    keep_worst(&mut kept, limit, |a, b| impact(b).cmp(&impact(a)));
    (total, kept)
}

/// An edge's impact: its failed attempts plus its retries, then its attempts.
fn edge_impact(e: &EdgeFigures) -> (u64, u64) {
    let ok = e
        .attempt_success_rate
        .map_or(0, |r| (r * e.attempts as f64).round() as u64);
    (e.attempts.saturating_sub(ok) + e.retry_attempts, e.attempts)
}

impl Report {
    /// The part of this report `selection` asks for: edges (with their coverage), findings
    /// and orphans of the selected calls, the layers and entry operations of the selected
    /// services, the worst ([`IMPACT_ORDER`]) up to the limit in their order, the coverage
    /// and trace counts of the listed edges' and layers' services, with `listing` saying
    /// what was left out. Window figures, trace totals and alerts stay whole.
    pub fn select(&self, selection: &Selection) -> Report {
        let mut edges: Vec<&EdgeFigures> = self.edges.iter().collect();
        // Around a service, its own layer; around a caller or callee, the layers the
        // selected calls reach (all of them, before the limit).
        let services = selection.services(&edges, |e| (&e.caller, &e.callee));
        let selected = |service: &str| services.as_ref().is_none_or(|s| s.contains(service));
        let edge_total = selection.keep_edges(
            &mut edges,
            |e| (&e.caller, &e.callee),
            |a, b| edge_impact(b).cmp(&edge_impact(a)),
        );
        let listed: HashSet<(&str, &str, &str)> = edges
            .iter()
            .map(|e| (e.caller.as_str(), e.callee.as_str(), e.operation.as_str()))
            .collect();
        let (layer_total, layers) = worst_of(
            &self.layers,
            selected,
            |l| &l.service,
            selection.limit,
            |l| (l.requests.saturating_sub(l.baseline_attempts), l.requests),
        );
        let keep = |caller: &str, callee: &str| selection.names(caller, callee);
        let (entry_total, entries) = worst_of(
            &self.entries,
            selected,
            |e| &e.service,
            selection.limit,
            |e| {
                let failed = e
                    .error_rate
                    .map_or(0, |r| (r * e.requests as f64).round() as u64);
                (failed, e.requests)
            },
        );
        // Per-service coverage and trace counts: of the selected services, those of the
        // listed edges' and layers' services (all of them when the limit cut neither).
        let whole = edges.len() == edge_total && layers.len() == layer_total;
        let named: HashSet<&str> = (edges.iter())
            .flat_map(|e| [e.caller.as_str(), e.callee.as_str()])
            .chain(layers.iter().map(|l| l.service.as_str()))
            .collect();
        let of_listed = |service: &str| selected(service) && (whole || named.contains(service));
        let service_total = (self.coverage.services.iter())
            .filter(|c| selected(&c.service))
            .count();
        let service_coverage: Vec<_> = (self.coverage.services.iter())
            .filter(|c| of_listed(&c.service))
            .cloned()
            .collect();
        let mut traces = self.traces.clone();
        traces.by_service.retain(|t| of_listed(&t.service));
        let listing = Listing::of(
            IMPACT_ORDER,
            (edge_total, edges.len()),
            (layer_total, layers.len()),
        )
        .with(
            (entry_total, entries.len()),
            (service_total, service_coverage.len()),
        );
        Report {
            window: self.window.clone(),
            edges: edges.into_iter().cloned().collect(),
            layers: layers.into_iter().cloned().collect(),
            entries: entries.into_iter().cloned().collect(),
            traces,
            orphans: self
                .orphans
                .iter()
                .filter(|o| keep(&o.caller, &o.callee))
                .cloned()
                .collect(),
            findings: self
                .findings
                .iter()
                .filter(|f| keep(&f.caller, &f.callee))
                .cloned()
                .collect(),
            finding_totals: self.finding_totals.clone(),
            coverage: Coverage {
                services: service_coverage,
                edges: self
                    .coverage
                    .edges
                    .iter()
                    .filter(|c| {
                        listed.contains(&(
                            c.caller.as_str(),
                            c.callee.as_str(),
                            c.operation.as_str(),
                        ))
                    })
                    .cloned()
                    .collect(),
            },
            alerts: self.alerts.clone(),
            listing: Some(listing),
            figures: self.figures,
            // The advice is made from the whole report, not from a listing of it.
            sequential_calls: BTreeMap::new(),
        }
    }
}

impl Report {
    /// List at most `max_per_kind` findings of each kind, the highest counts first (ties in
    /// caller, callee, operation order), and count every kind's in `finding_totals`. Alerts
    /// are evaluated before, over every finding.
    pub fn bound_findings(&mut self, max_per_kind: usize) {
        let mut findings = std::mem::take(&mut self.findings);
        // A finding is one per (kind, caller, callee, operation) (finding_counts), so the
        // order is total: a sort in place gives the stable sort's order without its
        // scratch copy of the findings (~14 MiB at width).
        findings.sort_unstable_by(|a, b| {
            (
                a.kind.as_str(),
                std::cmp::Reverse(a.count),
                &a.caller,
                &a.callee,
                &a.operation,
            )
                .cmp(&(
                    b.kind.as_str(),
                    std::cmp::Reverse(b.count),
                    &b.caller,
                    &b.callee,
                    &b.operation,
                ))
        });
        let mut totals: Vec<FindingTotal> = Vec::new();
        for finding in findings {
            if totals.last().is_none_or(|t| t.kind != finding.kind) {
                totals.push(FindingTotal {
                    kind: finding.kind.clone(),
                    severity: finding.severity.clone(),
                    findings: 0,
                    listed: 0,
                    count: 0,
                });
            }
            let Some(total) = totals.last_mut() else {
                continue;
            };
            total.findings += 1;
            total.count += finding.count;
            if (total.listed as usize) < max_per_kind {
                total.listed += 1;
                self.findings.push(finding);
            }
        }
        self.finding_totals = totals;
    }
}

#[cfg(test)]
mod tests {
    use super::{Selection, keep_worst};

    /// The worst are kept in their places, ties to the first; a selection filters by
    /// caller and callee before its limit and counts what it selected.
    #[test]
    fn the_worst_are_kept_in_place() {
        let mut items = vec![3, 9, 1, 9, 4, 7];
        keep_worst(&mut items, Some(3), |a, b| b.cmp(a));
        assert_eq!(items, [9, 9, 7]);
        let mut items = vec![3, 9, 1];
        keep_worst(&mut items, None, |a, b| b.cmp(a));
        assert_eq!(items, [3, 9, 1]);
        keep_worst(&mut items, Some(0), |a, b| b.cmp(a));
        assert!(items.is_empty());
        // Many ties at the limit: the same kept as the first `limit` of a stable sort.
        let all: Vec<(u32, usize)> = (0..1000).map(|i| ((i * 37 % 11) as u32, i)).collect();
        let mut sorted = all.clone();
        sorted.sort_by_key(|x| std::cmp::Reverse(x.0));
        let mut expected = sorted[..200].to_vec();
        expected.sort_by_key(|&(_, i)| i);
        let mut items = all;
        keep_worst(&mut items, Some(200), |a, b| b.0.cmp(&a.0));
        assert_eq!(items, expected);

        let mut edges = vec![("a", "b", 5), ("a", "c", 1), ("b", "c", 9), ("a", "d", 3)];
        let selection = Selection {
            limit: Some(2),
            caller: Some("a".into()),
            ..Selection::default()
        };
        let services = selection.services(&edges, |e| (e.0, e.1)).unwrap();
        assert_eq!(services.len(), 4, "{services:?}");
        let selected = selection.keep_edges(&mut edges, |e| (e.0, e.1), |x, y| y.2.cmp(&x.2));
        assert_eq!(selected, 3);
        assert_eq!(edges, [("a", "b", 5), ("a", "d", 3)]);
    }
}
