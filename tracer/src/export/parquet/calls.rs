//! The `calls` table: every call line, a column per field. The columns after those every
//! call has follow from the call line's table (`schema::call_fields!`): a field added
//! there is a column here, typed by its Rust type ([`CallField`]).

use std::borrow::Cow;

use arrow_array::ArrayRef;
use arrow_schema::Field;

use super::{
    columns::{Bool, Dim3, I32, I64, Kind, Opt, Pointers, Str, Words, int, pointer},
    table::TableDef,
};
use crate::schema::{CallLine, Hex};

/// How a call field's Rust type becomes columns.
pub trait CallField {
    type Kind: Kind;
    fn value(&self) -> <Self::Kind as Kind>::Value<'_>;
}

impl CallField for Option<Hex> {
    type Kind = Opt<I64>;
    fn value(&self) -> Option<i64> {
        self.map(pointer)
    }
}

impl CallField for Option<u64> {
    type Kind = Opt<I64>;
    fn value(&self) -> Option<i64> {
        self.map(int)
    }
}

impl CallField for Option<u32> {
    type Kind = Opt<I64>;
    fn value(&self) -> Option<i64> {
        self.map(i64::from)
    }
}

impl CallField for Option<i32> {
    type Kind = Opt<I32>;
    fn value(&self) -> Option<i32> {
        *self
    }
}

impl CallField for Option<Cow<'static, str>> {
    type Kind = Opt<Str>;
    fn value(&self) -> Option<&str> {
        self.as_deref()
    }
}

impl CallField for Option<String> {
    type Kind = Opt<Str>;
    fn value(&self) -> Option<&str> {
        self.as_deref()
    }
}

impl CallField for Option<[u32; 3]> {
    type Kind = Dim3;
    fn value(&self) -> Option<[u32; 3]> {
        *self
    }
}

impl CallField for Vec<Hex> {
    type Kind = Opt<Pointers>;
    fn value(&self) -> Option<&[Hex]> {
        (!self.is_empty()).then_some(self.as_slice())
    }
}

impl CallField for Vec<Cow<'static, str>> {
    type Kind = Opt<Words>;
    fn value(&self) -> Option<&[Cow<'static, str>]> {
        (!self.is_empty()).then_some(self.as_slice())
    }
}

/// A call field's column name: the field's, but where it would mean something else in
/// every table (`rank` is the process's rank there, `host` the machine).
pub const fn column_name(field: &'static str) -> &'static str {
    match field.as_bytes() {
        b"rank" => "comm_rank",
        b"nranks" => "comm_nranks",
        b"host" => "host_ptr",
        _ => field,
    }
}

/// One row of `calls`.
pub struct CallRow<'a> {
    pub call: &'a CallLine,
    /// The API family of the function (the header's and library lines' `family`).
    pub family: Option<&'a str>,
}

/// The builders of the columns every call has.
#[derive(Default)]
pub struct Head {
    name: <Str as Kind>::Builder,
    family: <Opt<Str> as Kind>::Builder,
    pid: <I32 as Kind>::Builder,
    tid: <I32 as Kind>::Builder,
    ts_ns: <I64 as Kind>::Builder,
    dur_ns: <Opt<I64> as Kind>::Builder,
    ret: <Opt<I64> as Kind>::Builder,
    ok: <Bool as Kind>::Builder,
    lib: <Opt<I64> as Kind>::Builder,
}

/// [`Calls`]'s builders and [`TableDef`] from the rows of `call_fields!`.
macro_rules! calls_table {
    ($($(#[$doc:meta])* $field:ident: $wrapper:ident<$inner:ty> $(= $variant:ident)?,)*) => {
        #[derive(Default)]
        pub struct Builders {
            head: Head,
            $($field: <<$wrapper<$inner> as CallField>::Kind as Kind>::Builder,)*
        }

        pub struct Calls;

        impl TableDef for Calls {
            const NAME: &'static str = "calls";
            type Builders = Builders;
            type Row<'a> = CallRow<'a>;

            fn fields(out: &mut Vec<Field>) {
                <Str as Kind>::fields("name", out);
                <Opt<Str> as Kind>::fields("family", out);
                <I32 as Kind>::fields("pid", out);
                <I32 as Kind>::fields("tid", out);
                <I64 as Kind>::fields("ts_ns", out);
                <Opt<I64> as Kind>::fields("dur_ns", out);
                <Opt<I64> as Kind>::fields("ret", out);
                <Bool as Kind>::fields("ok", out);
                <Opt<I64> as Kind>::fields("lib", out);
                $(
                    <<$wrapper<$inner> as CallField>::Kind as Kind>::fields(
                        column_name(stringify!($field)),
                        out,
                    );
                )*
            }

            fn append(builders: &mut Builders, row: CallRow<'_>) {
                let call = row.call;
                let head = &mut builders.head;
                <Str as Kind>::append(&mut head.name, &call.name);
                <Opt<Str> as Kind>::append(&mut head.family, row.family);
                // Pids and tids are below 2^22 (the kernel's pid_max).
                <I32 as Kind>::append(&mut head.pid, call.pid as i32);
                <I32 as Kind>::append(&mut head.tid, call.tid as i32);
                <I64 as Kind>::append(&mut head.ts_ns, int(call.ts_ns));
                <Opt<I64> as Kind>::append(&mut head.dur_ns, call.dur_ns.map(int));
                <Opt<I64> as Kind>::append(&mut head.ret, call.ret.map(i64::from));
                <Bool as Kind>::append(&mut head.ok, call.ok());
                <Opt<I64> as Kind>::append(&mut head.lib, call.lib.map(i64::from));
                $(
                    <<$wrapper<$inner> as CallField>::Kind as Kind>::append(
                        &mut builders.$field,
                        CallField::value(&call.$field),
                    );
                )*
            }

            fn finish(builders: &mut Builders, out: &mut Vec<ArrayRef>) {
                let head = &mut builders.head;
                <Str as Kind>::finish(&mut head.name, out);
                <Opt<Str> as Kind>::finish(&mut head.family, out);
                <I32 as Kind>::finish(&mut head.pid, out);
                <I32 as Kind>::finish(&mut head.tid, out);
                <I64 as Kind>::finish(&mut head.ts_ns, out);
                <Opt<I64> as Kind>::finish(&mut head.dur_ns, out);
                <Opt<I64> as Kind>::finish(&mut head.ret, out);
                <Bool as Kind>::finish(&mut head.ok, out);
                <Opt<I64> as Kind>::finish(&mut head.lib, out);
                $(
                    <<$wrapper<$inner> as CallField>::Kind as Kind>::finish(
                        &mut builders.$field,
                        out,
                    );
                )*
            }
        }
    };
}
crate::schema::call_fields!(calls_table);
