//! TensorBoard event files: TFRecord framing around hand-encoded `Event` protobufs with scalar summaries.
//!
//! Only scalars are written, so the handful of protobuf fields involved are encoded directly rather than
//! pulling in a protobuf toolchain. Layout per record: `u64 length`, `u32 masked_crc32c(length)`, `data`,
//! `u32 masked_crc32c(data)`, all little-endian.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::crc32c::masked;
use crate::{Metrics, MonitorError, Sink};

/// Writes one event file per run (TensorBoard reads every file in the directory, so a resumed run adds one).
#[derive(Debug)]
pub struct TensorboardSink {
    path: PathBuf,
    file: File,
}

impl TensorboardSink {
    /// Creates `dir/events.out.tfevents.<seconds>.<host>.<pid>` and writes the file-version record.
    pub fn create(dir: &Path) -> Result<TensorboardSink, MonitorError> {
        std::fs::create_dir_all(dir).map_err(MonitorError::io(dir))?;
        let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
        let host = if host.is_empty() { "trinity".to_owned() } else { host };
        let name = format!("events.out.tfevents.{}.{host}.{}", now().trunc() as u64, std::process::id());
        let path = dir.join(name);
        let file = File::create(&path).map_err(MonitorError::io(&path))?;
        let mut sink = TensorboardSink { path, file };
        let mut event = Vec::new();
        put_double(&mut event, 1, now());
        put_bytes(&mut event, 3, b"brain.Event:2");
        sink.write_record(&event)?;
        Ok(sink)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_record(&mut self, data: &[u8]) -> Result<(), MonitorError> {
        let length = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&length);
        record.extend_from_slice(&masked(&length).to_le_bytes());
        record.extend_from_slice(data);
        record.extend_from_slice(&masked(data).to_le_bytes());
        self.file.write_all(&record).map_err(MonitorError::io(&self.path))?;
        self.file.flush().map_err(MonitorError::io(&self.path))
    }
}

impl Sink for TensorboardSink {
    fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError> {
        let mut summary = Vec::new();
        for (tag, value) in metrics {
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, tag.as_bytes());
            put_float(&mut entry, 2, *value as f32);
            put_bytes(&mut summary, 1, &entry);
        }
        let mut event = Vec::new();
        put_double(&mut event, 1, now());
        put_varint_field(&mut event, 2, step);
        put_bytes(&mut event, 5, &summary);
        self.write_record(&event)
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    put_varint(out, field << 3);
    put_varint(out, value);
}

fn put_double(out: &mut Vec<u8>, field: u64, value: f64) {
    put_varint(out, (field << 3) | 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_float(out: &mut Vec<u8>, field: u64, value: f32) {
    put_varint(out, (field << 3) | 5);
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the records back, checking both CRCs of each.
    fn records(path: &Path) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(path).unwrap();
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let length_bytes: [u8; 8] = bytes[at..at + 8].try_into().unwrap();
            let length = u64::from_le_bytes(length_bytes) as usize;
            assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked(&length_bytes));
            let data = &bytes[at + 12..at + 12 + length];
            let crc = u32::from_le_bytes(bytes[at + 12 + length..at + 16 + length].try_into().unwrap());
            assert_eq!(crc, masked(data));
            out.push(data.to_vec());
            at += 16 + length;
        }
        out
    }

    #[test]
    fn writes_a_version_record_then_one_event_per_step() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = TensorboardSink::create(dir.path()).unwrap();
        sink.record(7, &Metrics::from([("train/pg_loss".to_owned(), 0.5)])).unwrap();
        let records = records(sink.path());
        assert_eq!(records.len(), 2);
        assert!(records[0].windows(13).any(|w| w == b"brain.Event:2"));
        let event = &records[1];
        // wall_time (9 bytes), then step 7 as field 2, then the summary holding the tag and 0.5f32.
        assert_eq!(event[0], 0x09);
        assert_eq!(&event[9..11], &[0x10, 7]);
        assert!(event.windows(13).any(|w| w == b"train/pg_loss"));
        assert!(event.ends_with(&[0x15, 0x00, 0x00, 0x00, 0x3f]));
    }
}
