//! A wide service mesh, sized by its caller: many services, few calls each, the shape in
//! which every list a person reads (findings, alerts, the report) must stay bounded and
//! every figure per edge must cost a lookup, never a scan.

use std::collections::BTreeSet;

use crate::fixtures::{Spans, deadline, http_status, peer, route, template};

/// What [`wide_mesh`] built, for the tests' expectations.
#[derive(Debug, Default)]
pub struct Mesh {
    /// (caller, callee) pairs called `/item`: one edge each.
    pub edges: BTreeSet<(String, String)>,
    /// Of them, the pairs whose calls carry a budget above what the caller has left.
    pub inverted: BTreeSet<(String, String)>,
}

/// The name of service `i`.
pub fn service(i: u32) -> String {
    format!("svc-{i:04}")
}

/// `traces` traces over `services` services (at least 4), all within one second. Trace `t`
/// enters `svc(t mod services)`, whose SERVER span (`/entry`, 1,000 ms: each service's
/// slowest operation, and its layer's tail) received an 800 ms budget; it calls three other
/// services' `/item` (20 ms SERVER spans, no deadline: not propagated), the first two with a
/// 100 ms timeout, the third with 900 ms, more than the ~779 ms it has left (an inversion).
/// No timeout is below the tail of the operation it guards.
pub fn wide_mesh(s: &mut Spans, services: u32, traces: u32) -> Mesh {
    let mut mesh = Mesh::default();
    for t in 0..traces {
        let trace = t + 1;
        let entry = t % services;
        // Offsets in (0, services): never the entry itself, three different callees.
        let offset = 1 + (t / services) % (services - 3);
        let at = f64::from(t % 1000) * 0.5;
        let root = s
            .server(trace, &service(entry), "GET /entry")
            .at(at, at + 1000.0)
            .with(vec![route("/entry"), deadline(800)])
            .add();
        for k in 0..3u32 {
            let callee = service((entry + offset + k) % services);
            let budget = if k == 2 { 900 } else { 100 };
            let start = at + 1.0 + f64::from(k) * 10.0;
            let c = s
                .client(trace, &service(entry), "GET")
                .under(root)
                .at(start, start + 22.0)
                .with(vec![
                    peer(&callee),
                    template("/item"),
                    deadline(budget),
                    http_status(200),
                ])
                .add();
            s.server(trace, &callee, "GET /item")
                .under(c)
                .at(start + 1.0, start + 21.0)
                .with(vec![route("/item")])
                .add();
            mesh.edges.insert((service(entry), callee.clone()));
            if k == 2 {
                mesh.inverted.insert((service(entry), callee));
            }
        }
    }
    mesh
}
