//! The scenarios: each a replay of one failure mode stormglass finds, as the
//! policies and latencies of the demo chain (gateway -> order -> inventory (gRPC) and
//! payment (HTTP) -> database). Latencies are deterministic (every n-th call is slow), so
//! the figures a scenario produces are known.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::retry::{Outcome, Policy, RetryBudget};

const TIMEOUTS: &[Outcome] = &[Outcome::Deadline, Outcome::Unavailable];
const UNAVAILABLE: &[Outcome] = &[Outcome::Unavailable];

/// A latency: `base_ms`, and every `slow_every`-th call (0: never) `slow_ms` instead.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    pub base_ms: u64,
    pub slow_every: u64,
    pub slow_ms: u64,
}

impl Latency {
    pub const fn steady(ms: u64) -> Latency {
        Latency {
            base_ms: ms,
            slow_every: 0,
            slow_ms: 0,
        }
    }

    pub const fn with_slow(self, every: u64, ms: u64) -> Latency {
        Latency {
            slow_every: every,
            slow_ms: ms,
            ..self
        }
    }

    /// The latency of the `n`-th call (1-based).
    pub fn of(&self, n: u64) -> Duration {
        let slow = self.slow_every > 0 && n.is_multiple_of(self.slow_every);
        Duration::from_millis(if slow { self.slow_ms } else { self.base_ms })
    }
}

/// A stop-the-world pause of the inventory service: from `first_after` the chain started,
/// every `every`, for `length`.
#[derive(Clone, Copy, Debug)]
pub struct Pause {
    pub first_after: Duration,
    pub every: Duration,
    pub length: Duration,
}

/// Everything a scenario sets.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The budget of an entry request at the gateway.
    pub entry_budget_ms: u64,
    pub gateway_order: Policy,
    pub order_inventory: Policy,
    pub order_payment: Policy,
    pub inventory_db: Policy,
    pub payment_db: Policy,
    pub order_work: Latency,
    pub inventory_work: Latency,
    pub payment_work: Latency,
    pub db_select: Latency,
    pub db_insert: Latency,
    /// Every n-th payment request is answered 503.
    pub payment_unavailable_every: Option<u64>,
    pub inventory_pause: Option<Pause>,
    /// Servers stop working when the budget they received runs out.
    pub honour_deadlines: bool,
    /// The payment service ignores (and does not record) the budget it receives.
    pub payment_drops_deadline: bool,
}

/// A retry policy for one edge of the chain, as a policy file sets it (`stormglass demo
/// --policy`): attempts, the per-attempt timeout, and a retry budget.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeSetting {
    pub caller: String,
    pub callee: String,
    pub max_attempts: u32,
    pub timeout_ms: Option<f64>,
    pub budget_ratio: Option<f64>,
    pub budget_min_per_second: Option<f64>,
}

impl Plan {
    /// The plan with each edge `settings` names set as it says (the others as they were);
    /// the names of the edges the settings name but the chain does not have.
    pub fn with_settings(mut self, settings: &[EdgeSetting]) -> (Plan, Vec<String>) {
        let mut unknown = Vec::new();
        for s in settings {
            let policy = match (s.caller.as_str(), s.callee.as_str()) {
                ("gateway", "order") => &mut self.gateway_order,
                ("order", "inventory") => &mut self.order_inventory,
                ("order", "payment") => &mut self.order_payment,
                ("inventory", "db") => &mut self.inventory_db,
                ("payment", "db") => &mut self.payment_db,
                _ => {
                    unknown.push(format!("{} -> {}", s.caller, s.callee));
                    continue;
                }
            };
            policy.max_attempts = s.max_attempts.max(1);
            if let Some(ms) = s.timeout_ms {
                policy.timeout = Duration::from_secs_f64(ms / 1e3);
            }
            policy.budget =
                (s.budget_ratio.is_some() || s.budget_min_per_second.is_some()).then(|| {
                    Arc::new(RetryBudget::new(
                        s.budget_ratio.unwrap_or(0.0),
                        s.budget_min_per_second.unwrap_or(0.0),
                    ))
                });
        }
        (self, unknown)
    }
}

