//! OTLP -> Arrow: append decoded OTLP spans straight into the builders of [`SPANS_SCHEMA`].
//!
//! Data flow: a receiver decodes an `ExportTraceServiceRequest` into [`crate::wire`]'s
//! messages (strings borrowed from the request buffer), hands it to
//! [`SpanBatchBuilder::append_request`], and calls [`SpanBatchBuilder::finish`] to get one
//! `RecordBatch` plus an [`EncodeReport`]. Each span is validated before any column is
//! touched, so a rejected span leaves no partial row; the report carries the count and the
//! first reason, which become the OTLP partial-success answer.
//!
//! Per span, the attributes are walked twice: once to find, for every concept of the input
//! contract, the alias of highest precedence, and once to copy the attributes that no
//! normalised column carries into the `attributes` map.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{
    ArrayBuilder, ArrayRef, BooleanBuilder, FixedSizeBinaryBuilder, Float64Builder, Int32Builder,
    Int64Builder, MapBuilder, MapFieldNames, RecordBatch, StringBuilder,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode};

use crate::wire::{self, AnyValue, ExportRequest, KeyValue, Span, Value, text};

use crate::conventions::{self, Concept, Conventions};
use crate::outcome::{GRPC_STATUS_NAMES, Outcome, OutcomeSignals, grpc_code_named, is_duplicate};
use crate::schema::{SPAN_ID_LEN, SPANS_SCHEMA, TRACE_ID_LEN};

/// Service name used when the resource has no `service.name`.
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// Why a span was rejected. The text is the English message of the OTLP partial success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpanRejection {
    TraceIdLength(usize),
    TraceIdZero,
    SpanIdLength(usize),
    SpanIdZero,
    ParentSpanIdLength(usize),
    TimeOutOfRange,
    EndBeforeStart,
}

impl std::fmt::Display for SpanRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpanRejection::TraceIdLength(n) => {
                write!(f, "trace id has {n} bytes, expected {TRACE_ID_LEN}")
            }
            SpanRejection::TraceIdZero => f.write_str("trace id is all zeroes"),
            SpanRejection::SpanIdLength(n) => {
                write!(f, "span id has {n} bytes, expected {SPAN_ID_LEN}")
            }
            SpanRejection::SpanIdZero => f.write_str("span id is all zeroes"),
            SpanRejection::ParentSpanIdLength(n) => {
                write!(
                    f,
                    "parent span id has {n} bytes, expected 0 or {SPAN_ID_LEN}"
                )
            }
            SpanRejection::TimeOutOfRange => {
                f.write_str("start or end time is beyond the year 2262 (i64 nanoseconds)")
            }
            SpanRejection::EndBeforeStart => f.write_str("end time is before start time"),
        }
    }
}

/// What one encoding pass did: spans kept, spans rejected (with the first reason), and
/// attributes present but unreadable as their concept (kept in the map, counted here).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EncodeReport {
    pub accepted: u64,
    pub rejected: u64,
    pub first_rejection: Option<String>,
    pub malformed: [u64; Concept::COUNT],
}

impl EncodeReport {
    /// The OTLP partial-success message, or `None` when every span was kept.
    pub fn partial_success_message(&self) -> Option<String> {
        (self.rejected > 0).then(|| {
            format!(
                "rejected {} of {} spans; first: {}",
                self.rejected,
                self.rejected + self.accepted,
                self.first_rejection.as_deref().unwrap_or("invalid span")
            )
        })
    }

    /// Malformed-attribute counts by concept name, for self-metrics.
    pub fn malformed_by_field(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Concept::ALL
            .iter()
            .zip(self.malformed)
            .filter(|(_, n)| *n > 0)
            .map(|(c, n)| (c.as_str(), n))
    }
}

