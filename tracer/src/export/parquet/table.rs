//! A table: its columns, declared once with [`table!`], and the Parquet file it is
//! written to, a batch of rows at a time.
//!
//! Every table starts with the same three columns ([`Origin`]): `trace`, `host` and
//! `rank`, so that the tables of many traces concatenate.

use std::{fs::File, sync::Arc};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::{
    arrow::ArrowWriter,
    basic::Compression,
    errors::ParquetError,
    file::properties::{EnabledStatistics, WriterProperties},
    schema::types::ColumnPath,
};

use super::{
    columns::{BATCH_ROWS, I32, Kind, Opt, Str},
    writer::Sink,
};

/// A row group: DuckDB's own size (its threads split files by row group); the Parquet
/// writer holds one encoded row group per table in memory (about 1.2 MB of `calls`).
pub const ROW_GROUP_ROWS: usize = 122_880;
/// A row group is also closed past this many encoded bytes, to bound memory.
const ROW_GROUP_BYTES: usize = 8 << 20;
/// Rows per data page, at most: each column's page is buffered before it is compressed.
const PAGE_ROWS: usize = 8192;

/// The columns every row of every table starts with.
#[derive(Clone, Copy, Debug)]
pub struct Origin<'a> {
    /// The trace's id (`traces.trace`).
    pub trace: &'a str,
    /// The header's `host`.
    pub host: Option<&'a str>,
    /// The process's rank in the job (`ranks.rs`).
    pub rank: Option<i32>,
}

/// A table's columns after the [`Origin`] ones; [`table!`] writes this for a table.
pub trait TableDef {
    /// The file's name without `.parquet`.
    const NAME: &'static str;
    type Builders: Default;
    type Row<'a>;
    fn fields(out: &mut Vec<Field>);
    fn append(builders: &mut Self::Builders, row: Self::Row<'_>);
    fn finish(builders: &mut Self::Builders, out: &mut Vec<ArrayRef>);
}

/// Declares a table: `NAME "file" { column: Kind, ... }` makes a module `NAME` with
/// `Row<'a>` (one field per column, typed by its kind) and `Def` (its [`TableDef`]).
macro_rules! table {
    ($(#[$meta:meta])* $module:ident $file:literal { $($column:ident: $kind:ty,)* }) => {
        $(#[$meta])*
        pub mod $module {
            // The column kinds (`columns.rs`), and those where the table is declared.
            #[allow(unused_imports)]
            use $crate::export::parquet::columns::*;
            #[allow(unused_imports)]
            use super::*;

            pub struct Row<'a> {
                $(pub $column: <$kind as Kind>::Value<'a>,)*
            }

            #[derive(Default)]
            pub struct Builders {
                $($column: <$kind as Kind>::Builder,)*
            }

            pub struct Def;

            impl $crate::export::parquet::table::TableDef for Def {
                const NAME: &'static str = $file;
                type Builders = Builders;
                type Row<'a> = Row<'a>;

                fn fields(out: &mut Vec<arrow_schema::Field>) {
                    $(<$kind as Kind>::fields(stringify!($column), out);)*
                }

                fn append(builders: &mut Builders, row: Row<'_>) {
                    $(<$kind as Kind>::append(&mut builders.$column, row.$column);)*
                }

                fn finish(builders: &mut Builders, out: &mut Vec<arrow_array::ArrayRef>) {
                    $(<$kind as Kind>::finish(&mut builders.$column, out);)*
                }
            }
        }
    };
}
pub(crate) use table;

/// The [`Origin`] columns' builders.
#[derive(Default)]
struct OriginBuilders {
    trace: <Str as Kind>::Builder,
    host: <Opt<Str> as Kind>::Builder,
    rank: <Opt<I32> as Kind>::Builder,
}

/// Every column of table `T`, the [`Origin`] ones first.
pub fn schema<T: TableDef>() -> SchemaRef {
    let mut fields = Vec::new();
    <Str as Kind>::fields("trace", &mut fields);
    <Opt<Str> as Kind>::fields("host", &mut fields);
    <Opt<I32> as Kind>::fields("rank", &mut fields);
    T::fields(&mut fields);
    Arc::new(Schema::new(fields))
}

/// How every table is written: Snappy (read by every engine, and fast). Strings are
/// dictionary-encoded (Parquet's default; plain where a chunk's distinct values pass 1 MiB);
/// numbers are plain: times and pointers are mostly distinct, and hashing each number
/// for a dictionary cost a seventh of the export's time. Min and max per column chunk of
/// numbers and flags, which prune row groups (times above all); none for strings, whose
/// bounds prune little and cost a comparison of every value; no page indexes, which few
/// readers use.
fn properties(schema: &Schema) -> WriterProperties {
    let mut properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_statistics_enabled(EnabledStatistics::None);
    for field in schema.fields() {
        if matches!(
            field.data_type(),
            DataType::Int32 | DataType::Int64 | DataType::Boolean
        ) {
            let column = ColumnPath::from(field.name().as_str());
            properties = properties
                .set_column_statistics_enabled(column.clone(), EnabledStatistics::Chunk)
                .set_column_dictionary_enabled(column, false);
        }
    }
    properties.build()
}

/// Table `T` being written: rows into arrays, a batch at a time to the encoder.
pub struct Table<T: TableDef> {
    origin: OriginBuilders,
    builders: T::Builders,
    schema: SchemaRef,
    sink: Sink,
    /// Rows in the builders.
    pending: usize,
    /// Rows written.
    pub rows: u64,
}

impl<T: TableDef> Table<T> {
    /// The table, whose batches go to `sink`, and the writer of its `file` for the
    /// encoder.
    pub fn new(file: File, sink: Sink) -> Result<(Self, ArrowWriter<File>), ParquetError> {
        let schema = schema::<T>();
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(properties(&schema)))?;
        let table = Table {
            origin: OriginBuilders::default(),
            builders: T::Builders::default(),
            schema,
            sink,
            pending: 0,
            rows: 0,
        };
        Ok((table, writer))
    }

    pub fn push(&mut self, origin: Origin<'_>, row: T::Row<'_>) -> Result<(), ParquetError> {
        <Str as Kind>::append(&mut self.origin.trace, origin.trace);
        <Opt<Str> as Kind>::append(&mut self.origin.host, origin.host);
        <Opt<I32> as Kind>::append(&mut self.origin.rank, origin.rank);
        T::append(&mut self.builders, row);
        self.pending += 1;
        self.rows += 1;
        if self.pending == BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands the rows built so far to the encoder.
    fn flush(&mut self) -> Result<(), ParquetError> {
        if self.pending == 0 {
            return Ok(());
        }
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        <Str as Kind>::finish(&mut self.origin.trace, &mut columns);
        <Opt<Str> as Kind>::finish(&mut self.origin.host, &mut columns);
        <Opt<I32> as Kind>::finish(&mut self.origin.rank, &mut columns);
        T::finish(&mut self.builders, &mut columns);
        self.pending = 0;
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.sink.write(batch)
    }

    /// Hands over what is left; the rows written. The file is closed by the encoder.
    pub fn close(mut self) -> Result<u64, ParquetError> {
        self.flush()?;
        Ok(self.rows)
    }
}
