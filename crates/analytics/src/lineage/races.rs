//! Re-sent SERVER attempts read together: which one answered its call, which the caller
//! abandoned, and whether a later one was a hedge (sent while the earlier was still
//! awaited) or a retry after a per-try timeout (sent because the earlier was given up on).
//!
//! A call's SERVER attempts sent for one caller-side span (the re-sending CLIENT span, or
//! the uninstrumented caller's parent) form a *race*. Its answer is one no attempt was
//! sent after (the caller did not go on from it): under a CLIENT span, the one that ended
//! last no later than the CLIENT span (the caller waited for it); without one, the first
//! to end with a final outcome (ok or not retryable). The race is
//! decided when the answer ended, or when the CLIENT span ended if that was earlier (the
//! caller stopped waiting). An attempt still running then, by more than
//! `retries.overlap_tolerance_ms`, was abandoned: never a success, and an orphan where its
//! callee went on.
//!
//! Spans alone show the same thing for a hedge whose loser was cancelled and for a retry
//! after a per-try timeout, except when an earlier attempt answers while a later one is
//! running: only a hedging client still awaits an attempt after sending the next. A race
//! that shows this reads its overlapping attempts as hedges, the losers `cancelled` when
//! the race was decided; every other race reads them as retries after a per-try timeout
//! (what proxies and meshes do), the earlier attempt `deadline` when the next was sent.
//! Each race is read on its own, so a trace reads the same whatever else is analysed with
//! it; `retries.overlapping_resends` fixes the reading for every race instead (`hedge` for
//! a fleet whose clients hedge).

use arrow::array::{Int64Array, StringArray};
use stormglass_model::Outcome;

use super::calls::CallSlot;
use super::rows::Kind;

/// How attempts that overlap an earlier attempt of their call are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlapping {
    /// Hedges in calls where an earlier attempt answered while a later one ran, retries
    /// after a per-try timeout elsewhere.
    #[default]
    Auto,
    /// Always hedges (a hedging client: grpc `hedgingPolicy`).
    Hedge,
    /// Always retries after a per-try timeout (a proxy's or mesh's `perTryTimeout`).
    PerTryTimeout,
}

/// What the race gives one attempt: set on its [`CallSlot`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GaveUp {
    /// The outcome the caller's side gave it: `deadline` or `cancelled`.
    pub(super) outcome: &'static str,
    /// When the caller stopped waiting for it, in the attempt's own clock.
    pub(super) end_ns: i64,
}

/// The rows and columns a race is read from.
pub(super) struct RaceInput<'a> {
    pub(super) kinds: &'a [Kind],
    pub(super) sender: &'a [usize],
    /// Per row: nanoseconds that bring its times into its parent's clock.
    pub(super) to_parent: &'a [i64],
    pub(super) start: &'a Int64Array,
    pub(super) end: &'a Int64Array,
    pub(super) outcome: &'a StringArray,
    pub(super) tolerance_ns: i64,
}

/// One race, read: indices into its attempts.
struct Race {
    answer: Option<usize>,
    decided_at: Option<i64>,
    /// An earlier attempt answered while a later one ran: hedging.
    hedging: bool,
}

impl RaceInput<'_> {
    fn started(&self, row: usize) -> i64 {
        self.start.value(row) + self.to_parent[row]
    }

    fn ended(&self, row: usize) -> i64 {
        self.end.value(row) + self.to_parent[row]
    }

    /// The CLIENT span the race's attempts were re-sent below, if any.
    fn client(&self, race: &[usize]) -> Option<usize> {
        let s = self.sender[race[0]];
        (s != race[0] && self.kinds[s] == Kind::Client).then_some(s)
    }

    fn read(&self, race: &[usize]) -> Race {
        let client_end = self.client(race).map(|c| self.end.value(c));
        let tol = self.tolerance_ns;
        // An attempt followed by one sent after it ended, or after it if it failed
        // retryably, did not answer: the caller went on. The last start says whether any
        // was (one pass per race, whatever its size).
        let last_start = race
            .iter()
            .map(|&r| self.started(r))
            .max()
            .unwrap_or(i64::MIN);
        let followed = |i: usize| {
            let (started, ended) = (self.started(race[i]), self.ended(race[i]));
            let retried =
                Outcome::from_class(self.outcome.value(race[i])).is_some_and(Outcome::is_retried);
            last_start > started && (retried || last_start >= ended - tol)
        };
        let candidates = (0..race.len()).filter(|&i| !followed(i));
        let answer = match client_end {
            Some(until) => candidates
                .filter(|&i| self.ended(race[i]) <= until + tol)
                .max_by_key(|&i| (self.ended(race[i]), self.started(race[i]))),
            None => candidates
                .filter(|&i| {
                    Outcome::from_class(self.outcome.value(race[i])).is_none_or(|o| !o.is_retried())
                })
                .min_by_key(|&i| (self.ended(race[i]), i)),
        };
        let answered_at = answer.map(|i| self.ended(race[i]));
        let decided_at = match (client_end, answered_at) {
            (Some(c), Some(a)) => Some(c.min(a)),
            (c, a) => c.or(a),
        };
        let hedging = answer.is_some_and(|a| {
            let (from, until) = (self.started(race[a]), self.ended(race[a]));
            race.iter().any(|&r| {
                let s = self.started(r);
                s > from && s < until - self.tolerance_ns
            })
        });
        Race {
            answer,
            decided_at,
            hedging,
        }
    }
}