/// Builders for one batch of [`SPANS_SCHEMA`] rows.
pub struct SpanBatchBuilder<'c> {
    conventions: &'c Conventions,
    trace_id: FixedSizeBinaryBuilder,
    span_id: FixedSizeBinaryBuilder,
    parent_span_id: FixedSizeBinaryBuilder,
    service_name: StringBuilder,
    span_name: StringBuilder,
    kind: StringBuilder,
    start_ns: Int64Builder,
    end_ns: Int64Builder,
    duration_ns: Int64Builder,
    status_code: StringBuilder,
    status_message: StringBuilder,
    attempt: Int32Builder,
    retry_cause: StringBuilder,
    deadline_ms: Float64Builder,
    has_idempotency_key: BooleanBuilder,
    idempotent: BooleanBuilder,
    is_write: BooleanBuilder,
    callee_hint: StringBuilder,
    operation: StringBuilder,
    ctx_cancelled: BooleanBuilder,
    pending: BooleanBuilder,
    outcome: StringBuilder,
    attributes: MapBuilder<StringBuilder, StringBuilder>,
    weight: Float64Builder,
    target_hash: Int64Builder,
    instance: StringBuilder,
    idempotency_key_hash: Int64Builder,
    idempotency_hit: BooleanBuilder,
    response_code: StringBuilder,
    duplicate: BooleanBuilder,
    retry_after_ms: Float64Builder,
    report: EncodeReport,
    /// Scratch: indices of attributes carried by a normalised column (reused across spans).
    consumed: Vec<usize>,
    /// Leave the columns the analysis never reads empty ([`crate::schema::NOT_ANALYSED`]).
    lean: bool,
}

impl<'c> SpanBatchBuilder<'c> {
    pub fn new(conventions: &'c Conventions) -> Self {
        Self::with_capacity(conventions, 0)
    }

    /// A builder sized for `spans` spans of `request`, so the stored batch's buffers are not
    /// left up to twice as large as their contents by growth: fixed-width columns get
    /// exactly `spans` rows, strings their exact or typical byte counts. Held spans cost
    /// memory in assembly for as long as their trace is open.
    pub fn for_request(conventions: &'c Conventions, request: &ExportRequest) -> Self {
        let count = spans_of(request).count();
        let mut builder = Self::with_capacity(conventions, count);
        let names: usize = spans_of(request).map(|s| s.name.len()).sum();
        // Bytes of a resource attribute (the first of `keys` present) on each of its spans.
        let per_span = |keys: &[&str], missing: usize| -> usize {
            request
                .resource_spans
                .iter()
                .map(|r| {
                    let value = r
                        .resource
                        .as_ref()
                        .and_then(|r| keys.iter().find_map(|k| find_str(&r.attributes, k)))
                        .map_or(missing, str::len);
                    value * r.scope_spans.iter().map(|s| s.spans.len()).sum::<usize>()
                })
                .sum()
        };
        builder.service_name =
            StringBuilder::with_capacity(count, per_span(&["service.name"], UNKNOWN_SERVICE.len()));
        builder.instance =
            StringBuilder::with_capacity(count, per_span(&["service.instance.id", "host.name"], 0));
        builder.span_name = StringBuilder::with_capacity(count, names);
        builder.operation = StringBuilder::with_capacity(count, names);
        builder
    }

    /// A builder whose columns have room for `spans` rows before growing (0: arrow's
    /// defaults).
    fn with_capacity(conventions: &'c Conventions, spans: usize) -> Self {
        let rows = if spans == 0 { 1024 } else { spans };
        // Typical bytes of the short enum-like strings (kind, status, outcome, cause).
        let short = rows * 6;
        SpanBatchBuilder {
            conventions,
            trace_id: FixedSizeBinaryBuilder::with_capacity(rows, TRACE_ID_LEN),
            span_id: FixedSizeBinaryBuilder::with_capacity(rows, SPAN_ID_LEN),
            parent_span_id: FixedSizeBinaryBuilder::with_capacity(rows, SPAN_ID_LEN),
            service_name: StringBuilder::with_capacity(rows, rows * 8),
            span_name: StringBuilder::with_capacity(rows, rows * 16),
            kind: StringBuilder::with_capacity(rows, short),
            start_ns: Int64Builder::with_capacity(rows),
            end_ns: Int64Builder::with_capacity(rows),
            duration_ns: Int64Builder::with_capacity(rows),
            status_code: StringBuilder::with_capacity(rows, short),
            status_message: StringBuilder::with_capacity(rows, 0),
            attempt: Int32Builder::with_capacity(rows),
            retry_cause: StringBuilder::with_capacity(rows, 0),
            deadline_ms: Float64Builder::with_capacity(rows),
            has_idempotency_key: BooleanBuilder::with_capacity(rows),
            idempotent: BooleanBuilder::with_capacity(rows),
            is_write: BooleanBuilder::with_capacity(rows),
            callee_hint: StringBuilder::with_capacity(rows, 0),
            operation: StringBuilder::with_capacity(rows, rows * 16),
            ctx_cancelled: BooleanBuilder::with_capacity(rows),
            pending: BooleanBuilder::with_capacity(rows),
            outcome: StringBuilder::with_capacity(rows, short),
            weight: Float64Builder::with_capacity(rows),
            target_hash: Int64Builder::with_capacity(rows),
            instance: StringBuilder::with_capacity(rows, 0),
            idempotency_key_hash: Int64Builder::with_capacity(rows),
            idempotency_hit: BooleanBuilder::with_capacity(rows),
            response_code: StringBuilder::with_capacity(rows, short),
            duplicate: BooleanBuilder::with_capacity(rows),
            retry_after_ms: Float64Builder::with_capacity(rows),
            attributes: MapBuilder::new(
                Some(MapFieldNames {
                    entry: "entries".into(),
                    key: "keys".into(),
                    value: "values".into(),
                }),
                StringBuilder::new(),
                StringBuilder::new(),
            ),
            report: EncodeReport::default(),
            consumed: Vec::new(),
            lean: false,
        }
    }

