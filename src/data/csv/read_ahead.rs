//! A CSV text's records read on a thread of their own, a batch ahead of
//! the rows made of them: reading (unquoting, splitting, checking UTF-8)
//! is a third of the work of a wide file of numbers, parsing them the
//! rest, and the two overlap on two cores.

use std::path::Path;
use std::sync::mpsc;

use csv::StringRecord;

use crate::data::files::data_err;
use crate::Result;

/// Records in a batch: enough to keep the channel's traffic small, few
/// enough that a small file is not held up.
const BATCH: usize = 512;

/// Calls `each` with the records of `text` (separated by `delimiter`, the
/// header among them, cells untrimmed), in order, read on another thread;
/// stops at the first error, `each`'s or the reader's (said for `what`).
pub(super) fn each_record_of(
    what: &Path,
    text: &str,
    delimiter: u8,
    mut each: impl FnMut(&StringRecord) -> Result<()>,
) -> Result<()> {
    // Two batches in flight, and the ones read recycled.
    let (full, batches) =
        mpsc::sync_channel::<std::result::Result<Vec<StringRecord>, csv::Error>>(2);
    let (spent, empties) = mpsc::channel::<Vec<StringRecord>>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut reader = super::records::reader(text, delimiter, false);
            loop {
                let mut batch = empties.try_recv().unwrap_or_default();
                let mut n = 0;
                let last = loop {
                    if n == BATCH {
                        break false;
                    }
                    if batch.len() == n {
                        batch.push(StringRecord::new());
                    }
                    match reader.read_record(&mut batch[n]) {
                        Ok(true) => n += 1,
                        Ok(false) => break true,
                        Err(e) => {
                            let _ = full.send(Err(e));
                            return;
                        }
                    }
                };
                batch.truncate(n);
                // A receiver gone has stopped at an error of its own.
                if full.send(Ok(batch)).is_err() || last {
                    return;
                }
            }
        });
        for batch in batches {
            let batch = batch.map_err(|e| data_err(what, e))?;
            for record in &batch {
                each(record)?;
            }
            let _ = spent.send(batch);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records come in order across batches, with their positions; an
    /// error of `each` stops the reading (the reader thread ends too).
    #[test]
    fn records_come_in_order_and_an_error_stops_them() {
        let text: String = (0..3 * BATCH + 7).map(|i| format!("{i},x\n")).collect();
        let path = Path::new("t.csv");
        let mut seen = Vec::new();
        each_record_of(path, &text, b',', |r| {
            seen.push((r[0].parse::<usize>().unwrap(), r.position().unwrap().line()));
            Ok(())
        })
        .unwrap();
        let want: Vec<(usize, u64)> = (0..3 * BATCH + 7).map(|i| (i, i as u64 + 1)).collect();
        assert_eq!(seen, want);
        let mut n = 0;
        let err = each_record_of(path, &text, b',', |r| {
            n += 1;
            match &r[0] {
                "1000" => Err(crate::Error::Data("stop".into())),
                _ => Ok(()),
            }
        });
        assert!(err.is_err() && n == 1001, "{n}");
        assert!(each_record_of(path, "", b',', |_| unreachable!()).is_ok());
    }
}
