//! Small builders shared by the tests.

use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use trinity_buffer::{Eid, Experience};

/// Writes `(question, answer)` rows as a snappy-compressed Parquet file, the way `datasets` stores splits.
pub fn write_parquet(path: &Path, rows: &[(&str, i64)]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let schema = parse_message_type("message t { required binary question (UTF8); required int64 answer; }").unwrap();
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut writer =
        SerializedFileWriter::new(std::fs::File::create(path).unwrap(), Arc::new(schema), Arc::new(props)).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let mut column = group.next_column().unwrap().unwrap();
    let questions: Vec<ByteArray> = rows.iter().map(|(q, _)| ByteArray::from(*q)).collect();
    column.typed::<ByteArrayType>().write_batch(&questions, None, None).unwrap();
    column.close().unwrap();
    let mut column = group.next_column().unwrap().unwrap();
    let answers: Vec<i64> = rows.iter().map(|(_, a)| *a).collect();
    column.typed::<Int64Type>().write_batch(&answers, None, None).unwrap();
    column.close().unwrap();
    group.close().unwrap();
    writer.close().unwrap();
}

/// A valid experience of run `run` of task `task` in explore step `batch`.
pub fn experience(batch: u64, task: u64, run: u64, version: u64) -> Experience {
    let mut exp = Experience::single_turn(Eid { batch, task, run, step: 0 }, vec![1, 2, 3, 4], 2, vec![-0.1, -0.2]);
    exp.model_version = version;
    exp.reward = run as f64;
    exp.response_text = Some(format!("answer {run}"));
    exp
}
