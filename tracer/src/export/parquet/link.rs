//! The columns that tie a GPU row (`kernels`, `gpu_copies`, `gpu_memsets`) to the call
//! that issued it: the [`GpuLink`] every GPU work line ends with, declared once as a
//! [`Kind`] that the three tables end with.

use arrow_array::ArrayRef;
use arrow_schema::Field;

use super::columns::{I32, I64, Kind, Opt, Str, Words, int};
use crate::schema::GpuLink;

/// [`GpuLink`]'s columns, in the order the GPU tables have them.
macro_rules! link_columns {
    (|$link:ident| { $($column:ident: $kind:ty = $value:expr,)* }) => {
        /// A [`GpuLink`] as its columns (their names are the link's fields').
        pub struct Link;

        #[derive(Default)]
        pub struct LinkBuilders {
            $($column: <$kind as Kind>::Builder,)*
        }

        impl Kind for Link {
            type Builder = LinkBuilders;
            type Value<'a> = &'a GpuLink;

            fn fields(_: &str, out: &mut Vec<Field>) {
                $(<$kind as Kind>::fields(stringify!($column), out);)*
            }

            fn append(builders: &mut LinkBuilders, $link: &GpuLink) {
                $(<$kind as Kind>::append(&mut builders.$column, $value);)*
            }

            fn finish(builders: &mut LinkBuilders, out: &mut Vec<ArrayRef>) {
                $(<$kind as Kind>::finish(&mut builders.$column, out);)*
            }
        }
    };
}

link_columns!(|link| {
    correlation_id: I64 = i64::from(link.correlation_id),
    graph_id: Opt<I64> = link.graph_id.map(i64::from),
    call_tid: Opt<I32> = link.call_tid.map(|tid| tid as i32),
    call_ts_ns: Opt<I64> = link.call_ts_ns.map(int),
    graph_node_id: Opt<I64> = link.graph_node_id.map(int),
    capture_call_tid: Opt<I32> = link.capture_call_tid.map(|tid| tid as i32),
    capture_call_ts_ns: Opt<I64> = link.capture_call_ts_ns.map(int),
    queued_ns: Opt<I64> = link.queued_ns,
    unlinked: Opt<Str> = link.unlinked.as_deref(),
    warnings: Opt<Words> = (!link.warnings.is_empty()).then_some(link.warnings.as_slice()),
});
