//! The few kernel facts the probes need that differ between kernels, read
//! from the running kernel's BTF (/sys/kernel/btf/vmlinux): struct member
//! offsets and enum values. Nothing of the kind is compiled in.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use btf_rs::{Btf, Type};

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Errors reading kernel BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be opened or parsed.
    #[error(
        "cannot read kernel BTF at {path}; tracer needs a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y (most distribution kernels since 5.4)"
    )]
    Open {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: btf_rs::Error,
    },
    /// A type is not in this kernel's BTF.
    #[error("kernel BTF has no {what}")]
    Missing {
        /// What was looked for.
        what: String,
    },
    /// A lookup failed inside the BTF data.
    #[error("kernel BTF lookup of {what}")]
    Lookup {
        /// What was looked for.
        what: String,
        /// The error.
        #[source]
        source: btf_rs::Error,
    },
}

/// The kernel's BTF, parsed.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    /// Parses the BTF at `path` (normally [`VMLINUX_BTF`]).
    pub fn open(path: &Path) -> Result<Self, BtfError> {
        let btf = Btf::from_file(path).map_err(|source| BtfError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self { btf })
    }

    /// Byte offset of `member` in `struct name` (looking into anonymous
    /// struct/union members, as `task_struct` has them).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        Ok(self.member(name, member)?.0 / 8)
    }

    /// Bit offset and type of `member` in `struct name`.
    fn member(&self, name: &str, member: &str) -> Result<(u32, Type), BtfError> {
        let what = format!("struct {name}.{member}");
        let lookup = |source| BtfError::Lookup {
            what: what.clone(),
            source,
        };
        for ty in self.btf.resolve_types_by_name(name).map_err(lookup)? {
            if let Type::Struct(s) = ty
                && let Some((bits, m)) = self.find_member(&s, member, 0)?
            {
                let ty = self.btf.resolve_chained_type(&m).map_err(lookup)?;
                return Ok((bits, ty));
            }
        }
        Err(BtfError::Missing { what })
    }

    fn find_member(
        &self,
        s: &btf_rs::Struct,
        member: &str,
        base_bits: u32,
    ) -> Result<Option<(u32, btf_rs::Member)>, BtfError> {
        let lookup = |source| BtfError::Lookup {
            what: member.to_string(),
            source,
        };
        for m in &s.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            let bits = base_bits + m.bit_offset();
            if name == member {
                return Ok(Some((bits, m.clone())));
            }
            if name.is_empty() {
                let inner = self.btf.resolve_chained_type(m).map_err(lookup)?;
                if let Type::Struct(inner) | Type::Union(inner) = inner
                    && let Some(found) = self.find_member(&inner, member, bits)?
                {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// `t` without typedefs and qualifiers.
    fn strip(&self, mut t: Type) -> Result<Type, BtfError> {
        let lookup = |source| BtfError::Lookup {
            what: "a typedef".into(),
            source,
        };
        loop {
            t = match &t {
                Type::Typedef(x) => self.btf.resolve_chained_type(x).map_err(lookup)?,
                Type::Const(x) | Type::Volatile(x) | Type::Restrict(x) => {
                    self.btf.resolve_chained_type(x).map_err(lookup)?
                }
                _ => return Ok(t),
            };
        }
    }

    /// The value of an enum member found in any enum, named or anonymous
    /// (the kernel's `MM_ANONPAGES` lives in an anonymous one).
    pub fn enum_member(&self, member: &str) -> Result<i64, BtfError> {
        use fallible_iterator::FallibleIterator as _;
        let what = format!("enum member {member}");
        let lookup = |source| BtfError::Lookup {
            what: what.clone(),
            source,
        };
        let mut types = self.btf.type_iter();
        while let Some(t) = types.next().map_err(lookup)? {
            if let Type::Enum(e) = t {
                for m in &e.members {
                    if self.btf.resolve_name(m).is_ok_and(|n| n == member) {
                        return Ok(i64::from(m.val() as i32));
                    }
                }
            }
        }
        Err(BtfError::Missing { what })
    }

    /// Offsets in `mm_struct` of the file, anon and shmem RSS counters.
    /// 6.2 and later: `struct percpu_counter rss_stat[NR_MM_COUNTERS]`
    /// (the `count` member of each); before: `struct mm_rss_stat rss_stat`
    /// holding `atomic_long_t count[NR_MM_COUNTERS]`.
    pub fn mm_rss_offsets(&self) -> Result<[u32; 3], BtfError> {
        let idx = |n: &str| -> Result<u32, BtfError> { Ok(self.enum_member(n)? as u32) };
        let which = [
            idx("MM_FILEPAGES")?,
            idx("MM_ANONPAGES")?,
            idx("MM_SHMEMPAGES")?,
        ];
        let (base_bits, ty) = self.member("mm_struct", "rss_stat")?;
        let base = base_bits / 8;
        let what = || BtfError::Missing {
            what: "a known layout of mm_struct.rss_stat".into(),
        };
        let lookup = |source| BtfError::Lookup {
            what: "mm_struct.rss_stat".into(),
            source,
        };
        let (stride, count_off) = match self.strip(ty)? {
            Type::Array(a) => {
                match self.strip(self.btf.resolve_chained_type(&a).map_err(lookup)?)? {
                    Type::Struct(pc) => {
                        let (bits, _) = self.find_member(&pc, "count", 0)?.ok_or_else(what)?;
                        (pc.size() as u32, bits / 8)
                    }
                    _ => return Err(what()),
                }
            }
            Type::Struct(rs) => {
                let (bits, _) = self.find_member(&rs, "count", 0)?.ok_or_else(what)?;
                (8, bits / 8)
            }
            _ => return Err(what()),
        };
        Ok(which.map(|i| base + i * stride + count_off))
    }

    /// Every value of `enum name`, by member name.
    pub fn enum_values(&self, name: &str) -> Result<HashMap<String, i64>, BtfError> {
        let what = format!("enum {name}");
        let lookup = |source| BtfError::Lookup {
            what: what.clone(),
            source,
        };
        for ty in self.btf.resolve_types_by_name(name).map_err(lookup)? {
            match ty {
                Type::Enum(e) => {
                    return e
                        .members
                        .iter()
                        .map(|m| {
                            let v = if e.is_signed() {
                                i64::from(m.val() as i32)
                            } else {
                                i64::from(m.val())
                            };
                            Ok((self.btf.resolve_name(m).map_err(lookup)?, v))
                        })
                        .collect();
                }
                Type::Enum64(e) => {
                    return e
                        .members
                        .iter()
                        .map(|m| Ok((self.btf.resolve_name(m).map_err(lookup)?, m.val() as i64)))
                        .collect();
                }
                _ => {}
            }
        }
        Err(BtfError::Missing { what })
    }

    /// Whether a type called `name` exists (a quick "is this BTF usable" probe).
    pub fn has_type(&self, name: &str) -> bool {
        self.btf
            .resolve_ids_by_name(name)
            .is_ok_and(|ids| !ids.is_empty())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn kernel_btf() -> Option<KernelBtf> {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI machines have {VMLINUX_BTF}"
            );
            eprintln!("skipped: {VMLINUX_BTF} missing on this machine");
            return None;
        }
        Some(KernelBtf::open(path).expect("parse vmlinux BTF"))
    }

    #[test]
    fn finds_task_struct_members_of_this_kernel() {
        let Some(btf) = kernel_btf() else { return };
        let pid = btf.member_offset("task_struct", "pid").unwrap();
        let tgid = btf.member_offset("task_struct", "tgid").unwrap();
        // pid_t pid; pid_t tgid; are adjacent in every kernel since 2.6.
        assert_eq!(tgid, pid + 4);
        assert!(matches!(
            btf.member_offset("task_struct", "no_such_member"),
            Err(BtfError::Missing { .. })
        ));
    }

    #[test]
    fn finds_the_rss_counters_of_mm_struct() {
        let Some(btf) = kernel_btf() else { return };
        assert_eq!(btf.enum_member("MM_FILEPAGES").unwrap(), 0);
        assert_eq!(btf.enum_member("MM_ANONPAGES").unwrap(), 1);
        let [file, anon, shmem] = btf.mm_rss_offsets().unwrap();
        let rss = btf.member_offset("mm_struct", "rss_stat").unwrap();
        assert!(
            file >= rss && anon > file && shmem > anon,
            "{file} {anon} {shmem}"
        );
        assert_eq!((anon - file) % 8, 0, "counters are 8-byte aligned");
        assert!(btf.enum_member("NO_SUCH_ENUM_MEMBER_ANYWHERE").is_err());
    }

    #[test]
    fn resolves_vm_event_items() {
        let Some(btf) = kernel_btf() else { return };
        let items = btf.enum_values("vm_event_item").unwrap();
        assert_eq!(items["PGPGIN"], 0);
        assert!(items["PGFAULT"] > items["PGPGOUT"]);
        assert!(items.contains_key("PGSCAN_DIRECT"));
        assert!(btf.enum_values("no_such_enum_anywhere").is_err());
    }
}
