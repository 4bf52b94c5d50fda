//! The offset of the user thread pointer in the kernel's `task_struct`, from its BTF
//! (`/sys/kernel/btf/vmlinux`): x86-64's `thread.fsbase`, arm64's `thread.uw.tp_value`
//! (`tracer_common::arch`). The stack walk reads the calling thread's there, which is how
//! it finds the thread's Python thread state.
//!
//! A small reader of the BTF format (types and strings, by `linux/btf.h`), enough to follow
//! one struct member into another.

use std::path::Path;

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

/// One BTF type: what the member search needs of it.
struct Type {
    name: u32,
    kind: u32,
    /// For modifiers and typedefs, the type they refer to.
    refers_to: u32,
    kind_flag: bool,
    /// Struct and union members: (name, type, offset field).
    members: Vec<(u32, u32, u32)>,
}

struct Btf {
    /// By id (id 0 is `void`).
    types: Vec<Option<Type>>,
    strings: Vec<u8>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    fn parse(bytes: &[u8]) -> Option<Btf> {
        if u16::from_le_bytes(bytes.get(..2)?.try_into().ok()?) != MAGIC {
            return None;
        }
        let header = u32_at(bytes, 4)? as usize;
        let (type_off, type_len) = (u32_at(bytes, 8)? as usize, u32_at(bytes, 12)? as usize);
        let (str_off, str_len) = (u32_at(bytes, 16)? as usize, u32_at(bytes, 20)? as usize);
        let types_bytes = bytes.get(header + type_off..header + type_off + type_len)?;
        let strings = bytes
            .get(header + str_off..header + str_off + str_len)?
            .to_vec();
        let mut types = vec![None];
        let mut at = 0;
        while at + 12 <= types_bytes.len() {
            let name = u32_at(types_bytes, at)?;
            let info = u32_at(types_bytes, at + 4)?;
            let size_or_type = u32_at(types_bytes, at + 8)?;
            at += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let mut members = Vec::new();
            // Bytes that follow the common part, by kind (linux/btf.h).
            let extra = match kind {
                1 | 14 | 17 => 4,
                3 => 12,
                KIND_STRUCT | KIND_UNION => {
                    for index in 0..vlen {
                        let member = at + 12 * index;
                        members.push((
                            u32_at(types_bytes, member)?,
                            u32_at(types_bytes, member + 4)?,
                            u32_at(types_bytes, member + 8)?,
                        ));
                    }
                    12 * vlen
                }
                6 | 13 => 8 * vlen,
                15 | 19 => 12 * vlen,
                _ => 0,
            };
            at += extra;
            types.push(Some(Type {
                name,
                kind,
                refers_to: size_or_type,
                kind_flag: info >> 31 != 0,
                members,
            }));
        }
        Some(Btf { types, strings })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    /// The struct named `name`.
    fn struct_named(&self, name: &str) -> Option<u32> {
        self.types.iter().enumerate().find_map(|(id, ty)| {
            let ty = ty.as_ref()?;
            (ty.kind == KIND_STRUCT
                && !ty.members.is_empty()
                && self.name(ty.name) == name.as_bytes())
            .then_some(id as u32)
        })
    }

    /// `id` with typedefs and qualifiers stripped.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            let ty = self.types.get(id as usize)?.as_ref()?;
            match ty.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = ty.refers_to
                }
                _ => return Some(ty),
            }
        }
        None
    }

    /// The byte offset and type of member `name` of struct or union `ty`.
    fn member(&self, ty: &Type, name: &str) -> Option<(u64, u32)> {
        ty.members.iter().find_map(|(member, member_type, offset)| {
            if self.name(*member) != name.as_bytes() {
                return None;
            }
            let bits = if ty.kind_flag {
                offset & 0x00ff_ffff
            } else {
                *offset
            };
            Some((u64::from(bits / 8), *member_type))
        })
    }
}

/// `offsetof(struct task_struct, <member path>)` in the BTF at `path`, e.g. `thread.fsbase`
/// for `["thread", "fsbase"]`.
pub fn task_member_offset(path: &Path, members: &[&str]) -> Option<u32> {
    let bytes = std::fs::read(path).ok()?;
    let btf = Btf::parse(&bytes)?;
    let mut ty = btf.resolve(btf.struct_named("task_struct")?)?;
    let mut offset = 0;
    for (i, name) in members.iter().enumerate() {
        let (at, member_type) = btf.member(ty, name)?;
        offset += at;
        if i + 1 < members.len() {
            ty = btf.resolve(member_type)?;
        }
    }
    u32::try_from(offset).ok()
}

/// The offset of this architecture's user thread pointer in `task_struct`.
pub fn thread_pointer_offset(path: &Path) -> Option<u32> {
    task_member_offset(path, tracer_common::arch::TARGET.thread_pointer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds BTF bytes with `task_struct { long pid; struct thread_struct thread; }`, where
    /// `thread_struct { long pid; long fsbase; struct { long tp_value; } uw; }`.
    fn sample() -> Vec<u8> {
        let strings =
            b"\0task_struct\0thread\0thread_struct\0fsbase\0pid\0long\0uw\0tp_value\0".to_vec();
        let name = |s: &str| {
            let needle = format!("\0{s}\0");
            (strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap()
                + 1) as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // 1: long (INT, 8 bytes)
        push(&[name("long"), 1 << 24, 8, 0x40]);
        // 2: struct thread_struct { long pid @0; long fsbase @64 bits; uw @128 bits }
        push(&[name("thread_struct"), (4 << 24) | 3, 32]);
        push(&[name("pid"), 1, 0, name("fsbase"), 1, 64, name("uw"), 4, 128]);
        // 3: typedef-free struct task_struct { long pid @0; thread_struct thread @ 2400 bytes }
        push(&[name("task_struct"), (4 << 24) | 2, 4096]);
        push(&[name("pid"), 1, 0, name("thread"), 2, 2400 * 8]);
        // 4: an anonymous struct { long pad @0; long tp_value @64 bits } (arm64's `uw`)
        push(&[0, (4 << 24) | 2, 16]);
        push(&[name("pid"), 1, 0, name("tp_value"), 1, 64]);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC.to_le_bytes());
        bytes.extend_from_slice(&[1, 0]);
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(&types);
        bytes.extend_from_slice(&strings);
        bytes
    }

    #[test]
    fn the_member_path_adds_up() {
        let dir = std::env::temp_dir().join(format!("cudatrace-btf-{}", std::process::id()));
        std::fs::write(&dir, sample()).unwrap();
        assert_eq!(
            task_member_offset(&dir, tracer_common::arch::X86_64.thread_pointer),
            Some(2408)
        );
        // 2400 + 16 (uw) + 8 (tp_value).
        assert_eq!(
            task_member_offset(&dir, tracer_common::arch::AARCH64.thread_pointer),
            Some(2424)
        );
        assert_eq!(task_member_offset(&dir, &["thread", "gsbase"]), None);
        std::fs::remove_file(&dir).unwrap();
    }

    /// This machine's kernel: the offset lies inside `task_struct` (its exact value is
    /// checked by the root tests, whose stacks depend on it).
    #[test]
    fn the_running_kernel_has_one() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if path.exists() {
            let offset = thread_pointer_offset(path).unwrap();
            assert!((1000..20000).contains(&offset), "{offset}");
        }
    }
}
