//! The analysis's threads: how many, and an ordered map over them (file reads, chunk
//! preparation, a wide report table's rows and the alert conditions share it, offline and
//! live).

/// Chunks analysed at once, each on its own engine; threads preparing them (and reading a
/// Parquet file's row groups).
pub(crate) const AT_ONCE: usize = 2;

/// `work` over `items` on [`AT_ONCE`] threads, the results in the items' order.
pub(crate) fn parallel_map<T: Send, R: Send>(
    items: Vec<T>,
    work: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let mut lanes: Vec<Vec<(usize, T)>> = (0..AT_ONCE).map(|_| Vec::new()).collect();
    for (index, item) in items.into_iter().enumerate() {
        lanes[index % AT_ONCE].push((index, item));
    }
    let work = &work;
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let lanes: Vec<_> = lanes
            .into_iter()
            .map(|lane| {
                scope.spawn(move || {
                    lane.into_iter()
                        .map(|(index, item)| (index, work(item)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        lanes
            .into_iter()
            .flat_map(|lane| match lane.join() {
                Ok(done) => done,
                // A panic in the work is the analysis's own, as on one thread.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    done.sort_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, result)| result).collect()
}
