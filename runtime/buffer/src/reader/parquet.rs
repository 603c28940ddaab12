//! Parquet tasksets (what Hugging Face datasets ship), read through the `parquet` crate's row API without
//! arrow. Columns become JSON values: strings, numbers, booleans, lists and structs as in the dataset;
//! nulls are JSON null. Errors give the 0-based row index within the file. Compression: uncompressed, snappy
//! (the `datasets` / pyarrow default) and zstd (common on the Hub); another codec (gzip, lz4, brotli) is an
//! error naming the file — convert it with `pq.write_table(table, path)`.

use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

use crate::error::{BufferError, Result, json_kind};
use crate::task::Row;

pub fn read(path: &Path) -> Result<Vec<Row>> {
    let file = std::fs::File::open(path).map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
    let reader =
        SerializedFileReader::new(file).map_err(|source| BufferError::Parquet { path: path.to_owned(), source })?;
    let iter = reader.get_row_iter(None).map_err(|source| BufferError::Parquet { path: path.to_owned(), source })?;
    let mut rows = Vec::new();
    for (i, row) in iter.enumerate() {
        let row = row.map_err(|source| BufferError::ParquetRow { path: path.to_owned(), row: i, source })?;
        match row.to_json_value() {
            Value::Object(map) => rows.push(map),
            other => {
                return Err(BufferError::NotAnObject {
                    path: path.to_owned(),
                    location: format!("row {i}"),
                    found: json_kind(&other),
                });
            }
        }
    }
    Ok(rows)
}

/// Writes a small Parquet file of `(question: string, answer: int64)` rows; test fixtures only.
#[cfg(test)]
pub(crate) fn write_fixture(path: &Path, rows: &[(&str, i64)]) {
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;

    let schema = parse_message_type("message t { required binary question (UTF8); required int64 answer; }").unwrap();
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_as_json_objects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.parquet");
        write_fixture(&path, &[("1+1?", 2), ("2+3?", 5)]);
        let rows = read(&path).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["question"], "1+1?");
        assert_eq!(rows[1]["answer"], 5);
    }

    #[test]
    fn a_file_that_is_not_parquet_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.parquet");
        std::fs::write(&path, b"PAR1 not really").unwrap();
        let text = read(&path).unwrap_err().to_string();
        assert!(text.contains("broken.parquet"), "{text}");
    }
}
