//! The Parquet archive (`archive.*`, off unless `archive.dir` is set): every span the
//! receivers accept, whole (name, status message and attributes included), as Parquet files
//! with the span schema that DuckDB, pyarrow and `stormglass analyze DIR` read as they are.
//!
//! Data flow: [`ArchivingSink`] sits between the receivers and assembly. A batch is archived
//! *when it is accepted*, not when its trace is released: its bytes are reserved against the
//! memory budget first (a request that would cross it is refused whole, retryably, like any
//! other), assembly takes its analysed columns, and the whole batch goes to the archive's
//! own thread, which appends it to the open file and returns the reservation.
//!
//! Files are written as `spans-<UTC time>-<n>.parquet.tmp` and renamed to
//! `spans-<UTC time>-<n>.parquet` once closed and synced, so a reader never sees a torn
//! file. A file is closed at the latest `archive.flush` after its first span, or when it
//! reaches `archive.max_file_bytes`. What a crash (`kill -9`, out of memory) can lose is
//! therefore bounded: the spans of the open file (at most `archive.flush` of input,
//! `stormglass_archive_unflushed_spans` now) and the batches queued for the thread. Torn
//! `.tmp` files are removed at the next start. Retention (`archive.max_age`,
//! `archive.max_bytes`) deletes the oldest files after every close.
//!
//! A file that cannot be written (disk full, permissions) is counted in
//! `stormglass_archive_lost_spans_total` and `stormglass_internal_errors_total{task="archive"}`
//! and fails `/healthz` until a file is written again; the live analysis goes on.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arrow::array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::Deserialize;
use stormglass_model::SPANS_SCHEMA;
use stormglass_runtime::duration;
use stormglass_runtime::{Health, MemoryBudget, Overload, Reservation, SinkFull, SpanSink};

/// File names: `spans-20261201T124417.123Z-0.parquet`; sorting by name sorts by time.
const PREFIX: &str = "spans-";
const SUFFIX: &str = ".parquet";
const TEMPORARY: &str = ".parquet.tmp";

/// `archive.*` configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveConfig {
    /// Where the files go; no archive when unset.
    pub dir: Option<PathBuf>,
    /// A file is closed and made visible at most this long after its first span: the
    /// bound on what a crash can lose.
    #[serde(with = "duration")]
    pub flush: Duration,
    /// A file is closed when it reaches this size.
    pub max_file_bytes: bytesize::ByteSize,
    /// Files older than this are deleted.
    #[serde(with = "duration")]
    pub max_age: Duration,
    /// The oldest files are deleted while the archive is larger than this.
    pub max_bytes: bytesize::ByteSize,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            dir: None,
            flush: Duration::from_secs(10),
            max_file_bytes: bytesize::ByteSize::mib(256),
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: bytesize::ByteSize::gib(10),
        }
    }
}

impl ArchiveConfig {
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.flush.is_zero() {
            problems.push((
                format!("{prefix}.flush"),
                "must be greater than 0 (default 10s)".into(),
            ));
        }
        if self.max_file_bytes.as_u64() < 1 << 20 {
            problems.push((
                format!("{prefix}.max_file_bytes"),
                "must be at least 1MiB (default 256MiB)".into(),
            ));
        }
        if self.max_age.is_zero() {
            problems.push((
                format!("{prefix}.max_age"),
                "must be greater than 0 (default 7days)".into(),
            ));
        }
        if self.max_bytes < self.max_file_bytes {
            problems.push((
                format!("{prefix}.max_bytes"),
                "must be at least archive.max_file_bytes (default 10GiB)".into(),
            ));
        }
        problems
    }
}

/// The file in the archive directory holding the idempotency key hash's secret.
pub const KEY_SECRET_FILE: &str = "idempotency-key.secret";