/// The scenarios, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Healthy,
    Storm,
    Hidden,
    GcPause,
    Tail,
    Budget,
    Unsafe,
    Orphans,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::Healthy,
        Scenario::Storm,
        Scenario::Hidden,
        Scenario::GcPause,
        Scenario::Tail,
        Scenario::Budget,
        Scenario::Unsafe,
        Scenario::Orphans,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Healthy => "healthy",
            Scenario::Storm => "storm",
            Scenario::Hidden => "hidden",
            Scenario::GcPause => "gc-pause",
            Scenario::Tail => "tail",
            Scenario::Budget => "budget",
            Scenario::Unsafe => "unsafe",
            Scenario::Orphans => "orphans",
        }
    }

    pub fn from_name(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    /// What the scenario shows, in one line.
    pub fn story(self) -> &'static str {
        match self {
            Scenario::Healthy => {
                "one attempt per layer, budgets derived hop by hop: nothing should fire"
            }
            Scenario::Storm => {
                "the database stalls and every layer retries 3x: 27 attempts at the bottom per request"
            }
            Scenario::Hidden => {
                "the storm again, with gateway's HTTP and order's gRPC clients retrying below their tracing layer (as urllib3 and gRPC do): only the callees' SERVER spans show the attempts"
            }
            Scenario::GcPause => {
                "inventory pauses 1.4 s every 10 s while order's timeout sits at its P99: the pause becomes retries"
            }
            Scenario::Tail => {
                "order gives inventory 200 ms while 1 in 200 calls takes 320 ms: the timeout is below P99.9"
            }
            Scenario::Budget => {
                "order has 800 ms and gives inventory 500 + payment 400; payment drops the deadline and gives the database 900"
            }
            Scenario::Unsafe => {
                "order retries POST /charge on 503 without an idempotency key: every retry may charge twice"
            }
            Scenario::Orphans => {
                "the gateway gives order 150 ms, order ignores it and works 300 ms: orphan work that succeeds anyway"
            }
        }
    }

    pub fn plan(self) -> Plan {
        let healthy = Plan {
            entry_budget_ms: 2000,
            gateway_order: Policy::once(1000).attempts(2, UNAVAILABLE),
            order_inventory: Policy::once(400).attempts(2, UNAVAILABLE),
            order_payment: Policy::once(400).attempts(2, UNAVAILABLE),
            inventory_db: Policy::once(200),
            payment_db: Policy::once(200),
            order_work: Latency::steady(2),
            inventory_work: Latency::steady(3),
            payment_work: Latency::steady(4),
            db_select: Latency::steady(5),
            db_insert: Latency::steady(6),
            payment_unavailable_every: None,
            inventory_pause: None,
            honour_deadlines: true,
            payment_drops_deadline: false,
        };
        match self {
            Scenario::Healthy => healthy,
            Scenario::Storm => Plan {
                entry_budget_ms: 6000,
                gateway_order: Policy::once(1500).attempts(3, TIMEOUTS).fixed_timeout(),
                order_inventory: Policy::once(400).attempts(3, TIMEOUTS).fixed_timeout(),
                // Inventory's three tries (~180 ms with backoff) well inside order's 400 ms
                // per try: a busy machine's delays must not cut the third one off.
                inventory_db: Policy::once(50).attempts(3, TIMEOUTS).fixed_timeout(),
                db_select: Latency::steady(5).with_slow(1, 2000),
                ..healthy
            },
            Scenario::Hidden => {
                let storm = Scenario::Storm.plan();
                Plan {
                    gateway_order: storm.gateway_order.below_tracing(),
                    order_inventory: storm.order_inventory.below_tracing(),
                    ..storm
                }
            }
            Scenario::GcPause => Plan {
                order_inventory: Policy::once(25).attempts(3, TIMEOUTS).fixed_timeout(),
                inventory_pause: Some(Pause {
                    first_after: Duration::from_secs(2),
                    every: Duration::from_secs(10),
                    length: Duration::from_millis(1400),
                }),
                honour_deadlines: false,
                ..healthy
            },
            Scenario::Tail => Plan {
                order_inventory: Policy::once(200).attempts(2, TIMEOUTS).fixed_timeout(),
                inventory_work: Latency::steady(15).with_slow(200, 320),
                honour_deadlines: false,
                ..healthy
            },
            Scenario::Budget => Plan {
                entry_budget_ms: 800,
                gateway_order: Policy::once(800),
                order_inventory: Policy::once(500).fixed_timeout(),
                order_payment: Policy::once(400).fixed_timeout(),
                payment_db: Policy::once(900).fixed_timeout(),
                payment_drops_deadline: true,
                ..healthy
            },
            Scenario::Unsafe => Plan {
                order_payment: Policy::once(400).attempts(2, UNAVAILABLE).without_key(),
                payment_unavailable_every: Some(4),
                ..healthy
            },
            Scenario::Orphans => Plan {
                gateway_order: Policy::once(150).attempts(2, TIMEOUTS).fixed_timeout(),
                order_payment: Policy::once(1000).fixed_timeout(),
                payment_work: Latency::steady(300),
                honour_deadlines: false,
                ..healthy
            },
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
