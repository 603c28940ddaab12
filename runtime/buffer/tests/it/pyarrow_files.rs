//! Parquet files written by pyarrow 26 (as `datasets` writes them), committed under `tests/fixtures/`:
//! nulls, lists, structs, `large_string`, dictionary encoding, v1 and v2 pages, several row groups.
//! Made with `pq.write_table(table, …)` over the table in `expected_rows` (see each file's name for the
//! options: default snappy; `compression="none", use_dictionary=False, data_page_version="1.0"`;
//! `row_group_size=1`; `compression="zstd"`).

use std::path::PathBuf;

use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn expected_rows() -> Vec<Value> {
    vec![
        json!({"question": "What is 1+1?", "answer": "#### 2", "numbers": [1, 2], "target": 3, "score": 0.5,
               "meta": {"src": "a", "level": 1}, "big": "xxxxxxxxxx"}),
        json!({"question": null, "answer": "#### 5", "numbers": [3], "target": null, "score": 1.0,
               "meta": {"src": "b", "level": 2}, "big": "y"}),
        json!({"question": "Übung: 3×4?", "answer": "#### 12", "numbers": [], "target": 12, "score": null,
               "meta": null, "big": "z"}),
    ]
}

#[test]
fn pyarrow_files_read_as_json_rows() {
    for name in ["snappy.parquet", "plain.parquet", "multi_rg.parquet", "zstd.parquet"] {
        let rows = trinity_buffer::reader::read_file(&fixture(name)).unwrap();
        let rows: Vec<Value> = rows.into_iter().map(Value::Object).collect();
        assert_eq!(rows, expected_rows(), "{name}");
    }
}