/// The secret idempotency keys are hashed with ([`stormglass_model::Conventions::with_key_secret`]),
/// kept in `dir` so the spans of one trace archived before a restart and received after it
/// hash their keys alike: read from [`KEY_SECRET_FILE`], or made (random, readable by the
/// owner alone) when there is none.
pub fn key_secret(dir: &Path) -> std::io::Result<[u8; 16]> {
    let path = dir.join(KEY_SECRET_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => <[u8; 16]>::try_from(bytes.as_slice()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: not 16 bytes; delete it to make a new one",
                    path.display()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            let secret: [u8; 16] = rand::random();
            let temporary = dir.join(format!("{KEY_SECRET_FILE}.tmp"));
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&temporary)?;
            std::io::Write::write_all(&mut file, &secret)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &path)?;
            Ok(secret)
        }
        Err(e) => Err(e),
    }
}

/// One closed archive file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchivedFile {
    pub path: PathBuf,
    pub bytes: u64,
    /// When it was closed (its modification time).
    pub closed: SystemTime,
}

/// The closed files of an archive directory, oldest first.
pub fn list(dir: &Path) -> std::io::Result<Vec<ArchivedFile>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(PREFIX) && name.ends_with(SUFFIX)) {
            continue;
        }
        let metadata = entry.metadata()?;
        if metadata.is_file() {
            files.push(ArchivedFile {
                path: entry.path(),
                bytes: metadata.len(),
                closed: metadata.modified()?,
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Archive self-metrics.
#[derive(Clone)]
struct ArchiveMetrics {
    spans: IntCounter,
    lost: IntCounter,
    unflushed: IntGauge,
    files: IntGauge,
    bytes: IntGauge,
    deleted: IntCounterVec,
}

impl ArchiveMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let spans = IntCounter::new(
            "stormglass_archive_spans_total",
            "Spans written to archive files that are closed and visible.",
        )?;
        let lost = IntCounter::new(
            "stormglass_archive_lost_spans_total",
            "Accepted spans that could not be archived (a file failed to write); they were still analysed.",
        )?;
        let unflushed = IntGauge::new(
            "stormglass_archive_unflushed_spans",
            "Accepted spans not yet in a visible archive file: what a crash now would lose from the archive.",
        )?;
        let files = IntGauge::new(
            "stormglass_archive_files",
            "Closed files in the archive directory.",
        )?;
        let bytes = IntGauge::new(
            "stormglass_archive_bytes",
            "Bytes of the closed files in the archive directory.",
        )?;
        let deleted = IntCounterVec::new(
            Opts::new(
                "stormglass_archive_deleted_files_total",
                "Archive files deleted by retention, by reason (max_age, max_bytes).",
            ),
            &["reason"],
        )?;
        for reason in ["max_age", "max_bytes"] {
            deleted.with_label_values(&[reason]);
        }
        registry.register(Box::new(spans.clone()))?;
        registry.register(Box::new(lost.clone()))?;
        registry.register(Box::new(unflushed.clone()))?;
        registry.register(Box::new(files.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(deleted.clone()))?;
        Ok(ArchiveMetrics {
            spans,
            lost,
            unflushed,
            files,
            bytes,
            deleted,
        })
    }
}

/// Starting the archive failed.
#[derive(Debug)]
pub enum StartError {
    Io(PathBuf, std::io::Error),
    Metrics(prometheus::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Io(path, e) => write!(f, "archive.dir {}: {e}", path.display()),
            StartError::Metrics(e) => write!(f, "cannot register the archive metrics: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// The running archive: a handle to its writer thread.
pub struct Archive {
    sender: Mutex<Option<mpsc::Sender<Message>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    metrics: ArchiveMetrics,
}

enum Message {
    Spans(RecordBatch, Reservation),
    /// Close the open file now and answer.
    Flush(mpsc::Sender<()>),
}

impl Archive {
    /// Create the directory if needed, remove files torn by a crash, apply retention, and
    /// start the writer thread.
    pub fn start(
        config: &ArchiveConfig,
        dir: &Path,
        budget: MemoryBudget,
        health: Health,
        registry: &Registry,
    ) -> Result<Archive, StartError> {
        let io = |e| StartError::Io(dir.to_owned(), e);
        std::fs::create_dir_all(dir).map_err(io)?;
        let metrics = ArchiveMetrics::register(registry).map_err(StartError::Metrics)?;
        remove_torn(dir).map_err(io)?;
        let writer = Writer {
            dir: dir.to_owned(),
            config: config.clone(),
            metrics: metrics.clone(),
            budget,
            health,
            open: None,
            sequence: 0,
        };
        writer.retention();
        let (sender, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("stormglass-archive".into())
            .spawn(move || writer.run(&receiver))
            .map_err(io)?;
        Ok(Archive {
            sender: Mutex::new(Some(sender)),
            thread: Mutex::new(Some(thread)),
            metrics,
        })
    }

    /// Append a batch of accepted spans; `reservation` holds its bytes until written.
    pub fn append(&self, batch: RecordBatch, reservation: Reservation) {
        let spans = batch.num_rows() as i64;
        let sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        match sender.as_ref() {
            Some(s) if s.send(Message::Spans(batch, reservation)).is_ok() => {
                self.metrics.unflushed.add(spans);
            }
            _ => {
                // Only after `finish`, which runs once the receivers have stopped.
                tracing::error!(spans, "a batch reached the archive after it was closed");
                self.metrics.lost.inc_by(spans as u64);
            }
        }
    }

    /// Close the open file now, so everything appended so far is visible.
    pub fn flush(&self) {
        let (done, wait) = mpsc::channel();
        let sent = self
            .sender
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|s| s.send(Message::Flush(done)).is_ok());
        if sent {
            let _ = wait.recv();
        }
    }

    /// Write everything appended, close the last file and stop the thread (blocking).
    pub fn finish(&self) {
        drop(self.sender.lock().unwrap_or_else(|p| p.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("the archive thread panicked");
        }
    }
}

/// A [`SpanSink`] that archives every batch the inner sink (assembly) accepts.
pub struct ArchivingSink {
    archive: Arc<Archive>,
    inner: Arc<dyn SpanSink>,
    budget: MemoryBudget,
}

impl ArchivingSink {
    pub fn new(archive: Arc<Archive>, inner: Arc<dyn SpanSink>, budget: MemoryBudget) -> Self {
        ArchivingSink {
            archive,
            inner,
            budget,
        }
    }
}

impl SpanSink for ArchivingSink {
    fn accept(&self, batch: RecordBatch) -> Result<(), SinkFull> {
        // Reserve the whole batch first: once the inner sink has it, it must be archived.
        let reservation = self
            .budget
            .try_reserve(batch.get_array_memory_size())
            .map_err(|_| SinkFull {
                retry_after: Duration::from_secs(1),
                limit: Overload::Memory,
            })?;
        self.inner.accept(batch.clone())?;
        self.archive.append(batch, reservation);
        Ok(())
    }
}

struct OpenFile {
    temporary: PathBuf,
    path: PathBuf,
    writer: ArrowWriter<File>,
    spans: u64,
    deadline: Instant,
    /// The writer's buffered row group, held against the budget.
    buffered: Reservation,
}

struct Writer {
    dir: PathBuf,
    config: ArchiveConfig,
    metrics: ArchiveMetrics,
    budget: MemoryBudget,
    health: Health,
    open: Option<OpenFile>,
    sequence: u64,
}

impl Writer {
    fn run(mut self, receiver: &mpsc::Receiver<Message>) {
        loop {
            let message = match &self.open {
                Some(open) => {
                    match receiver
                        .recv_timeout(open.deadline.saturating_duration_since(Instant::now()))
                    {
                        Ok(m) => Some(m),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
                None => match receiver.recv() {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvError) => break,
                },
            };
            match message {
                Some(Message::Spans(batch, reservation)) => {
                    self.write(&batch);
                    drop(reservation);
                }
                Some(Message::Flush(done)) => {
                    self.close();
                    let _ = done.send(());
                }
                None => self.close(),
            }
        }
        self.close();
    }

    fn write(&mut self, batch: &RecordBatch) {
        let spans = batch.num_rows() as u64;
        if self.open.is_none() {
            match self.create() {
                Ok(open) => self.open = Some(open),
                Err(e) => return self.failed(spans, &format!("cannot create a file: {e}")),
            }
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if let Err(e) = open.writer.write(batch) {
            let detail = format!("cannot write {}: {e}", open.temporary.display());
            return self.failed(spans, &detail);
        }
        open.spans += spans;
        open.buffered.resize(open.writer.memory_size());
        let size = open.writer.bytes_written() + open.writer.in_progress_size();
        if size as u64 >= self.config.max_file_bytes.as_u64() {
            self.close();
        }
    }

    fn create(&mut self) -> Result<OpenFile, parquet::errors::ParquetError> {
        let stamp: String = humantime::format_rfc3339_millis(SystemTime::now())
            .to_string()
            .chars()
            .filter(|c| *c != '-' && *c != ':')
            .collect();
        let (temporary, path) = loop {
            let name = format!("{PREFIX}{stamp}-{}", self.sequence);
            self.sequence += 1;
            let path = self.dir.join(format!("{name}{SUFFIX}"));
            if !path.exists() {
                break (self.dir.join(format!("{name}{TEMPORARY}")), path);
            }
        };
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            // Bounds the row group buffered in memory before it reaches the file.
            .set_max_row_group_row_count(Some(128 * 1024))
            .set_max_row_group_bytes(Some(32 << 20))
            .build();
        let file = File::create(&temporary)?;
        let writer = ArrowWriter::try_new(file, SPANS_SCHEMA.clone(), Some(properties))?;
        Ok(OpenFile {
            temporary,
            path,
            writer,
            spans: 0,
            deadline: Instant::now() + self.config.flush,
            buffered: self.budget.force(0),
        })
    }

    /// Finish, sync and rename the open file, then apply retention.
    fn close(&mut self) {
        let Some(mut open) = self.open.take() else {
            return;
        };
        let closed = open
            .writer
            .finish()
            .map_err(|e| e.to_string())
            .and_then(|_| open.writer.inner().sync_all().map_err(|e| e.to_string()))
            .and_then(|()| std::fs::rename(&open.temporary, &open.path).map_err(|e| e.to_string()));
        let spans = open.spans;
        match closed {
            Ok(()) => {
                self.metrics.spans.inc_by(spans);
                self.metrics.unflushed.sub(spans as i64);
                self.health.ok("archive");
                self.retention();
            }
            Err(e) => {
                let _ = std::fs::remove_file(&open.temporary);
                self.failed(
                    spans,
                    &format!("cannot close {}: {e}", open.temporary.display()),
                );
            }
        }
    }

    /// `spans` could not be archived: count, log, drop the open file's other spans too.
    fn failed(&mut self, spans: u64, detail: &str) {
        let mut lost = spans;
        if let Some(open) = self.open.take() {
            let _ = std::fs::remove_file(&open.temporary);
            lost += open.spans;
        }
        self.metrics.lost.inc_by(lost);
        self.metrics.unflushed.sub(lost as i64);
        self.health
            .failed("archive", &format!("{detail}; {lost} spans not archived"));
    }

    /// Delete files past `archive.max_age`, then the oldest while over `archive.max_bytes`.
    fn retention(&self) {
        let files = match list(&self.dir) {
            Ok(files) => files,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), "cannot list the archive: {e}");
                return;
            }
        };
        let horizon = SystemTime::now()
            .checked_sub(self.config.max_age)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut total: u64 = files.iter().map(|f| f.bytes).sum();
        let mut kept = files.len();
        for file in &files {
            let reason = if file.closed < horizon {
                "max_age"
            } else if total > self.config.max_bytes.as_u64() {
                "max_bytes"
            } else {
                continue;
            };
            match std::fs::remove_file(&file.path) {
                Ok(()) => {
                    total -= file.bytes;
                    kept -= 1;
                    self.metrics.deleted.with_label_values(&[reason]).inc();
                }
                Err(e) => tracing::warn!(file = %file.path.display(), "cannot delete: {e}"),
            }
        }
        self.metrics.files.set(kept as i64);
        self.metrics
            .bytes
            .set(i64::try_from(total).unwrap_or(i64::MAX));
    }
}

/// Remove `.tmp` files a crash left half-written (unreadable: a Parquet footer is written
/// last), saying how much was lost.
fn remove_torn(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(PREFIX) && name.ends_with(TEMPORARY) {
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            tracing::warn!(
                file = %entry.path().display(),
                bytes,
                "removing an archive file a crash left unfinished (its spans were accepted within archive.flush of the crash and are not archived)"
            );
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