    /// [`SpanBatchBuilder::for_request`] encoding only what the analysis reads: span names
    /// empty, status messages null, attribute maps empty ([`crate::schema::lean`]'s form,
    /// without building the columns first). The live path holds spans this way; files
    /// keep them whole.
    pub fn lean_for_request(conventions: &'c Conventions, request: &ExportRequest) -> Self {
        let mut builder = Self::for_request(conventions, request);
        builder.lean = true;
        builder.span_name = StringBuilder::with_capacity(spans_of(request).count(), 0);
        builder
    }

    /// Append every span of a request; invalid spans are counted, not appended.
    pub fn append_request(&mut self, request: &ExportRequest) {
        for resource_spans in &request.resource_spans {
            let resource = |key| {
                resource_spans
                    .resource
                    .as_ref()
                    .and_then(|r| find_str(&r.attributes, key))
                    .filter(|s| !s.is_empty())
            };
            let service = resource("service.name").unwrap_or(UNKNOWN_SERVICE);
            let instance = resource("service.instance.id").or_else(|| resource("host.name"));
            for scope_spans in &resource_spans.scope_spans {
                for span in &scope_spans.spans {
                    if let Err(rejection) = self.append_span(service, instance, span) {
                        self.report.rejected += 1;
                        if self.report.first_rejection.is_none() {
                            self.report.first_rejection = Some(rejection.to_string());
                        }
                    }
                }
            }
        }
    }

    /// Validate and append one span of `service` (running as `instance`, when known).
    pub fn append_span(
        &mut self,
        service: &str,
        instance: Option<&str>,
        span: &Span,
    ) -> Result<(), SpanRejection> {
        let (start_ns, end_ns) = validate(span)?;

        self.trace_id
            .append_value(&span.trace_id)
            .map_err(|_| SpanRejection::TraceIdLength(span.trace_id.len()))?;
        // Lengths were validated above, so these appends cannot fail.
        let _ = self.span_id.append_value(&span.span_id);
        if span.parent_span_id.is_empty() {
            self.parent_span_id.append_null();
        } else {
            let _ = self.parent_span_id.append_value(&span.parent_span_id);
        }
        self.service_name.append_value(service);
        self.span_name
            .append_value(if self.lean { "" } else { text(&span.name) });
        self.kind.append_value(kind_name(span.kind));
        self.start_ns.append_value(start_ns);
        self.end_ns.append_value(end_ns);
        self.duration_ns.append_value(end_ns - start_ns);
        let status = span.status.as_ref();
        let status_code = status.map_or(StatusCode::Unset as i32, |s| s.code);
        self.status_code.append_value(status_name(status_code));
        self.status_message.append_option(
            status
                .map(|s| text(&s.message))
                .filter(|m| !m.is_empty() && !self.lean),
        );

        self.append_contract_columns(
            span,
            (start_ns, end_ns),
            status_code == StatusCode::Error as i32,
        );
        let weight = crate::sampling::adjusted_count(text(&span.trace_state))
            .or_else(|| self.conventions.sampling_weight(service))
            .unwrap_or(1.0);
        self.weight.append_value(weight);
        self.instance.append_option(instance);
        self.report.accepted += 1;
        Ok(())
    }

