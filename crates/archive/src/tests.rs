use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::{Array, AsArray};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use stormglass_model::{Conventions, encode_request, schema};
use stormglass_testkit::otlp as testing;

use super::*;

fn batch() -> RecordBatch {
    encode_request(&Conventions::default(), &testing::retry_fixture()).0
}

/// `spans` varied synthetic spans (traces of the default shape): they compress as real
/// spans do, unlike copies of one fixture.
fn synthetic(spans: usize) -> RecordBatch {
    let mut generator = stormglass_model::synth::Generator::new(
        stormglass_model::synth::Shape::default(),
        1_700_000_000_000_000_000,
    );
    encode_request(&Conventions::default(), &generator.request(spans)).0
}

/// A fresh directory, removed with everything in it when the guard drops.
fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("stormglass-archive-{name}-"))
        .tempdir()
        .expect("creates a scratch directory")
}

fn start(dir: &Path, config: ArchiveConfig) -> (Archive, Registry, Health, MemoryBudget) {
    let registry = Registry::new();
    let budget = MemoryBudget::unregistered(64 << 20);
    let health = Health::unregistered();
    let archive =
        Archive::start(&config, dir, budget.clone(), health.clone(), &registry).expect("starts");
    (archive, registry, health, budget)
}

fn metric(registry: &Registry, name: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric())
        .map(|m| {
            if m.get_counter().get_value() != 0.0 {
                m.get_counter().get_value()
            } else {
                m.get_gauge().get_value()
            }
        })
        .sum()
}