/// The races of `calls` (each the rows of one call's SERVER attempts, in call order),
/// split where the caller-side span changes.
fn races<'c>(call: &'c [usize], sender: &'c [usize]) -> impl Iterator<Item = &'c [usize]> {
    // One re-sending CLIENT span's children, or consecutive attempts that are their own
    // senders (an uninstrumented caller's re-sends).
    call.chunk_by(move |&a, &b| sender[a] == sender[b] || (sender[a] == a && sender[b] == b))
}

/// Read every race of `calls` and set its attempts' `hedged`, `gave_up` and `decides`
/// (`seen_as`, set before, takes precedence: the caller saw the CLIENT span's outcome).
pub(super) fn settle(
    input: &RaceInput,
    calls: &[&[usize]],
    reading: Overlapping,
    slots: &mut [CallSlot],
) {
    let tol = input.tolerance_ns;
    for call in calls {
        for race in races(call, input.sender) {
            let read = input.read(race);
            let hedge = match reading {
                Overlapping::Hedge => true,
                Overlapping::PerTryTimeout => false,
                Overlapping::Auto => read.hedging,
            };
            let outlasted =
                |row: usize| read.decided_at.is_some_and(|d| input.ended(row) > d + tol);
            // Its answer is its call's only where the call ended with this race.
            let ends_call = race.last().is_some_and(|&r| slots[r].last);
            let mut served_until: Option<i64> = None;
            for (i, &row) in race.iter().enumerate() {
                let (started, ended) = (input.started(row), input.ended(row));
                let overlapping = served_until.is_some_and(|until| started < until - tol);
                served_until = Some(served_until.map_or(ended, |u| u.max(ended)));
                let failed =
                    Outcome::from_class(input.outcome.value(row)).is_some_and(|o| o != Outcome::Ok);
                let next = race
                    .get(i + 1)
                    .map(|&n| input.started(n))
                    .filter(|&s| s < ended - tol);
                // In the caller's clock: when it stopped waiting, and why; never for the
                // attempt it took its answer from, nor for a failed one, which answered with
                // its failure however late its span closed (a 503 written slowly on a busy
                // host).
                let answered = read.answer == Some(i) && !outlasted(row);
                let given_up = if answered || failed {
                    None
                } else if hedge {
                    outlasted(row).then_some("cancelled").zip(read.decided_at)
                } else if let Some(at) = next {
                    Some(("deadline", at))
                } else if outlasted(row) {
                    read.decided_at.map(|at| ("cancelled", at))
                } else {
                    None
                };
                let slot = &mut slots[row];
                slot.hedged = hedge && overlapping;
                slot.overlapped = overlapping;
                slot.decides = ends_call && answered;
                if slot.seen_as.is_none()
                    && let Some((outcome, at)) = given_up
                {
                    slot.gave_up = Some(GaveUp {
                        outcome,
                        end_ns: at.max(started) - input.to_parent[row],
                    });
                }
            }
        }
    }
}

/// Per row: the SERVER child that answered it, for CLIENT spans with SERVER children of
/// other services (see [`own_bounds`]): of several, the first to end with a final outcome,
/// else the last to start (a re-send after failures). Read before the clocks are known, so
/// it cannot use the CLIENT span's end; the others were abandoned or failed before it and
/// bound no clock.
///
/// [`own_bounds`]: super::skew::own_bounds
pub(super) fn answering_children(
    kinds: &[Kind],
    parent_rows: &[Option<usize>],
    service: &StringArray,
    start: &Int64Array,
    end: &Int64Array,
    outcome: &StringArray,
) -> (Vec<Option<usize>>, Vec<u32>) {
    let rows = parent_rows.len();
    let mut answering: Vec<Option<usize>> = vec![None; rows];
    let mut servers = vec![0u32; rows];
    // Smallest wins: final outcomes by end, then the rest by latest start.
    let key = |row: usize| {
        let last = Outcome::from_class(outcome.value(row)).is_none_or(|o| !o.is_retried());
        if last {
            (0u8, end.value(row), row as i64)
        } else {
            (1u8, -start.value(row), -(row as i64))
        }
    };
    for (row, parent) in parent_rows.iter().enumerate() {
        let Some(p) = *parent else { continue };
        if kinds[row] != Kind::Server || service.value(p) == service.value(row) {
            continue;
        }
        servers[p] += 1;
        if answering[p].is_none_or(|best| key(row) < key(best)) {
            answering[p] = Some(row);
        }
    }
    (answering, servers)
}