    /// Derive the normalised columns and the remaining-attributes map for one span.
    fn append_contract_columns(
        &mut self,
        span: &Span,
        (start_ns, end_ns): (i64, i64),
        status_error: bool,
    ) {
        let mut r = Reader::new(
            self.conventions,
            &span.attributes,
            std::mem::take(&mut self.consumed),
        );

        // An attempt attribute that cannot be read is counted as malformed, yet still marks
        // the span as some retry: read as a first attempt it would split its call in two.
        let attempt = r
            .take(Concept::Attempt, |v| {
                conventions::as_i64(v)
                    .and_then(|n| i32::try_from(n).ok())
                    .filter(|n| *n >= 0)
            })
            .or_else(|| {
                // A proxy's attempt count starts at 1 (Envoy's x-envoy-attempt-count).
                r.take(Concept::AttemptCount, |v| {
                    conventions::as_i64(v)
                        .and_then(|n| i32::try_from(n).ok())
                        .filter(|n| *n >= 1)
                        .map(|n| n - 1)
                })
            })
            .or_else(|| {
                // Envoy's upstream spans (one per attempt, below the request's span) say
                // `retry.count` on retries only.
                if r.str(Concept::Component) != Some("proxy") {
                    return None;
                }
                r.take(Concept::ProxyRetryCount, |v| {
                    conventions::as_i64(v)
                        .and_then(|n| i32::try_from(n).ok())
                        .filter(|n| *n >= 0)
                })
                .or_else(|| is_envoy_upstream(text(&span.name)).then_some(0))
            })
            .or_else(|| {
                let malformed = &r.malformed;
                [
                    Concept::Attempt,
                    Concept::AttemptCount,
                    Concept::ProxyRetryCount,
                ]
                .iter()
                .any(|c| malformed[*c as usize])
                .then_some(crate::schema::UNREADABLE_ATTEMPT)
            });
        let cause = r
            .take(Concept::Cause, conventions::render)
            .map(|c| Outcome::normalise_cause(&c));
        let deadline = r
            .take(Concept::Deadline, conventions::as_budget_ms)
            .or_else(|| {
                // Epoch milliseconds; a deadline already past at the start is a budget of 0.
                r.take(Concept::AbsoluteDeadline, conventions::as_budget_ms)
                    .map(|epoch_ms| (epoch_ms - start_ns as f64 / 1e6).max(0.0))
            });
        let retry_after = r
            .take(Concept::RetryAfter, |v| {
                conventions::retry_after_ms(v, end_ns)
            })
            .or_else(|| r.take(Concept::GrpcPushback, |v| Some(conventions::pushback_ms(v))));
        self.retry_after_ms.append_option(retry_after);
        let conventions = self.conventions;
        let key_hash = r.take(Concept::IdempotencyKey, |v| {
            let key = match conventions::scalar(v)? {
                Value::StringValue(s) => std::borrow::Cow::Borrowed(text(s)),
                _ => std::borrow::Cow::Owned(conventions::render(v)?),
            };
            (!key.is_empty()).then(|| conventions.idempotency_key_hash(key.as_bytes()))
        });
        if key_hash.is_some() {
            // The key's other aliases leave the attributes too: its value is kept nowhere.
            r.consume_every(conventions, Concept::IdempotencyKey);
        }
        let has_key = key_hash.is_some();
        let idempotent = r.take(Concept::Idempotent, conventions::as_bool);
        let ctx_cancelled = r
            .take(Concept::CtxCancelled, conventions::as_bool)
            .unwrap_or(false);
        let (pending, replayed) = r
            .take(Concept::State, |v| {
                let state = conventions::as_str(v)?;
                let is = |name: &str| state.eq_ignore_ascii_case(name);
                Some((is("pending"), is("replayed")))
            })
            .unwrap_or((false, false));
        let hit = r
            .take(Concept::IdempotencyHit, conventions::as_bool)
            .or(replayed.then_some(true));

        let is_write = r
            .str(Concept::HttpMethod)
            .is_some_and(|m| m.eq_ignore_ascii_case("POST") || m.eq_ignore_ascii_case("PATCH"))
            || r.str(Concept::DbOperation).is_some_and(|op| {
                let verb = op.split_whitespace().next().unwrap_or("");
                verb.eq_ignore_ascii_case("INSERT") || verb.eq_ignore_ascii_case("UPDATE")
            });
        let callee = r
            .str(Concept::CalleeHint)
            .map(istio_cluster_service)
            .filter(|s| !s.is_empty());
        let target = match r.str(Concept::Url).filter(|s| !s.is_empty()) {
            Some(url) => Some(crate::hash::fixed_hash(&[url.as_bytes()])),
            None => r.str(Concept::UrlPath).map(|path| {
                let query = r.str(Concept::UrlQuery).unwrap_or("");
                crate::hash::fixed_hash(&[path.as_bytes(), query.as_bytes()])
            }),
        };
        // Written straight into the column: no per-span String.
        match (r.str(Concept::RpcMethod), r.str(Concept::RpcService)) {
            (Some(method), Some(service)) => {
                let _ = write!(self.operation, "{service}/{method}");
                self.operation.append_value("");
            }
            (Some(method), None) => self.operation.append_value(method),
            _ => self.operation.append_value(
                r.str(Concept::Route)
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| strip_grpc_prefix(text(&span.name))),
            ),
        }
        let grpc_code = r.get(Concept::GrpcStatus).and_then(|v| {
            conventions::as_i64(v).or_else(|| grpc_code_named(conventions::as_str(v)?))
        });
        let http_code = r.get(Concept::HttpStatus).and_then(conventions::as_i64);
        let error_type = r.str(Concept::ErrorType).filter(|s| !s.is_empty());
        // Kept raw for the status-code figures: the HTTP status, else the gRPC status's name.
        match (http_code, grpc_code) {
            (Some(code), _) => {
                let _ = write!(self.response_code, "{code}");
                self.response_code.append_value("");
            }
            (None, Some(code)) => self.response_code.append_option(
                usize::try_from(code)
                    .ok()
                    .and_then(|c| GRPC_STATUS_NAMES.get(c)),
            ),
            (None, None) => self.response_code.append_null(),
        }
        self.duplicate
            .append_value(is_duplicate(http_code, grpc_code, error_type));
        let signals = OutcomeSignals {
            proxy: r
                .str(Concept::ProxyFlags)
                .and_then(Outcome::from_envoy_flags)
                .or_else(|| {
                    r.str(Concept::TerminationState)
                        .and_then(Outcome::from_termination_state)
                }),
            grpc: grpc_code.and_then(Outcome::from_grpc_code),
            http: http_code.and_then(Outcome::from_http_status),
            error_type: error_type.map(Outcome::from_error_type),
            ctx_cancelled,
            err_code_nonzero: r.get(Concept::ErrCode).is_some_and(|v| {
                match conventions::as_i64(v) {
                    Some(code) => code != 0,
                    None => conventions::render(v).is_some_and(|s| !s.is_empty() && s != "0"),
                }
            }),
            status_error,
        };