fn read(path: &Path) -> Vec<RecordBatch> {
    let file = File::open(path).expect("opens");
    ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("a Parquet file")
        .build()
        .expect("reader")
        .collect::<Result<_, _>>()
        .expect("readable")
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("lists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Spans appended to the archive are invisible until the file closes, then read back whole
/// (names, messages, attributes) with the span schema; no temporary file is left.
#[test]
fn appended_spans_read_back_whole_once_flushed() {
    let scratch = temp_dir("whole");
    let dir = scratch.path().to_path_buf();
    let (archive, registry, _, budget) = start(&dir, ArchiveConfig::default());
    let spans = batch();
    archive.append(spans.clone(), budget.force(spans.get_array_memory_size()));
    archive.append(spans.clone(), budget.force(spans.get_array_memory_size()));
    assert!(
        list(&dir).expect("lists").is_empty(),
        "nothing visible before the flush"
    );
    archive.flush();
    let files = list(&dir).expect("lists");
    assert_eq!(files.len(), 1);
    let read = read(&files[0].path);
    let rows: usize = read.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 2 * spans.num_rows());
    assert_eq!(read[0].schema().fields(), SPANS_SCHEMA.fields());
    let names = read[0].column_by_name(schema::SPAN_NAME).expect("column");
    assert_eq!(
        names.as_string::<i32>().value(0),
        spans
            .column_by_name(schema::SPAN_NAME)
            .expect("column")
            .as_string::<i32>()
            .value(0)
    );
    let attributes = read[0].column_by_name(schema::ATTRIBUTES).expect("column");
    assert!(
        !attributes.as_map().entries().is_empty(),
        "attributes are archived"
    );
    assert_eq!(
        metric(&registry, "stormglass_archive_spans_total"),
        rows as f64
    );
    assert_eq!(metric(&registry, "stormglass_archive_unflushed_spans"), 0.0);
    archive.finish();
    assert!(
        entries(&dir).iter().all(|n| n.ends_with(SUFFIX)),
        "{:?}",
        entries(&dir)
    );
    assert_eq!(budget.used(), 0, "every reservation was returned");
}

/// A file closes at archive.max_file_bytes and, without more input, at archive.flush.
#[test]
fn files_rotate_by_size_and_time() {
    let scratch = temp_dir("rotate");
    let dir = scratch.path().to_path_buf();
    let config = ArchiveConfig {
        max_file_bytes: bytesize::ByteSize::mib(1),
        flush: Duration::from_millis(200),
        ..ArchiveConfig::default()
    };
    let (archive, registry, _, budget) = start(&dir, config);
    // A big batch: well past 1 MiB in Parquet.
    let big = synthetic(60_000);
    for _ in 0..3 {
        archive.append(big.clone(), budget.force(0));
    }
    // Each big batch crosses the size bound, so each closes its own file at once.
    let mut waited = 0;
    while list(&dir).expect("lists").len() < 3 && waited < 500 {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
    }
    assert_eq!(list(&dir).expect("lists").len(), 3);
    // A small batch stays open until archive.flush passes, with no flush asked.
    archive.append(batch(), budget.force(0));
    let mut waited = 0;
    while list(&dir).expect("lists").len() < 4 && waited < 500 {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
    }
    assert_eq!(list(&dir).expect("lists").len(), 4);
    assert_eq!(
        metric(&registry, "stormglass_archive_spans_total"),
        (3 * big.num_rows() + batch().num_rows()) as f64
    );
    archive.finish();
    // Its files are ~7 MB a run.
    let _ = std::fs::remove_dir_all(&dir);
}

/// Retention deletes files past max_age, then the oldest while over max_bytes; a torn
/// temporary file from a crash is removed at start.
#[test]
fn retention_and_torn_files() {
    let scratch = temp_dir("retention");
    let dir = scratch.path().to_path_buf();
    std::fs::create_dir_all(&dir).expect("creates");
    let old = dir.join("spans-20200101T000000.000Z-0.parquet");
    crate::tests::write_file(&old, &batch());
    File::options()
        .write(true)
        .open(&old)
        .and_then(|f| f.set_modified(SystemTime::now() - Duration::from_secs(30 * 24 * 3600)))
        .expect("sets mtime");
    let torn = dir.join("spans-20261201T000000.000Z-0.parquet.tmp");
    std::fs::write(&torn, b"PAR1 half a file").expect("writes");
    let unrelated = dir.join("notes.txt");
    std::fs::write(&unrelated, b"kept").expect("writes");

    let config = ArchiveConfig {
        max_file_bytes: bytesize::ByteSize::mib(1),
        max_bytes: bytesize::ByteSize::mib(1),
        ..ArchiveConfig::default()
    };
    let (archive, registry, _, budget) = start(&dir, config);
    assert!(!old.exists(), "past max_age");
    assert!(!torn.exists(), "torn by a crash");
    assert!(unrelated.exists(), "not an archive file");
    assert_eq!(
        registry
            .gather()
            .iter()
            .find(|f| f.name() == "stormglass_archive_deleted_files_total")
            .map(|f| f
                .get_metric()
                .iter()
                .map(|m| m.get_counter().get_value())
                .sum::<f64>()),
        Some(1.0)
    );
    // Files of a few hundred KiB: the archive keeps at most 1 MiB, so older ones go.
    let big = synthetic(20_000);
    for _ in 0..4 {
        archive.append(big.clone(), budget.force(0));
        archive.flush();
    }
    let files = list(&dir).expect("lists");
    let total: u64 = files.iter().map(|f| f.bytes).sum();
    assert!(total <= 1 << 20, "{total} bytes kept");
    assert!(files.len() < 4 && !files.is_empty(), "{files:?}");
    assert_eq!(metric(&registry, "stormglass_archive_bytes"), total as f64);
    archive.finish();
}

/// A file that cannot be written is counted as lost spans and fails /healthz; the next
/// file that can be written clears it.
#[test]
fn write_failures_are_counted_and_recover() {
    let scratch = temp_dir("failure");
    let dir = scratch.path().to_path_buf();
    let (archive, registry, health, budget) = start(&dir, ArchiveConfig::default());
    std::fs::remove_dir_all(&dir).expect("removes");
    let spans = batch();
    archive.append(spans.clone(), budget.force(0));
    archive.flush();
    assert_eq!(
        metric(&registry, "stormglass_archive_lost_spans_total"),
        spans.num_rows() as f64
    );
    assert_eq!(health.failing().len(), 1);
    assert_eq!(health.failing()[0].0, "archive");
    std::fs::create_dir_all(&dir).expect("creates");
    archive.append(spans.clone(), budget.force(0));
    archive.flush();
    assert!(health.failing().is_empty());
    assert_eq!(list(&dir).expect("lists").len(), 1);
    archive.finish();
}

struct Counting {
    accepted: AtomicUsize,
    refuse: bool,
}

impl SpanSink for Counting {
    fn accept(&self, batch: RecordBatch) -> Result<(), SinkFull> {
        if self.refuse {
            return Err(SinkFull {
                retry_after: Duration::from_secs(1),
                limit: Overload::Spans,
            });
        }
        self.accepted.fetch_add(batch.num_rows(), Ordering::Relaxed);
        Ok(())
    }
}

/// The archiving sink stores a batch in both places or in neither: a batch the budget or
/// assembly refuses is not archived, and its reservation is returned.
#[test]
fn a_refused_batch_is_neither_held_nor_archived() {
    let scratch = temp_dir("sink");
    let dir = scratch.path().to_path_buf();
    let (archive, registry, _, _) = start(&dir, ArchiveConfig::default());
    let archive = Arc::new(archive);
    let spans = batch();
    let tight = MemoryBudget::unregistered(spans.get_array_memory_size());
    let inner = Arc::new(Counting {
        accepted: AtomicUsize::new(0),
        refuse: false,
    });
    let sink = ArchivingSink::new(archive.clone(), inner.clone(), tight.clone());
    let refused = sink
        .accept(spans.clone())
        .expect_err("over the admission share");
    assert_eq!(refused.limit, Overload::Memory);
    assert_eq!(inner.accepted.load(Ordering::Relaxed), 0);

    let roomy = MemoryBudget::unregistered(64 << 20);
    let refusing = ArchivingSink::new(
        archive.clone(),
        Arc::new(Counting {
            accepted: AtomicUsize::new(0),
            refuse: true,
        }),
        roomy.clone(),
    );
    assert_eq!(
        refusing.accept(spans.clone()).expect_err("refused").limit,
        Overload::Spans
    );
    assert_eq!(roomy.used(), 0);

    let sink = ArchivingSink::new(archive.clone(), inner.clone(), roomy.clone());
    sink.accept(spans.clone()).expect("accepted");
    archive.flush();
    assert_eq!(inner.accepted.load(Ordering::Relaxed), spans.num_rows());
    assert_eq!(
        metric(&registry, "stormglass_archive_spans_total"),
        spans.num_rows() as f64
    );
    assert_eq!(roomy.used(), 0);
    archive.finish();
}

pub(crate) fn write_file(path: &Path, batch: &RecordBatch) {
    let file = File::create(path).expect("creates");
    let mut writer = ArrowWriter::try_new(file, SPANS_SCHEMA.clone(), None).expect("writer");
    writer.write(batch).expect("writes");
    writer.close().expect("closes");
}

/// The key secret is made once, owner-readable only, and read back the same after a
/// restart; a file that is not a secret is an error, not silently replaced.
#[test]
fn key_secret_survives_a_restart() {
    let scratch = temp_dir("key-secret");
    let dir = scratch.path().to_path_buf();
    let made = key_secret(&dir).expect("made");
    assert_eq!(key_secret(&dir).expect("read"), made);
    let path = dir.join(KEY_SECRET_FILE);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path)
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    std::fs::write(&path, b"short").expect("writes");
    let err = key_secret(&dir).expect_err("not 16 bytes");
    assert!(err.to_string().contains("not 16 bytes"), "{err}");
}
