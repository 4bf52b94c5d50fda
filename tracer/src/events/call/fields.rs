//! Setting a catalog [`Field`] of a [`CallLine`] from an argument's 64-bit word, as the
//! field's type takes it: pointers and handles as hex, sizes, counts and ints as numbers.
//! The setter follows from the call line's table of fields (`schema::call`).

use crate::{
    catalog::Field,
    schema::{CallLine, Hex, call_fields},
};

/// A field's value from the word read for it.
trait FromWord {
    fn from_word(word: u64) -> Self;
}

impl FromWord for Hex {
    fn from_word(word: u64) -> Self {
        Hex(word)
    }
}

impl FromWord for u64 {
    fn from_word(word: u64) -> Self {
        word
    }
}

/// The decoder has kept only the bits the argument has.
impl FromWord for u32 {
    fn from_word(word: u64) -> Self {
        word as u32
    }
}

impl FromWord for i32 {
    fn from_word(word: u64) -> Self {
        word as i32
    }
}

/// `CallLine::set` from the rows that name a `Field`.
macro_rules! setter {
    ($($(#[$doc:meta])* $field:ident: $wrapper:ident<$inner:ty> $(= $variant:ident)?,)*) => {
        impl CallLine {
            pub(super) fn set(&mut self, field: Field, word: u64) {
                match field {
                    $($(Field::$variant => self.$field = Some(FromWord::from_word(word)),)?)*
                }
            }
        }
    };
}
call_fields!(setter);