        self.attempt.append_option(attempt);
        self.retry_cause.append_option(cause);
        self.deadline_ms.append_option(deadline);
        self.has_idempotency_key.append_value(has_key);
        self.idempotency_key_hash.append_option(key_hash);
        self.idempotency_hit.append_option(hit);
        self.idempotent.append_option(idempotent);
        self.is_write.append_value(is_write);
        self.callee_hint.append_option(callee);
        self.target_hash.append_option(target);
        self.ctx_cancelled.append_value(ctx_cancelled);
        self.pending.append_value(pending);
        self.outcome.append_value(signals.classify().as_str());

        for (index, kv) in span.attributes.iter().enumerate() {
            if self.lean || r.consumed.contains(&index) {
                continue;
            }
            self.attributes.keys().append_value(text(&kv.key));
            self.attributes
                .values()
                .append_option(kv.value.as_ref().and_then(conventions::render));
        }
        // The map column is non-nullable; an empty map is a valid entry.
        let _ = self.attributes.append(true);
        for (count, bad) in self.report.malformed.iter_mut().zip(r.malformed) {
            *count += u64::from(bad);
        }
        self.consumed = r.consumed;
    }

    /// Rows appended so far.
    pub fn len(&self) -> usize {
        self.trace_id.len()
    }

    /// True when no span has been appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Finish the batch. The columns are built to the schema, so assembling cannot fail
    /// unless this module and `schema.rs` disagree, which the tests catch.
    pub fn finish(mut self) -> (RecordBatch, EncodeReport) {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.trace_id.finish()),
            Arc::new(self.span_id.finish()),
            Arc::new(self.parent_span_id.finish()),
            Arc::new(self.service_name.finish()),
            Arc::new(self.span_name.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.start_ns.finish()),
            Arc::new(self.end_ns.finish()),
            Arc::new(self.duration_ns.finish()),
            Arc::new(self.status_code.finish()),
            Arc::new(self.status_message.finish()),
            Arc::new(self.attempt.finish()),
            Arc::new(self.retry_cause.finish()),
            Arc::new(self.deadline_ms.finish()),
            Arc::new(self.has_idempotency_key.finish()),
            Arc::new(self.idempotent.finish()),
            Arc::new(self.is_write.finish()),
            Arc::new(self.callee_hint.finish()),
            Arc::new(self.operation.finish()),
            Arc::new(self.ctx_cancelled.finish()),
            Arc::new(self.pending.finish()),
            Arc::new(self.outcome.finish()),
            Arc::new(self.attributes.finish()),
            Arc::new(self.weight.finish()),
            Arc::new(self.target_hash.finish()),
            Arc::new(self.instance.finish()),
            Arc::new(self.idempotency_key_hash.finish()),
            Arc::new(self.idempotency_hit.finish()),
            Arc::new(self.response_code.finish()),
            Arc::new(self.duplicate.finish()),
            Arc::new(self.retry_after_ms.finish()),
        ];
        let batch = match RecordBatch::try_new(SPANS_SCHEMA.clone(), columns) {
            Ok(batch) => batch,
            Err(e) => unreachable!("encoder columns disagree with SPANS_SCHEMA: {e}"),
        };
        (batch, self.report)
    }
}

/// Encode a whole decoded request into one batch.
pub fn encode(conventions: &Conventions, request: &ExportRequest) -> (RecordBatch, EncodeReport) {
    let mut builder = SpanBatchBuilder::for_request(conventions, request);
    builder.append_request(request);
    builder.finish()
}

/// [`encode`] in the lean form the live path holds ([`SpanBatchBuilder::lean_for_request`]).
pub fn encode_lean(
    conventions: &Conventions,
    request: &ExportRequest,
) -> (RecordBatch, EncodeReport) {
    let mut builder = SpanBatchBuilder::lean_for_request(conventions, request);
    builder.append_request(request);
    builder.finish()
}

/// [`encode`] for a request built with `opentelemetry_proto`'s types (tests, the synthetic
/// generator), through its protobuf encoding.
pub fn encode_request(
    conventions: &Conventions,
    request: &ExportTraceServiceRequest,
) -> (RecordBatch, EncodeReport) {
    encode(conventions, &wire::from_proto(request))
}

/// [`encode_lean`] for a request built with `opentelemetry_proto`'s types.
pub fn encode_request_lean(
    conventions: &Conventions,
    request: &ExportTraceServiceRequest,
) -> (RecordBatch, EncodeReport) {
    encode_lean(conventions, &wire::from_proto(request))
}

/// Every span of a request, in order.
pub fn spans_of(request: &ExportRequest) -> impl Iterator<Item = &Span> {
    request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
}

/// Check ids and times; returns the times as `i64` nanoseconds.
fn validate(span: &Span) -> Result<(i64, i64), SpanRejection> {
    if span.trace_id.len() != TRACE_ID_LEN as usize {
        return Err(SpanRejection::TraceIdLength(span.trace_id.len()));
    }
    if span.trace_id.iter().all(|b| *b == 0) {
        return Err(SpanRejection::TraceIdZero);
    }
    if span.span_id.len() != SPAN_ID_LEN as usize {
        return Err(SpanRejection::SpanIdLength(span.span_id.len()));
    }
    if span.span_id.iter().all(|b| *b == 0) {
        return Err(SpanRejection::SpanIdZero);
    }
    if !span.parent_span_id.is_empty() && span.parent_span_id.len() != SPAN_ID_LEN as usize {
        return Err(SpanRejection::ParentSpanIdLength(span.parent_span_id.len()));
    }
    let start = i64::try_from(span.start_time_unix_nano);
    let end = i64::try_from(span.end_time_unix_nano);
    let (Ok(start), Ok(end)) = (start, end) else {
        return Err(SpanRejection::TimeOutOfRange);
    };
    if end < start {
        return Err(SpanRejection::EndBeforeStart);
    }
    Ok((start, end))
}

/// gRPC's per-attempt tracing names the call, attempt and server spans `Sent.M`,
/// `Attempt.M` and `Recv.M`; all three are operation `M`.
fn strip_grpc_prefix(name: &str) -> &str {
    ["Sent.", "Attempt.", "Recv."]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name)
}

/// Envoy names the span of each upstream attempt `router <cluster> egress`.
fn is_envoy_upstream(name: &str) -> bool {
    name.starts_with("router ") && name.ends_with(" egress")
}

/// Istio names a cluster `outbound|<port>|<subset>|<host>`: the service is the host's first
/// label (`outbound|9080||reviews.default.svc.cluster.local` is `reviews`).
fn istio_cluster_service(name: &str) -> &str {
    match name.strip_prefix("outbound|") {
        Some(rest) => rest
            .rsplit('|')
            .next()
            .and_then(|host| host.split('.').next())
            .unwrap_or(name),
        None => name,
    }
}

fn find_str<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attributes
        .iter()
        .find(|kv| kv.key == key.as_bytes())
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(text(s)),
            _ => None,
        })
}

/// Lower-case span kind name for the `kind` column.
pub fn kind_name(kind: i32) -> &'static str {
    match SpanKind::try_from(kind) {
        Ok(SpanKind::Internal) => "internal",
        Ok(SpanKind::Server) => "server",
        Ok(SpanKind::Client) => "client",
        Ok(SpanKind::Producer) => "producer",
        Ok(SpanKind::Consumer) => "consumer",
        Ok(SpanKind::Unspecified) | Err(_) => "unspecified",
    }
}

fn status_name(code: i32) -> &'static str {
    match StatusCode::try_from(code) {
        Ok(StatusCode::Ok) => "ok",
        Ok(StatusCode::Error) => "error",
        Ok(StatusCode::Unset) | Err(_) => "unset",
    }
}

/// One span's attributes, indexed by concept: for each concept the attribute of highest
/// precedence. Concepts carried by their own column are read with [`Reader::take`], which
/// marks the attribute consumed when it parses and malformed when it does not.
struct Reader<'a> {
    attrs: &'a [KeyValue],
    best: [Option<(u8, usize)>; Concept::COUNT],
    consumed: Vec<usize>,
    malformed: [bool; Concept::COUNT],
}

impl<'a> Reader<'a> {
    fn new(conventions: &Conventions, attrs: &'a [KeyValue], mut consumed: Vec<usize>) -> Self {
        let mut best: [Option<(u8, usize)>; Concept::COUNT] = [None; Concept::COUNT];
        for (index, kv) in attrs.iter().enumerate() {
            for &(concept, rank) in conventions.roles(&kv.key) {
                let slot = &mut best[concept as usize];
                if slot.is_none_or(|(r, _)| rank < r) {
                    *slot = Some((rank, index));
                }
            }
        }
        consumed.clear();
        Reader {
            attrs,
            best,
            consumed,
            malformed: [false; Concept::COUNT],
        }
    }

    fn found(&self, concept: Concept) -> Option<(usize, &'a AnyValue)> {
        let (_, index) = self.best[concept as usize]?;
        Some((index, self.attrs[index].value.as_ref()?))
    }

    fn get(&self, concept: Concept) -> Option<&'a AnyValue> {
        self.found(concept).map(|(_, v)| v)
    }

    fn str(&self, concept: Concept) -> Option<&'a str> {
        self.get(concept).and_then(conventions::as_str)
    }

    /// Mark every attribute playing `concept` consumed, not only the one [`Reader::take`]
    /// read.
    fn consume_every(&mut self, conventions: &Conventions, concept: Concept) {
        for (index, kv) in self.attrs.iter().enumerate() {
            let plays = conventions
                .roles(&kv.key)
                .iter()
                .any(|(c, _)| *c == concept);
            if plays && !self.consumed.contains(&index) {
                self.consumed.push(index);
            }
        }
    }

    fn take<T>(
        &mut self,
        concept: Concept,
        parse: impl FnOnce(&AnyValue) -> Option<T>,
    ) -> Option<T> {
        let (index, value) = self.found(concept)?;
        let parsed = parse(value);
        match parsed {
            Some(_) => self.consumed.push(index),
            None => self.malformed[concept as usize] = true,
        }
        parsed
    }
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
